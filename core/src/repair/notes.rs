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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::Elf;
    use crate::testelf::{at, contents, run, shifted, word, Arrangement, Dso, BUILD_ID};
    use crate::ModeChoice;

    #[test]
    fn the_build_id_loses_one_bit_in_either_mode() {
        let mut want = BUILD_ID;
        want[0] ^= BUILD_ID_FLIP;
        let (_, _, shifted) = run(&Dso::new(Arrangement::SeparateCode, 0x3000), ModeChoice::Shift, 2 << 20);
        let (_, t, aligned) = run(&Dso::new(Arrangement::RodataFirst, 0x30000), ModeChoice::Align, 0x10000);
        for out in [shifted, aligned] {
            assert_eq!(notes::build_id(&Elf::parse(&out).unwrap()).unwrap().unwrap().1, want);
        }
        assert_eq!(t.summary().build_id.as_deref(), Some(&want[..]));
    }

    #[test]
    fn probe_addresses_move_and_an_absent_semaphore_stays() {
        let (built, dv, out) = shifted(Arrangement::SeparateCode);
        let new = Elf::parse(&out).unwrap();
        let note = &contents(&new, ".note.stapsdt")[20..];
        let fields = [word(note, 0), word(note, 8), word(note, 16)];
        assert_eq!(fields, [built.addr(".text") + at::PROBE + dv, built.addr(".rodata") + dv, 0]);
    }
}
