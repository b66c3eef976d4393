//! `.dynamic`: entries whose value is an address (d_ptr) move with what they point at.
//! String-table offsets that happen to live in the address-tag range (DT_CONFIG,
//! DT_DEPAUDIT, DT_AUDIT) are not addresses and stay.

use super::Ctx;
use crate::elf::consts::*;
use crate::error::Result;
use crate::patch::Patches;

const POINTER_TAGS: &[i64] = &[
    DT_PLTGOT,
    DT_HASH,
    DT_STRTAB,
    DT_SYMTAB,
    DT_RELA,
    DT_INIT,
    DT_FINI,
    DT_REL,
    DT_JMPREL,
    DT_INIT_ARRAY,
    DT_FINI_ARRAY,
    DT_PREINIT_ARRAY,
    DT_SYMTAB_SHNDX,
    DT_RELR,
    DT_GNU_HASH,
    DT_TLSDESC_PLT,
    DT_TLSDESC_GOT,
    DT_GNU_CONFLICT,
    DT_GNU_LIBLIST,
    DT_PLTPAD,
    DT_MOVETAB,
    DT_SYMINFO,
    DT_VERSYM,
    DT_VERDEF,
    DT_VERNEED,
];

pub(super) fn repair(ctx: &Ctx, p: &mut Patches) -> Result<()> {
    let (elf, map) = (ctx.elf, &ctx.plan.map);
    for (off, d) in elf.dynamic()? {
        let is_ptr = POINTER_TAGS.contains(&d.tag) || ctx.an.arch.is_machine_dt_ptr(d.tag);
        if is_ptr && map.moves(d.val) {
            p.put_word(elf.class, off + elf.class.word(), map.map(d.val));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::Elf;
    use crate::testelf::{shifted, Arrangement};

    #[test]
    fn pointers_into_what_moves_move_and_the_rest_stays() {
        let (built, dv, out) = shifted(Arrangement::SeparateCode);
        let (old, new) = (Elf::parse(&built.data).unwrap(), Elf::parse(&out).unwrap());
        let entries = |e: &Elf| e.dynamic().unwrap().into_iter().map(|(_, d)| (d.tag, d.val)).collect::<Vec<_>>();
        let (before, after) = (entries(&old), entries(&new));
        assert_eq!(before.len(), after.len());
        for ((tag, was), (_, now)) in before.into_iter().zip(after) {
            let moves = matches!(tag, DT_INIT | DT_PLTGOT);
            assert_eq!(now, if moves { was + dv } else { was }, "tag {tag}");
        }
        assert_eq!(new.dynamic().unwrap().iter().find(|(_, d)| d.tag == DT_INIT).unwrap().1.val, new.ehdr.e_entry);
    }
}
