//! DWARF: every address in the debug sections moves with the code, patched in place.
//!
//! gimli reads the structure (unit headers, abbreviations, attribute forms, line
//! program headers, expressions); the byte offset of every address-bearing field is
//! derived from gimli's slices, and the new value is written at that offset in a copy
//! of the section. Nothing is re-encoded, so sizes and every offset between sections
//! stay valid (GNU location views, `.debug_names`, dwz references).
//!
//! One module per section family. An address the walker cannot classify (an unknown
//! form, opcode, list kind or section) is an error naming the section, the offset and
//! the construct; nothing passes through unexamined.

mod addr;
mod aranges;
mod expr;
mod frame;
mod gdb_index;
mod info;
mod line;
mod lists;
mod sections;

use crate::elf::consts::PT_TLS;
use crate::elf::Elf;
use crate::error::{Error, Reason, Result};
use crate::plan::AddrMap;
use sections::{SecId, Sections};

type Slice<'a> = gimli::EndianSlice<'a, gimli::LittleEndian>;

/// New contents for a section the repair changed.
pub struct Replacement {
    /// Section header index.
    pub index: usize,
    /// The complete new section contents (recompressed if the input was compressed).
    pub data: Vec<u8>,
}

/// Copy-on-write edits of the debug sections: reads always see the input bytes.
pub(crate) struct Edits<'s, 'a> {
    secs: &'s Sections<'a>,
    copies: Vec<Option<Vec<u8>>>,
}

impl<'s, 'a> Edits<'s, 'a> {
    fn new(secs: &'s Sections<'a>) -> Self {
        Edits { secs, copies: vec![None; secs.len()] }
    }

    /// Writes `value` as a little-endian field of `size` bytes at `off` of `sec`.
    fn put(&mut self, sec: SecId, off: u64, value: u64, size: u8) -> Result<()> {
        let data = self.secs.data(sec);
        let end = off as usize + size as usize;
        if end > data.len() || size > 8 {
            return Err(Error::new(
                Reason::BadDwarf,
                format!("{}: field at {off:#x} lies beyond the section end", self.secs.name(sec)),
            ));
        }
        let copy = self.copies[sec.0].get_or_insert_with(|| data.to_vec());
        copy[off as usize..end].copy_from_slice(&value.to_le_bytes()[..size as usize]);
        Ok(())
    }

    /// Moves the address of `size` bytes at `off` if it lies in the moved range.
    fn address(&mut self, map: &AddrMap, sec: SecId, off: u64, value: u64, size: u8) -> Result<()> {
        if map.moves(value) {
            self.put(sec, off, map.map(value), size)?;
        }
        Ok(())
    }
}

/// What the debug-info walk learns for the other sections.
#[derive(Default)]
pub(crate) struct Refs {
    /// Location lists to walk: (section offset, unit index).
    pub loclists: Vec<(u64, usize)>,
    /// Range lists to walk: (section offset, unit index).
    pub rnglists: Vec<(u64, usize)>,
    /// `.debug_addr` offsets that hold constants (DW_OP_constx), not addresses.
    pub addr_constants: Vec<u64>,
    /// Whether any unit is a split-DWARF skeleton.
    pub split_units: bool,
}

/// Rewrites the debug sections of `elf` for the address map; returns the sections
/// that changed.
pub fn repair(elf: &Elf, map: &AddrMap) -> Result<Vec<Replacement>> {
    if map.dv == 0 {
        return Ok(Vec::new());
    }
    let secs = Sections::load(elf)?;
    if secs.len() == 0 {
        return Ok(Vec::new());
    }
    let mut ed = Edits::new(&secs);
    let asz = elf.class.word() as u8;
    let dwarf = secs.gimli();
    let mut refs = Refs::default();
    let units = info::repair(&dwarf, &secs, map, &mut ed, &mut refs)?;
    lists::repair(&units, &secs, map, &mut refs, &mut ed)?;
    let tls_size = elf.phdrs.iter().filter(|p| p.p_type == PT_TLS).map(|p| p.p_memsz).max().unwrap_or(0);
    addr::repair(&units, &secs, map, &refs, tls_size, &mut ed)?;
    line::repair(&dwarf, &secs, map, asz, &mut ed)?;
    aranges::repair(&secs, map, &mut ed)?;
    frame::repair(&secs, map, asz, &mut ed)?;
    gdb_index::repair(&secs, map, &mut ed)?;
    secs.finish(ed.copies)
}

/// Converts a gimli error into a located DWARF error.
fn gimli_err(section: &str, at: u64, e: gimli::Error) -> Error {
    let reason = match e {
        gimli::Error::UnknownForm(_)
        | gimli::Error::InvalidExpression(_)
        | gimli::Error::UnknownVersion(_)
        | gimli::Error::UnsupportedAddressSize(_)
        | gimli::Error::UnsupportedOffsetSize(_)
        | gimli::Error::UnsupportedSegmentSize(_) => Reason::UnsupportedDwarf,
        _ => Reason::BadDwarf,
    };
    Error::new(reason, format!("{section} at {at:#x}: {e}"))
}
