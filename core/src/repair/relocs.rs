//! Dynamic relocations (REL, RELA, RELR) and the GOT words no relocation covers.
//!
//! Every relocated place (`r_offset`, RELR address words) moves with its segment.
//! For the types that carry a link-time address of this image (RELATIVE, IRELATIVE,
//! lazy JUMP_SLOT) the address moves too: the addend of RELA, and the word in place,
//! which is the addend for REL and RELR, a copy of the addend that GNU ld writes for
//! RELA, or the PLT address the loader adjusts for lazy binding. Symbolic and TLS
//! types hold no address of this image and are left alone.

use super::Ctx;
use crate::addr_map::AddrMap;
use crate::arch::RelocClass;
use crate::elf::consts::*;
use crate::elf::names::GOT;
use crate::elf::{Elf, Shdr};
use crate::error::{Error, Reason, Result};
use crate::patch::Patches;

pub(super) fn repair(ctx: &Ctx, p: &mut Patches) -> Result<()> {
    let elf = ctx.elf;
    if let Some(s) = elf.shdrs.iter().find(|s| (s.sh_type == SHT_REL || s.sh_type == SHT_RELA) && !s.is_alloc()) {
        return Err(Error::new(
            Reason::UnsupportedSection,
            format!(
                "{} holds static relocations (linked with --emit-relocs), which would need code-level repair",
                s.name
            ),
        ));
    }
    let mut places = Vec::new();
    for s in elf.shdrs.iter().filter(|s| s.is_alloc()) {
        match s.sh_type {
            SHT_REL | SHT_RELA => rel_table(ctx, s, p, &mut places)?,
            SHT_RELR => relr_table(ctx, s, p, &mut places)?,
            _ => {}
        }
    }
    places.sort_unstable();
    got_header(ctx, &places, p)
}

fn in_place_offset(elf: &Elf, table: &Shdr, place: u64) -> Result<u64> {
    elf.vaddr_to_offset(place).ok_or_else(|| {
        Error::new(
            Reason::BadRelocations,
            format!("{}: relocated place {place:#x} is not backed by the file", table.name),
        )
    })
}

/// Moves the address-sized word at `place` if it holds a moved address.
fn move_word_in_place(elf: &Elf, map: &AddrMap, table: &Shdr, place: u64, p: &mut Patches) -> Result<()> {
    let off = in_place_offset(elf, table, place)?;
    let w = elf.class.read_word(elf.data, off)?;
    if map.moves(w) {
        p.put_word(elf.class, off, map.map(w));
    }
    Ok(())
}

fn rel_table(ctx: &Ctx, s: &Shdr, p: &mut Patches, places: &mut Vec<u64>) -> Result<()> {
    let (elf, map) = (ctx.elf, &ctx.plan.map);
    let w = elf.class.word();
    for (off, r) in elf.relocations(s)? {
        if map.moves(r.offset) {
            p.put_word(elf.class, off, map.map(r.offset));
        }
        let class = ctx.an.arch.classify_reloc(r.kind).ok_or_else(|| {
            Error::new(
                Reason::UnsupportedRelocation,
                format!("{}: relocation type {} at {:#x} is not known", s.name, r.kind, r.offset),
            )
        })?;
        places.push(r.offset);
        match (class, r.addend) {
            (RelocClass::NoAddress, _) => {}
            (RelocClass::Relative, Some(addend)) => {
                let addend = addend as u64 & mask(elf.class.word());
                if map.moves(addend) {
                    p.put_word(elf.class, off + 2 * w, map.map(addend));
                    // GNU ld also writes the addend in place; other linkers write 0.
                    if let Some(at) = elf.vaddr_to_offset(r.offset) {
                        if elf.class.read_word(elf.data, at)? == addend {
                            p.put_word(elf.class, at, map.map(addend));
                        }
                    }
                }
            }
            (RelocClass::IRelative, Some(addend)) => {
                let addend = addend as u64 & mask(elf.class.word());
                if map.moves(addend) {
                    p.put_word(elf.class, off + 2 * w, map.map(addend));
                }
                if elf.vaddr_to_offset(r.offset).is_some() {
                    move_word_in_place(elf, map, s, r.offset, p)?;
                }
            }
            // REL keeps the addend in place; a lazy JUMP_SLOT holds a PLT address there.
            (RelocClass::Relative | RelocClass::IRelative, None) | (RelocClass::JumpSlot, _) => {
                move_word_in_place(elf, map, s, r.offset, p)?;
            }
        }
    }
    Ok(())
}

