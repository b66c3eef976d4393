//! `.gnu.build.attributes`: the annobin ("Watermark" specification) build notes that
//! Fedora and RHEL builds carry. The section is SHT_NOTE and not loaded; every note is
//! `NT_GNU_BUILD_ATTRIBUTE_OPEN` (0x100, applies to a compilation unit) or `_FUNC`
//! (0x101, one function), and its owner name ("GA", an encoding character, the
//! attribute and its value) holds no address. The description holds the range the
//! attribute applies to:
//!
//! * empty: the range of the previous note of the same type (nothing to repair);
//! * one address-sized word: the start (version 2 notes; the end came from the
//!   symbol at the start), or 4 bytes in an ELF64 file, as binutils reads them too;
//! * two address-sized words: start and one-past-the-end (version 3).
//!
//! The notes are 4-byte aligned in both classes, so 8-byte words may be unaligned.
//! In linked files the addresses are final; the linker resolved the relocations of
//! the objects' notes (to 0 for a discarded section). The newer string format in
//! `.annobin.notes` (SHT_STRTAB, "AV:4p1 file.c func") names files and functions
//! but holds no address, so only this section needs a repair.

use super::Ctx;
use crate::addr_map::AddrMap;
use crate::elf::names::BUILD_ATTRIBUTES;
use crate::elf::notes::{Note, Walk};
use crate::elf::{consts::*, read_u32, read_u64, Class, Elf, Shdr};
use crate::error::{Error, Reason, Result};
use crate::patch::Patches;

const NT_GNU_BUILD_ATTRIBUTE_OPEN: u32 = 0x100;
const NT_GNU_BUILD_ATTRIBUTE_FUNC: u32 = 0x101;

/// One address in a note's description.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Field {
    /// File offset.
    off: u64,
    /// Width in bytes: 4 or 8.
    width: u8,
    value: u64,
    /// For the end of a range, where the range starts.
    start: Option<u64>,
}

impl Field {
    /// The field's new value. A start moves when it lies in the moved range. An
    /// end is one past the range's last byte, and moves exactly when that byte
    /// does: a range ending at the split point (last byte below it) stays, while
    /// one ending at the end of the image (last byte inside it) moves. An empty or
    /// inverted range maps its end like its start.
    fn moved(self, map: &AddrMap) -> u64 {
        match self.start {
            Some(start) if self.value > start => map.map(self.value - 1) + 1,
            _ => map.map(self.value),
        }
    }
}

