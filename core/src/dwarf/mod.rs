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
#[cfg(test)]
pub(crate) mod testbytes;
mod unit;

use crate::addr_map::AddrMap;
use crate::elf::consts::PT_TLS;
use crate::elf::Elf;
use crate::error::{Error, Reason, Result};
use crate::patch::{Move, Patch, Patches};
use sections::{SecId, Sections};

type Slice<'a> = gimli::EndianSlice<'a, gimli::LittleEndian>;

/// New contents for a section the repair changed.
pub struct Replacement {
    /// Section header index.
    pub index: usize,
    /// The complete new section contents (recompressed if the input was compressed).
    pub data: Vec<u8>,
}

/// What the DWARF repair changes: in-place edits of uncompressed sections (input file
/// offsets), and new contents for compressed sections.
#[derive(Default)]
pub struct Changes {
    /// Edits keyed by input file offset.
    pub patches: Patches,
    /// Recompressed sections.
    pub replacements: Vec<Replacement>,
}

/// Edits of the debug sections, by section and section offset: mostly address
/// moves, a few literal writes. Reads always see the input bytes.
pub(crate) struct Edits {
    lens: Vec<u64>,
    puts: Vec<Vec<Patch>>,
    moves: Vec<Vec<Move>>,
}

impl Edits {
    fn with_lens(lens: Vec<u64>) -> Self {
        let n = lens.len();
        Edits { lens, puts: vec![Vec::new(); n], moves: vec![Vec::new(); n] }
    }

    fn new(secs: &Sections) -> Self {
        Edits::with_lens((0..secs.len()).map(|i| secs.data(SecId(i)).len() as u64).collect())
    }

    fn check(&self, sec: SecId, off: u64, size: u8) -> Result<()> {
        if off + u64::from(size) > self.lens[sec.0] || size > 8 || size == 0 {
            return Err(Error::new(Reason::BadDwarf, format!("debug section field at {off:#x} lies beyond its end")));
        }
        Ok(())
    }

    /// Writes `value` as a little-endian field of `size` bytes at `off` of `sec`.
    fn put(&mut self, sec: SecId, off: u64, value: u64, size: u8) -> Result<()> {
        self.check(sec, off, size)?;
        self.puts[sec.0].push(Patch::new(off, &value.to_le_bytes()[..size as usize]));
        Ok(())
    }

    /// Moves the address `value`, read from the `size` bytes at `off`, if it lies in
    /// the moved range.
    fn address(&mut self, map: &AddrMap, sec: SecId, off: u64, value: u64, size: u8) -> Result<()> {
        if map.moves(value) {
            self.check(sec, off, size)?;
            if !matches!(size, 4 | 8) {
                return Err(Error::new(Reason::UnsupportedDwarf, format!("an address of {size} bytes at {off:#x}")));
            }
            self.moves[sec.0].push(Move::new(off, size));
        }
        Ok(())
    }

    /// Takes over the edits another walker made.
    fn merge(&mut self, other: Edits) {
        fn take<T>(mine: &mut Vec<T>, theirs: Vec<T>) {
            if mine.is_empty() {
                *mine = theirs;
            } else {
                mine.extend(theirs);
            }
        }
        for (mine, theirs) in self.puts.iter_mut().zip(other.puts) {
            take(mine, theirs);
        }
        for (mine, theirs) in self.moves.iter_mut().zip(other.moves) {
            take(mine, theirs);
        }
    }

    /// An empty edit set for one section of `len` bytes.
    #[cfg(test)]
    fn for_tests(len: u64) -> Self {
        Edits::with_lens(vec![len])
    }

    /// The address moves of one section so far.
    #[cfg(test)]
    fn moves_of(&self, sec: SecId) -> &[Move] {
        &self.moves[sec.0]
    }

    /// The literal writes of one section so far, as (offset, bytes).
    #[cfg(test)]
    fn puts_of(&self, sec: SecId) -> Vec<(u64, Vec<u8>)> {
        self.puts[sec.0].iter().map(|p| (p.off(), p.data().to_vec())).collect()
    }

