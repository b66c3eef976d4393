//! Note records (`Elf_Nhdr` + name + descriptor), as found in SHT_NOTE sections.

use super::{align_up, read_u32, Elf, Shdr};
use crate::error::{Error, Reason, Result};

/// One note.
pub struct Note<'a> {
    /// Offset of the note header within its section.
    pub off: u64,
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
    Walk::new(elf.section_data(s), s.sh_offset, align, &s.name).collect()
}

/// The notes of a section one by one, so that a reader checking each note reports
/// the first bad one rather than the misparse it causes further on. Stops after an
/// error.
pub struct Walk<'a, 's> {
    data: &'a [u8],
    base: u64,
    align: u64,
    section: &'s str,
    pos: u64,
}

impl<'a, 's> Walk<'a, 's> {
    /// The notes in `data`, the bytes of the note section `section` that starts at
    /// file offset `base`, with entries padded to `align`.
    pub fn new(data: &'a [u8], base: u64, align: u64, section: &'s str) -> Self {
        Walk { data, base, align, section, pos: 0 }
    }

    fn note(&self) -> Result<Note<'a>> {
        let (data, pos) = (self.data, self.pos);
        let len = data.len() as u64;
        let bad = || Error::new(Reason::BadNotes, format!("{}: note at offset {pos:#x} is truncated", self.section));
        if pos + 12 > len {
            return Err(bad());
        }
        let namesz = u64::from(read_u32(data, pos)?);
        let descsz = u64::from(read_u32(data, pos + 4)?);
        let kind = read_u32(data, pos + 8)?;
        let name_at = pos + 12;
        let desc_at = align_up(name_at.checked_add(namesz).ok_or_else(bad)?, self.align);
        let end = desc_at.checked_add(descsz).filter(|&e| e <= len).ok_or_else(bad)?;
        Ok(Note {
            off: pos,
            name: &data[name_at as usize..(name_at + namesz) as usize],
            kind,
            desc_off: self.base + desc_at,
            desc: &data[desc_at as usize..end as usize],
        })
    }
}

impl<'a> Iterator for Walk<'a, '_> {
    type Item = Result<Note<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        let len = self.data.len() as u64;
        if self.pos >= len {
            return None;
        }
        let note = self.note();
        self.pos = match &note {
            Ok(n) => align_up(n.desc_off - self.base + n.desc.len() as u64, self.align),
            Err(_) => len,
        };
        Some(note)
    }
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