fn mask(word: u64) -> u64 {
    if word == 8 {
        u64::MAX
    } else {
        u64::from(u32::MAX)
    }
}

/// RELR: even words are addresses, odd words are bitmaps of the following words.
/// Bitmaps stay valid because every place of one run moves by the same amount.
fn relr_table(ctx: &Ctx, s: &Shdr, p: &mut Patches, places: &mut Vec<u64>) -> Result<()> {
    let (elf, map) = (ctx.elf, &ctx.plan.map);
    let w = elf.class.word();
    let data = elf.section_data(s);
    if data.len() as u64 % w != 0 {
        return Err(Error::new(Reason::BadRelocations, format!("{} has a size that is not a multiple of {w}", s.name)));
    }
    let mut next = None::<u64>;
    let mut run_moves = false;
    for i in 0..data.len() as u64 / w {
        let entry = s.sh_offset + i * w;
        let word = elf.class.read_word(elf.data, entry)?;
        if word & 1 == 0 {
            if map.moves(word) {
                p.put_word(elf.class, entry, map.map(word));
            }
            run_moves = map.moves(word);
            places.push(word);
            move_word_in_place(elf, map, s, word, p)?;
            next = Some(word + w);
        } else {
            let base = next
                .ok_or_else(|| Error::new(Reason::BadRelocations, format!("{}: bitmap before any address", s.name)))?;
            for bit in 1..8 * w {
                if (word >> bit) & 1 == 1 {
                    let place = base + (bit - 1) * w;
                    if map.moves(place) != run_moves {
                        return Err(Error::new(
                            Reason::UnsupportedRelocation,
                            format!("{}: a RELR run straddles the split point at {place:#x}", s.name),
                        ));
                    }
                    places.push(place);
                    move_word_in_place(elf, map, s, place, p)?;
                }
            }
            next = Some(base + (8 * w - 1) * w);
        }
    }
    Ok(())
}

/// GOT[0] holds the link-time address of `_DYNAMIC` and no relocation covers it.
/// It sits at DT_PLTGOT (x86) or at the start of `.got` (aarch64).
fn got_header(ctx: &Ctx, places: &[u64], p: &mut Patches) -> Result<()> {
    let (elf, map) = (ctx.elf, &ctx.plan.map);
    let Some(dynamic) = elf.phdrs.iter().find(|ph| ph.p_type == PT_DYNAMIC).map(|ph| ph.p_vaddr) else {
        return Ok(());
    };
    let mut candidates: Vec<u64> =
        elf.dynamic()?.iter().filter(|(_, d)| d.tag == DT_PLTGOT).map(|(_, d)| d.val).collect();
    candidates.extend(elf.section(GOT).filter(|s| s.sh_size > 0).map(|s| s.sh_addr));
    candidates.sort_unstable();
    candidates.dedup();
    for c in candidates {
        let Some(off) = elf.vaddr_to_offset(c) else {
            continue;
        };
        if places.binary_search(&c).is_ok() || elf.class.read_word(elf.data, off)? != dynamic {
            continue;
        }
        if map.moves(dynamic) {
            p.put_word(elf.class, off, map.map(dynamic));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::elf::Elf;
    use crate::testelf::{at, contents, shifted, word, Arrangement};

    #[test]
    fn relative_addends_and_their_words_move_from_the_split_point_on() {
        for arrangement in [Arrangement::SeparateCode, Arrangement::TextInFirst] {
            let (built, dv, out) = shifted(arrangement);
            let new = Elf::parse(&out).unwrap();
            let (text, data, dynstr) = (built.addr(".text"), built.addr(".data"), built.addr(".dynstr"));
            let rela: Vec<(u64, u64)> =
                contents(&new, ".rela.dyn").chunks(24).map(|r| (word(r, 0), word(r, 16))).collect();
            assert_eq!(
                rela,
                [
                    (data + dv, text + at::RELATIVE_TARGET + dv),
                    (data + 8 + dv, built.addr(".rodata") + 8 + dv),
                    (data + 16 + dv, dynstr)
                ],
                "{arrangement:?}"
            );
            let words: Vec<u64> = contents(&new, ".data").chunks(8).map(|w| word(w, 0)).collect();
            // GNU ld's copy of the addend moves; lld's 0 and the copy of a staying
            // address stay; a word no relocation names is not touched.
            assert_eq!(words, [text + at::RELATIVE_TARGET + dv, 0, dynstr, text + at::RELATIVE_TARGET]);
            // GOT[0], _DYNAMIC's link-time address, has no relocation and moves too.
            assert_eq!(word(contents(&new, ".got"), 0), built.addr(".dynamic") + dv);
        }
    }
}
