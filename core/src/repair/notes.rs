//! Notes: the GNU build-id gets one flipped bit, so debuggers never pair the
//! rewritten file with debug info made for the original; SystemTap probe notes
//! (`.note.stapsdt`) hold the probe pc, the `.stapsdt.base` address and the
//! semaphore address, all three of which move.

use super::Ctx;
use crate::elf::consts::*;
use crate::elf::notes;
use crate::error::{Error, Reason, Result};
use crate::patch::Patches;

/// The bit of the first build-id byte that is flipped.
pub const BUILD_ID_FLIP: u8 = 0x01;
const NT_STAPSDT: u32 = 3;

pub(super) fn repair(ctx: &Ctx, p: &mut Patches) -> Result<()> {
    let elf = ctx.elf;
    let map = &ctx.plan.map;
    let w = elf.class.word();
    if let Some((off, id)) = notes::build_id(elf)? {
        p.put(off, &[id[0] ^ BUILD_ID_FLIP]);
    }
    if map.dv == 0 {
        return Ok(());
    }
    for s in elf.shdrs.iter().filter(|s| s.sh_type == SHT_NOTE && s.has_file_data()) {
        for n in notes::notes(elf, s)? {
            if n.name != b"stapsdt\0" || n.kind != NT_STAPSDT {
                continue;
            }
            if (n.desc.len() as u64) < 3 * w {
                return Err(Error::new(Reason::BadNotes, format!("{}: a probe note is too short", s.name)));
            }
            for field in 0..3 {
                let at = n.desc_off + field * w;
                let v = elf.class.read_word(elf.data, at)?;
                if map.moves(v) {
                    p.put_word(elf.class, at, map.map(v));
                }
            }
        }
    }
    Ok(())
}