/// Whether a section holds build attribute notes (the linker's output section, or
/// one of the per-section inputs that a custom linker script kept apart).
fn is_build_attributes(s: &Shdr) -> bool {
    s.name.strip_prefix(BUILD_ATTRIBUTES).is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// Checks every build attribute note. Run before anything else walks the note
/// sections, so that a malformed note is reported at its own offset rather than at
/// the misparse it causes further on.
pub(crate) fn check(elf: &Elf) -> Result<()> {
    addresses(elf).map(drop)
}

pub(super) fn repair(ctx: &Ctx, p: &mut Patches) -> Result<()> {
    for f in addresses(ctx.elf)? {
        let new = f.moved(&ctx.plan.map);
        if f.width == 4 && u32::try_from(new).is_err() {
            return Err(Error::new(
                Reason::UnsupportedSection,
                format!("{BUILD_ATTRIBUTES}: the 4-byte address at file offset {:#x} cannot hold {new:#x}", f.off),
            ));
        }
        if new != f.value {
            p.put(f.off, &new.to_le_bytes()[..usize::from(f.width)]);
        }
    }
    Ok(())
}

/// The address fields of every build attribute note in the file.
fn addresses(elf: &Elf) -> Result<Vec<Field>> {
    let lo = elf.loads().map(|l| l.p_vaddr).min().unwrap_or(0);
    let hi = elf.loads().map(|l| l.vend()).max().unwrap_or(0);
    let mut out = Vec::new();
    for s in elf.shdrs.iter().filter(|s| is_build_attributes(s)) {
        if s.sh_type != SHT_NOTE {
            return Err(Error::new(Reason::BadNotes, format!("{} is not a note section", s.name)));
        }
        let notes = Walk::new(elf.section_data(s), s.sh_offset, 4, &s.name);
        out.extend(fields(notes, elf.class, &s.name, (lo, hi))?);
    }
    Ok(out)
}

/// The address fields of the notes of one section, each checked to lie in `image`:
/// the inclusive span of the loaded segments (an end may equal the span's end). 0 is
/// also accepted: it is what the linker writes for a discarded section.
fn fields<'a>(
    notes: impl Iterator<Item = Result<Note<'a>>>,
    class: Class,
    section: &str,
    image: (u64, u64),
) -> Result<Vec<Field>> {
    let mut out = Vec::new();
    for n in notes {
        let n = n?;
        let bad = |what: String| Error::new(Reason::BadNotes, format!("{section}: note at offset {:#x} {what}", n.off));
        if !matches!(n.kind, NT_GNU_BUILD_ATTRIBUTE_OPEN | NT_GNU_BUILD_ATTRIBUTE_FUNC) {
            return Err(bad(format!("has type {:#x}, not a build attribute", n.kind)));
        }
        let w = class.word();
        let (width, count) = match n.desc.len() as u64 {
            0 => continue,
            4 if class.is64 => (4, 1),
            len if len == w || len == 2 * w => (w, len / w),
            len => return Err(bad(format!("has a description of {len} bytes, which holds no address range"))),
        };
        let mut start = None;
        for i in 0..count {
            let rel = i * width;
            let value = if width == 8 { read_u64(n.desc, rel)? } else { u64::from(read_u32(n.desc, rel)?) };
            if value != 0 && (value < image.0 || value > image.1) {
                return Err(bad(format!("applies to address {value:#x}, outside the file's segments")));
            }
            out.push(Field { off: n.desc_off + rel, width: width as u8, value, start });
            start = Some(value);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testelf::{note, words};

    const C64: Class = Class { is64: true };
    const C32: Class = Class { is64: false };

    fn walk(data: &[u8], class: Class) -> Result<Vec<Field>> {
        fields(Walk::new(data, 0x1000, 4, BUILD_ATTRIBUTES), class, BUILD_ATTRIBUTES, (0, 0x50_0000))
    }

    #[test]
    fn walks_open_and_func_notes_of_both_classes() {
        let mut data = note(b"GA$\x013p3\0", 0x100, &words(&[0x2000, 0x2100]));
        data.extend(note(b"GA*\x07\x02\0", 0x100, &[]));
        data.extend(note(b"GA*GOW:0x452b\0", 0x101, &words(&[0x2040, 0x2080])));
        let f = walk(&data, C64).unwrap();
        let vals: Vec<_> = f.iter().map(|f| (f.off - 0x1000, f.width, f.value, f.start)).collect();
        // 12-byte header + 8-byte name ("GA$\x013p3\0") puts the first description at 20.
        assert_eq!(vals[0], (20, 8, 0x2000, None));
        assert_eq!(vals[1], (28, 8, 0x2100, Some(0x2000)));
        assert_eq!(vals.len(), 4);
        assert_eq!(vals[3].2, 0x2080);

        let mut d32 = note(b"GA$\x013p3\0", 0x100, &[0x00, 0x20, 0, 0, 0x00, 0x21, 0, 0]);
        d32.extend(note(b"GA$\x012p1\0", 0x101, &[0x40, 0x20, 0, 0]));
        let f = walk(&d32, C32).unwrap();
        assert_eq!(f.iter().map(|f| (f.width, f.value)).collect::<Vec<_>>(), [(4, 0x2000), (4, 0x2100), (4, 0x2040)]);
        // A single 8-byte start in ELF64, and the 4-byte form binutils also reads there.
        let mut single = note(b"GA$\x012p1\0", 0x100, &0x2000u64.to_le_bytes());
        single.extend(note(b"GA$\x012p1\0", 0x100, &0x2000u32.to_le_bytes()));
        let f = walk(&single, C64).unwrap();
        assert_eq!(
            f.iter().map(|f| (f.width, f.value, f.start)).collect::<Vec<_>>(),
            [(8, 0x2000, None), (4, 0x2000, None)]
        );
    }

    #[test]
    fn range_ends_move_with_their_last_byte() {
        let map = AddrMap::shift(0x2000, 0x40_0000, 0x1f_e000);
        let end = |value, start| Field { off: 0, width: 8, value, start: Some(start) }.moved(&map);
        let start = |value| Field { off: 0, width: 8, value, start: None }.moved(&map);
        assert_eq!(start(0x2000), 0x2000 + map.dv);
        assert_eq!(start(0x1fff), 0x1fff);
        // Ends at the split point: the range lies before it and stays.
        assert_eq!(end(0x2000, 0x1000), 0x2000);
        // Ends at the end of the image: one past the last moved byte, moves.
        assert_eq!(end(0x40_0000, 0x3000), 0x40_0000 + map.dv);
        // Empty at the split point: moves with its start.
        assert_eq!(end(0x2000, 0x2000), 0x2000 + map.dv);
        assert_eq!(end(0, 0), 0);
        let align = AddrMap { dv: 0, ..map };
        assert_eq!(Field { off: 0, width: 8, value: 0x3000, start: Some(0x2000) }.moved(&align), 0x3000);
    }

    #[test]
    fn malformed_notes_name_their_offset() {
        let good = note(b"GA$\x013p3\0", 0x100, &words(&[0x2000, 0x2100]));
        let err = |data: &[u8], class| walk(data, class).unwrap_err();

        let mut truncated = good.clone();
        truncated.truncate(good.len() - 4);
        let e = err(&[good.clone(), truncated].concat(), C64);
        assert_eq!((e.reason, e.detail.contains("offset 0x24")), (Reason::BadNotes, true), "{e}");

        let odd = [good.clone(), note(b"GA$\x013p3\0", 0x101, &[0; 12])].concat();
        let e = err(&odd, C64);
        assert!(e.detail.contains("offset 0x24 has a description of 12 bytes"), "{e}");
        assert_eq!(err(&good, C32).reason, Reason::BadNotes, "16 bytes are two ELF64 words");
        // A wrong size is reported at its own note, before the misparse it causes.
        let mut shrunk = [good.clone(), good.clone()].concat();
        shrunk[4..8].copy_from_slice(&12u32.to_le_bytes());
        assert!(err(&shrunk, C64).detail.contains("offset 0x0 has a description of 12 bytes"));

        let mut long_name = note(b"GA$\x013p3\0", 0x100, &[]);
        long_name[..4].copy_from_slice(&64u32.to_le_bytes());
        assert!(err(&long_name, C64).detail.contains("offset 0x0 is truncated"));

        let e = err(&note(b"GA*\x07\x02\0", 0x100, &words(&[0x2000, 0x9000_0000])), C64);
        assert!(e.detail.contains("offset 0x0 applies to address 0x90000000"), "{e}");
        let e = err(&note(b"GNU\0", 3, &[1; 20]), C64);
        assert!(e.detail.contains("type 0x3"), "{e}");
        // 0 is a discarded section's address; the end of the image is a valid end.
        assert_eq!(walk(&note(b"GA*\x07\x02\0", 0x101, &words(&[0, 0x50_0000])), C64).unwrap().len(), 2);
    }

    #[test]
    fn ranges_from_the_split_point_on_move() {
        use crate::testelf::{contents, shifted, word, Arrangement};
        let (built, dv, out) = shifted(Arrangement::SeparateCode);
        let notes = contents(&crate::elf::Elf::parse(&out).unwrap(), BUILD_ATTRIBUTES);
        // Two notes of a 12-byte header, an 8-byte name and two words.
        let ranges: Vec<u64> = [20, 28, 56, 64].iter().map(|&at| word(notes, at)).collect();
        let text = built.addr(".text");
        assert_eq!(ranges, [text + dv, text + 0x3000 + dv, built.addr(".dynsym"), text]);
    }
}
