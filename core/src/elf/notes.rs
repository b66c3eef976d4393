//! Note records (`Elf_Nhdr` + name + descriptor), as found in SHT_NOTE sections.

use super::{align_up, read_u32, Elf, Shdr};
use crate::error::{Error, Reason, Result};

/// One note.
pub struct Note<'a> {
    /// Owner name, including its NUL terminator.
    pub name: &'a [u8],
    /// n_type.
    pub kind: u32,
    /// File offset of the descriptor.
    pub desc_off: u64,
    /// The descriptor.
    pub desc: &'a [u8],
}

/// The notes of a note section. Entries are padded to the section's alignment:
/// 8 for ELF64 `.note.gnu.property`, 4 otherwise.
pub fn notes<'a>(elf: &Elf<'a>, s: &Shdr) -> Result<Vec<Note<'a>>> {
    let align = if s.sh_addralign == 8 { 8 } else { 4 };
    let data = elf.section_data(s);
    let len = data.len() as u64;
    let mut out = Vec::new();
    let mut pos = 0u64;
    while pos < len {
        let bad = || Error::new(Reason::BadNotes, format!("{}: note at offset {pos:#x} is truncated", s.name));
        if pos + 12 > len {
            return Err(bad());
        }
        let namesz = u64::from(read_u32(data, pos)?);
        let descsz = u64::from(read_u32(data, pos + 4)?);
        let kind = read_u32(data, pos + 8)?;
        let name_at = pos + 12;
        let desc_at = align_up(name_at.checked_add(namesz).ok_or_else(bad)?, align);
        let end = desc_at.checked_add(descsz).filter(|&e| e <= len).ok_or_else(bad)?;
        out.push(Note {
            name: &data[name_at as usize..(name_at + namesz) as usize],
            kind,
            desc_off: s.sh_offset + desc_at,
            desc: &data[desc_at as usize..end as usize],
        });
        pos = align_up(end, align);
    }
    Ok(out)
}

/// The GNU build-id note's descriptor, with its file offset.
pub fn build_id<'a>(elf: &Elf<'a>) -> Result<Option<(u64, &'a [u8])>> {
    for s in elf.shdrs.iter().filter(|s| s.sh_type == super::consts::SHT_NOTE && s.has_file_data()) {
        for n in notes(elf, s)? {
            if n.name == b"GNU\0" && n.kind == super::consts::NT_GNU_BUILD_ID && !n.desc.is_empty() {
                return Ok(Some((n.desc_off, n.desc)));
            }
        }
    }
    Ok(None)
}