    /// The contents of section `sec` of `secs` with these edits applied.
    #[cfg(test)]
    fn applied(&self, secs: &Sections, sec: SecId, map: &AddrMap) -> Vec<u8> {
        let mut data = secs.data(sec).to_vec();
        for p in &self.puts[sec.0] {
            data[p.off() as usize..p.end() as usize].copy_from_slice(p.data());
        }
        for m in &self.moves[sec.0] {
            m.apply(&mut data, 0, map);
        }
        data
    }
}

/// What the debug-info walk learns for the other sections.
#[derive(Default)]
pub(crate) struct Refs {
    /// Location lists to walk: (section offset, unit index).
    pub loclists: Vec<(u64, u32)>,
    /// Range lists to walk: (section offset, unit index).
    pub rnglists: Vec<(u64, u32)>,
    /// `.debug_addr` offsets that hold constants (DW_OP_constx), not addresses.
    pub addr_constants: Vec<u64>,
    /// Whether any unit is a split-DWARF skeleton.
    pub split_units: bool,
}

/// Rewrites the debug sections of `elf` for the address map.
pub fn repair(elf: &Elf, map: &AddrMap) -> Result<Changes> {
    if map.dv == 0 {
        return Ok(Changes::default());
    }
    let secs = Sections::load(elf)?;
    if secs.len() == 0 {
        return Ok(Changes::default());
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
    secs.finish(ed, map)
}

/// Runs `work` over `items` split into one contiguous share per core, each with its
/// own edits; merges the edits and returns the per-share results in order.
fn in_parallel<T: Sync, R: Send>(
    items: &[T],
    weight: impl Fn(&T) -> usize + Sync,
    work: impl Fn(&[T], &mut Edits) -> Result<R> + Sync,
    ed: &mut Edits,
) -> Result<Vec<R>> {
    let lens = &ed.lens.clone();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    let total: usize = items.iter().map(&weight).sum();
    let mut shares: Vec<&[T]> = Vec::new();
    let (mut start, mut acc) = (0, 0);
    for (i, item) in items.iter().enumerate() {
        acc += weight(item);
        if acc * threads >= total * (shares.len() + 1) || i + 1 == items.len() {
            shares.push(&items[start..=i]);
            start = i + 1;
        }
    }
    let results: Vec<Result<(R, Edits)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = shares
            .iter()
            .map(|share| {
                let work = &work;
                scope.spawn(move || {
                    let mut mine = Edits::with_lens(lens.clone());
                    work(share, &mut mine).map(|r| (r, mine))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a DWARF walker thread panicked")).collect()
    });
    let mut out = Vec::with_capacity(results.len());
    for r in results {
        let (r, e) = r?;
        ed.merge(e);
        out.push(r);
    }
    Ok(out)
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

#[cfg(test)]
mod tests {
    use crate::elf::Elf;
    use crate::testelf::{contents, run, word, Arrangement, Debug, Dso};
    use crate::ModeChoice;
    use std::io::Read;

    /// A debug section's contents, inflated if compressed.
    fn debug(e: &Elf, name: &str) -> Vec<u8> {
        let raw = contents(e, name);
        if e.section(name).unwrap().sh_flags & crate::elf::consts::SHF_COMPRESSED == 0 {
            return raw.to_vec();
        }
        let mut out = Vec::new();
        flate2::read::ZlibDecoder::new(&raw[24..]).read_to_end(&mut out).unwrap();
        assert_eq!(out.len() as u64, word(raw, 8), "ch_size");
        out
    }

    #[test]
    fn unit_and_range_addresses_move_compressed_or_not() {
        for kind in [Debug::Plain, Debug::Zlib] {
            let mut dso = Dso::new(Arrangement::SeparateCode, 0x3000);
            dso.debug = kind;
            let (built, t, out) = run(&dso, ModeChoice::Shift, 2 << 20);
            let (old, new) = (Elf::parse(&built.data).unwrap(), Elf::parse(&out).unwrap());
            let (text, dv) = (built.addr(".text"), t.summary().dv);
            // DW_AT_low_pc moves; DW_AT_high_pc as data8 is a length and stays.
            let info = debug(&new, ".debug_info");
            assert_eq!((word(&info, 12), word(&info, 20)), (text + dv, 0x3000), "{kind:?}");
            let aranges = debug(&new, ".debug_aranges");
            let tuples: Vec<u64> = (0..4).map(|i| word(&aranges, 16 + 8 * i)).collect();
            assert_eq!(tuples, [text + dv, 0x3000, built.addr(".dynstr"), 8], "{kind:?}");
            assert_eq!(debug(&new, ".debug_abbrev"), debug(&old, ".debug_abbrev"));
            // Growth is that of the file written, recompressed sections included.
            assert_eq!(t.summary().growth, out.len() as i64 - built.data.len() as i64, "{kind:?}");
        }
    }
}

/// The walkers together on a DWARF 5 unit: what `.debug_info` names, `.debug_addr`
/// and the range lists hold.
#[cfg(test)]
mod v5_tests {
    use super::testbytes::{abbrev, patched, Bytes, DV, MAP};
    use super::{addr, info, lists, Edits, Refs, Sections};
    use crate::dwarf::sections::SecId;
    use gimli::constants::*;

    #[test]
    fn indexed_addresses_move_in_debug_addr_constants_stay() {
        let mut a = Bytes::new();
        let cu = [(DW_AT_low_pc, DW_FORM_addrx), (DW_AT_addr_base, DW_FORM_sec_offset)];
        abbrev(&mut a, 1, DW_TAG_compile_unit, true, &[&cu[..], &[(DW_AT_ranges, DW_FORM_sec_offset)]].concat());
        abbrev(&mut a, 2, DW_TAG_variable, false, &[(DW_AT_location, DW_FORM_exprloc)]);
        a.uleb(0);
        // .debug_addr: a DWARF 5 header, then entries 0 (low_pc), 1 (outside), 2 (a constant).
        let mut addrs = Bytes::new();
        let len = addrs.length();
        addrs.u16(5);
        addrs.u8(8);
        addrs.u8(0);
        let base = addrs.u64(0x1000);
        addrs.u64(0x800);
        addrs.u64(0x1500);
        addrs.end_length(len);
        let mut rng = Bytes::new();
        let len = rng.length();
        rng.u16(5);
        rng.u8(8);
        rng.u8(0);
        rng.u32(0);
        let list = rng.at();
        rng.u8(DW_RLE_base_addressx.0);
        rng.uleb(0);
        rng.u8(DW_RLE_offset_pair.0);
        rng.uleb(0);
        rng.uleb(0x10);
        rng.u8(DW_RLE_startx_length.0);
        rng.uleb(1);
        rng.uleb(8);
        rng.u8(DW_RLE_end_of_list.0);
        rng.end_length(len);
        let mut b = Bytes::new();
        let len = b.length();
        b.u16(5);
        b.u8(DW_UT_compile.0);
        b.u8(8);
        b.u32(0);
        b.uleb(1);
        b.uleb(0);
        b.u32(base as u32);
        b.u32(list as u32);
        b.uleb(2);
        b.uleb(9);
        b.u8(DW_OP_addr.0);
        let var = b.u64(0x1500);
        b.uleb(2);
        b.uleb(3);
        b.u8(DW_OP_constx.0);
        b.uleb(2);
        b.u8(DW_OP_stack_value.0);
        b.uleb(0);
        b.end_length(len);
        let named = [
            (".debug_abbrev", &a.0[..]),
            (".debug_info", &b.0),
            (".debug_addr", &addrs.0),
            (".debug_rnglists", &rng.0),
        ];
        let secs = Sections::for_tests(&named);
        let (mut ed, mut refs) = (Edits::new(&secs), Refs::default());
        let units = info::repair(&secs.gimli(), &secs, &MAP, &mut ed, &mut refs).unwrap();
        assert_eq!((units[0].low_pc, units[0].addr_base), (0x1000, base));
        assert_eq!(refs.rnglists, [(list, 0)]);
        lists::repair(&units, &secs, &MAP, &mut refs, &mut ed).unwrap();
        addr::repair(&units, &secs, &MAP, &refs, 0, &mut ed).unwrap();
        assert_eq!(ed.applied(&secs, SecId(1), &MAP), patched(&b.0, &[(var, 0x1500 + DV, 8)]));
        assert_eq!(ed.applied(&secs, SecId(2), &MAP), patched(&addrs.0, &[(base, 0x1000 + DV, 8)]));
        assert_eq!(ed.applied(&secs, SecId(3), &MAP), rng.0);
    }
}
