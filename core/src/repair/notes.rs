//! Notes: the GNU build-id gets one flipped bit, so debuggers never pair the
//! rewritten file with debug info made for the original; SystemTap probe notes
//! (`.note.stapsdt`) hold the probe pc, the `.stapsdt.base` address and the
//! semaphore address, all three of which move.

use super::Ctx;
use crate::elf::consts::*;
use crate::elf::{align_up, read_u32};
use crate::error::{Error, Reason, Result};
use crate::patch::Patches;

/// The bit of the first build-id byte that is flipped.
pub const BUILD_ID_FLIP: u8 = 0x01;
const NT_STAPSDT: u32 = 3;

pub(super) fn repair(ctx: &Ctx, p: &mut Patches) -> Result<()> {
    let elf = ctx.elf;
    let map = &ctx.plan.map;
    let w = elf.class.word();
    for s in elf.shdrs.iter().filter(|s| s.sh_type == SHT_NOTE && s.has_file_data()) {
        let align = if s.sh_addralign == 8 { 8 } else { 4 };
        let data = elf.section_data(s);
        let len = data.len() as u64;
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
            let desc_at = align_up(name_at + namesz, align);
            let next = align_up(desc_at + descsz, align);
            if desc_at + descsz > len {
                return Err(bad());
            }
            let name = &data[name_at as usize..(name_at + namesz) as usize];
            let desc_file = s.sh_offset + desc_at;
            if name == b"GNU\0" && kind == NT_GNU_BUILD_ID && descsz > 0 {
                p.put(desc_file, &[data[desc_at as usize] ^ BUILD_ID_FLIP]);
            } else if name == b"stapsdt\0" && kind == NT_STAPSDT && map.dv != 0 {
                if descsz < 3 * w {
                    return Err(Error::new(
                        Reason::BadNotes,
                        format!("{}: probe note at {pos:#x} is too short", s.name),
                    ));
                }
                for field in 0..3 {
                    let at = desc_file + field * w;
                    let v = elf.class.read_word(elf.data, at)?;
                    if map.moves(v) {
                        p.put_word(elf.class, at, map.map(v));
                    }
                }
            }
            pos = next;
        }
    }
    Ok(())
}
