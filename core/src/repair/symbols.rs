//! `.dynsym` and `.symtab`: a symbol moves when the section it is defined in moves.
//! TLS symbols hold offsets into the TLS block, absolute and common symbols hold no
//! address of this image; they stay. Undefined symbols with a value are canonical
//! PLT addresses (function-pointer equality) and move with the PLT.
//!
//! One exception among absolute symbols: GNU ld for aarch64 defines `_DYNAMIC` and
//! `_GLOBAL_OFFSET_TABLE_` in `.symtab` as local absolute symbols holding addresses in
//! `.dynamic` and `.got`. Those two markers move when the section holding their value
//! moves; `.dynsym`, which the loader reads, keeps every absolute value.

use super::Ctx;
use crate::elf::consts::*;
use crate::elf::{read_u32, Shdr};
use crate::error::{Error, Reason, Result};
use crate::patch::Patches;

/// Linker-defined markers that GNU ld for aarch64 makes local absolute symbols.
const LINKER_MARKERS: &[&str] = &["_DYNAMIC", "_GLOBAL_OFFSET_TABLE_"];

pub(super) fn repair(ctx: &Ctx, p: &mut Patches) -> Result<()> {
    let (elf, an, map) = (ctx.elf, ctx.an, &ctx.plan.map);
    let (value_field, _) = elf.class.sym_value_field();
    let in_moved_section = |addr: u64| {
        elf.shdrs.iter().any(|s| {
            an.section_moves[s.index]
                && s.sh_flags & SHF_ALLOC != 0
                && addr >= s.sh_addr
                && addr - s.sh_addr < s.sh_size
        })
    };
    // A note or .interp relocated behind what stays (crate::addr_map::Relocated) takes the
    // symbols defined in it along (glibc's local `__abi_tag` in .note.ABI-tag).
    let relocated_section = |shndx: u16| {
        shndx != SHN_UNDEF
            && shndx < SHN_LORESERVE
            && elf.shdrs.get(usize::from(shndx)).is_some_and(|s| s.is_alloc() && map.relocated.holds(s.sh_addr))
    };
    for table in elf.shdrs.iter().filter(|s| s.sh_type == SHT_SYMTAB || s.sh_type == SHT_DYNSYM) {
        let xindex = extended_indices(ctx, table)?;
        for (i, (off, sym)) in elf.symbols(table)?.into_iter().enumerate() {
            let moves = sym.kind() != STT_TLS
                && match sym.shndx {
                    SHN_UNDEF => sym.value != 0 && map.moves(sym.value),
                    SHN_XINDEX => {
                        let idx = xindex.as_ref().and_then(|x| x.get(i)).copied().ok_or_else(|| {
                            Error::new(
                                Reason::BadSymbols,
                                format!("{}: symbol {i} needs .symtab_shndx, which is missing", table.name),
                            )
                        })?;
                        an.section_moves.get(idx as usize).copied().unwrap_or(false)
                    }
                    n if n < SHN_LORESERVE => an.section_moves.get(usize::from(n)).copied().unwrap_or(false),
                    SHN_ABS => {
                        table.sh_type == SHT_SYMTAB
                            && sym.info >> 4 == STB_LOCAL
                            && elf.symbol_name(table, &sym).is_some_and(|n| LINKER_MARKERS.contains(&n))
                            && in_moved_section(sym.value)
                    }
                    _ => false,
                };
            if moves {
                p.put_word(elf.class, off + value_field, sym.value.wrapping_add(map.dv));
            } else if relocated_section(sym.shndx) && map.relocated.holds(sym.value) {
                p.put_word(elf.class, off + value_field, map.map(sym.value));
            }
        }
    }
    Ok(())
}

fn extended_indices(ctx: &Ctx, table: &Shdr) -> Result<Option<Vec<u32>>> {
    let elf = ctx.elf;
    let Some(s) = elf.shdrs.iter().find(|s| s.sh_type == SHT_SYMTAB_SHNDX && s.sh_link as usize == table.index) else {
        return Ok(None);
    };
    let data = elf.section_data(s);
    (0..data.len() as u64 / 4).map(|i| read_u32(data, i * 4)).collect::<Result<Vec<_>>>().map(Some)
}

#[cfg(test)]
mod tests {
    use crate::elf::Elf;
    use crate::testelf::{shifted, Arrangement};

    /// (name or section index, value) of every symbol of `table`.
    fn values(e: &Elf, table: &str) -> Vec<(String, u64)> {
        let s = e.section(table).unwrap();
        let named = |(_, sym): (u64, crate::elf::Sym)| {
            (e.symbol_name(s, &sym).map_or(format!("[{}]", sym.shndx), str::to_owned), sym.value)
        };
        e.symbols(s).unwrap().into_iter().map(named).collect()
    }

    #[test]
    fn symbols_move_with_their_sections() {
        for arrangement in [Arrangement::SeparateCode, Arrangement::TextInFirst] {
            let (built, dv, out) = shifted(arrangement);
            let (old, new) = (Elf::parse(&built.data).unwrap(), Elf::parse(&out).unwrap());
            for table in [".symtab", ".dynsym"] {
                for ((name, was), (_, now)) in values(&old, table).into_iter().zip(values(&new, table)) {
                    // Absolute, file and undefined symbols stay. The note's section symbol
                    // stays with its section where the first load is not split, and
                    // where it is, follows the note behind what stays (the grown
                    // header table takes its place).
                    let moves = matches!(name.as_str(), "func" | "object" | "rodata_obj" | "data_obj" | "_DYNAMIC");
                    let want = match name.as_str() {
                        "[1]" => new.section(crate::testelf::NOTE).unwrap().sh_addr,
                        _ if moves => was + dv,
                        _ => was,
                    };
                    assert_eq!(now, want, "{table} {name} {arrangement:?}");
                    if name == "[1]" {
                        assert_eq!(now != was, arrangement == Arrangement::TextInFirst);
                    }
                }
            }
        }
    }
}
