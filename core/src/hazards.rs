//! References a shift cannot repair: code that computes the address of something
//! that stays (the ELF header, the program headers, loader metadata) pc-relatively.
//! After a shift such code would be off by `dv`. There is no relocation to fix, so
//! the only safe answer is to refuse the shift (alignment-only still works).
//!
//! Independent detectors, all cheap and free of disassembly:
//! * symbols the linker defines only when something refers to them (`__ehdr_start`
//!   and friends), and the dynamic loader itself (which uses `__ehdr_start`);
//! * a probe of the code for pc-relative address formation whose target lies in what
//!   stays: RIP-relative `lea`/`mov` on x86-64, `adrp` (with its `add`/`ldr`) on
//!   aarch64, GOT-relative `lea`/`mov` on i386. It catches stripped files too; on the
//!   Debian corpus (tests/test_debian_corpus.py) it fired only on ld.so and ldconfig;
//! * on i386, code addresses data relative to the GOT: the GOT must move with it.

use crate::elf::consts::*;
use crate::elf::{c_string, Elf};
use crate::error::{Error, Reason, Result};
use crate::layout::Analysis;

/// Linker-defined symbols that exist only when code refers to them and that lie in
/// what stays.
const STAYING_SYMBOLS: &[&str] = &[
    "__ehdr_start",
    "__executable_start",
    "__rela_iplt_start",
    "__rela_iplt_end",
    "__rel_iplt_start",
    "__rel_iplt_end",
];

/// Fails if anything shows code referring to what the shift leaves in place.
pub fn check_shift(elf: &Elf, an: &Analysis) -> Result<()> {
    check_symbols(elf)?;
    check_soname(elf)?;
    match elf.ehdr.e_machine {
        EM_X86_64 => probe_x86_64(elf, an),
        EM_AARCH64 => probe_aarch64(elf, an),
        EM_386 => probe_i386(elf, an),
        _ => Ok(()),
    }
}

fn check_symbols(elf: &Elf) -> Result<()> {
    for s in elf.shdrs.iter().filter(|s| s.sh_type == SHT_SYMTAB || s.sh_type == SHT_DYNSYM) {
        for (_, sym) in elf.symbols(s)? {
            if sym.shndx == SHN_UNDEF {
                continue;
            }
            let Some(name) = elf.symbol_name(s, &sym) else {
                continue;
            };
            if STAYING_SYMBOLS.contains(&name) {
                return Err(Error::new(
                    Reason::EhdrReference,
                    format!("{} defines {name}, so code refers to the headers pc-relatively", s.name),
                ));
            }
        }
    }
    Ok(())
}

fn check_soname(elf: &Elf) -> Result<()> {
    let dynamic = elf.dynamic()?;
    let Some(strtab) = dynamic.iter().find(|(_, d)| d.tag == DT_STRTAB).map(|(_, d)| d.val) else {
        return Ok(());
    };
    for (_, d) in dynamic.iter().filter(|(_, d)| d.tag == DT_SONAME) {
        let Some(off) = strtab.checked_add(d.val).and_then(|a| elf.vaddr_to_offset(a)) else {
            continue;
        };
        let name = c_string(elf.data, off).unwrap_or("");
        if name.starts_with("ld-linux") || name.starts_with("ld.so") || name.starts_with("ld64.so") {
            return Err(Error::new(
                Reason::EhdrReference,
                format!("{name} is the dynamic loader, which finds its own headers pc-relatively"),
            ));
        }
    }
    Ok(())
}

/// Looks for `[REX] 8d|8b modrm(mod=00, rm=101) disp32` (RIP-relative lea/mov) in
/// moved executable sections whose target lies in [start of image, move start).
fn probe_x86_64(elf: &Elf, an: &Analysis) -> Result<()> {
    let low = an.loads.first().map_or(0, |l| l.p_vaddr);
    for s in an.exec_sections(elf).filter(|s| an.section_moves[s.index]) {
        let code = elf.section_data(s);
        let mut i = 0usize;
        while i + 6 <= code.len() {
            let Some(hit) = memchr2(0x8d, 0x8b, &code[i..]) else {
                break;
            };
            let op = i + hit;
            i = op + 1;
            let Some(&modrm) = code.get(op + 1) else {
                break;
            };
            if modrm & 0xc7 != 0x05 || op + 6 > code.len() {
                continue;
            }
            let disp = i32::from_le_bytes(code[op + 2..op + 6].try_into().unwrap());
            let next = s.sh_addr + op as u64 + 6;
            let target = next.wrapping_add(disp as i64 as u64);
            if target >= low && target < an.move_start {
                let rex = op > 0 && code[op - 1] & 0xf0 == 0x40;
                return Err(staying_reference(s, op as u64 - u64::from(rex), target));
            }
        }
    }
    Ok(())
}

fn staying_reference(s: &crate::elf::Shdr, at: u64, target: u64) -> Error {
    Error::new(
        Reason::EhdrReference,
        format!(
            "code at {:#x} in {} refers pc-relatively to {target:#x}, which stays in place",
            s.sh_addr + at,
            s.name
        ),
    )
}

/// `adrp xD, page` computes a 4 KiB page pc-relatively. A page wholly below the
/// split point is a reference to what stays; for the page holding the split point the
/// low bits come from the `add`/`ldr` that uses xD next (or, unknown, count it).
fn probe_aarch64(elf: &Elf, an: &Analysis) -> Result<()> {
    let low = an.loads.first().map_or(0, |l| l.p_vaddr);
    let insn = |code: &[u8], i: usize| code.get(i..i + 4).map(|b| u32::from_le_bytes(b.try_into().unwrap()));
    for s in an.exec_sections(elf).filter(|s| an.section_moves[s.index]) {
        let code = elf.section_data(s);
        for i in (0..code.len()).step_by(4) {
            let Some(w) = insn(code, i) else { break };
            let Some(page) = adrp_page(w, s.sh_addr + i as u64) else { continue };
            let rd = w & 0x1f;
            if page < low || page >= an.move_start {
                continue;
            }
            let target = if page + 0x1000 <= an.move_start {
                page
            } else {
                match insn(code, i + 4) {
                    // add xD, xD, #imm12{, lsl #12}
                    Some(n) if n & 0xff80_0000 == 0x9100_0000 && (n >> 5) & 0x1f == rd => {
                        page + (u64::from((n >> 10) & 0xfff) << (12 * ((n >> 22) & 1)))
                    }
                    // ldr xD/wD, [xD, #imm12 * size]
                    Some(n) if n & 0xbfc0_0000 == 0xb940_0000 && (n >> 5) & 0x1f == rd => {
                        page + (u64::from((n >> 10) & 0xfff) << (2 + (n >> 30 & 1)))
                    }
                    _ => page,
                }
            };
            if target < an.move_start {
                return Err(staying_reference(s, i as u64, target));
            }
        }
    }
    Ok(())
}

/// The page an `adrp` at `pc` computes, or None if `insn` is not an `adrp`.
fn adrp_page(insn: u32, pc: u64) -> Option<u64> {
    if insn & 0x9f00_0000 != 0x9000_0000 {
        return None;
    }
    let imm = u64::from(((insn >> 5) & 0x7ffff) << 2 | (insn >> 29) & 3);
    let offset = ((imm << 43) as i64 >> 31) as u64; // sign-extend 21 bits, times 4096
    Some((pc & !0xfff).wrapping_add(offset))
}

/// i386 PIC reaches data as GOT + offset (`lea off(%reg)`, `mov off(%reg)`): the GOT
/// must move with the code, and no such offset may land in what stays.
fn probe_i386(elf: &Elf, an: &Analysis) -> Result<()> {
    let low = an.loads.first().map_or(0, |l| l.p_vaddr);
    let Some(got) = elf.dynamic()?.iter().find(|(_, d)| d.tag == DT_PLTGOT).map(|(_, d)| d.val) else {
        return Ok(());
    };
    if got < an.move_start {
        return Err(Error::new(
            Reason::UnsupportedLayout,
            format!("the GOT at {got:#x} stays while the code moves, so GOT-relative references would break"),
        ));
    }
    for s in an.exec_sections(elf).filter(|s| an.section_moves[s.index]) {
        let code = elf.section_data(s);
        let mut i = 0usize;
        while i + 6 <= code.len() {
            let Some(hit) = memchr2(0x8d, 0x8b, &code[i..]) else { break };
            let op = i + hit;
            i = op + 1;
            let Some(&modrm) = code.get(op + 1) else { break };
            // mod=10 (disp32), any base register but the SIB escape (esp).
            if modrm & 0xc0 != 0x80 || modrm & 7 == 4 || op + 6 > code.len() {
                continue;
            }
            let disp = i32::from_le_bytes(code[op + 2..op + 6].try_into().unwrap());
            let target = got.wrapping_add(disp as i64 as u64) & 0xffff_ffff;
            if target >= low && target < an.move_start {
                return Err(staying_reference(s, op as u64, target));
            }
        }
    }
    Ok(())
}

/// Position of the first byte equal to `a` or `b`. Eight bytes at a time: the probe
/// runs over every code byte of every file, so it must not be a byte loop.
fn memchr2(a: u8, b: u8, hay: &[u8]) -> Option<usize> {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let (ra, rb) = (LO * u64::from(a), LO * u64::from(b));
    let has_zero = |v: u64| v.wrapping_sub(LO) & !v & HI != 0;
    let mut i = 0;
    while i + 8 <= hay.len() {
        let w = u64::from_le_bytes(hay[i..i + 8].try_into().unwrap());
        if has_zero(w ^ ra) || has_zero(w ^ rb) {
            break;
        }
        i += 8;
    }
    hay[i..].iter().position(|&c| c == a || c == b).map(|p| p + i)
}

#[cfg(test)]
mod tests {
    use super::{adrp_page, check_soname, memchr2};
    use crate::elf::consts::*;
    use crate::elf::{Class, Ehdr, Elf, Shdr};
    use crate::error::Reason;

    /// A file that is only `data` and a dynamic section of `size` bytes at `offset`.
    fn dynamic_only(data: &[u8], offset: u64, size: u64) -> Elf<'_> {
        let ehdr = Ehdr {
            e_type: ET_DYN,
            e_machine: EM_X86_64,
            e_entry: 0,
            e_phoff: 0,
            e_shoff: 0,
            e_phentsize: 56,
            phnum: 0,
            e_shentsize: 64,
            shnum: 1,
            shstrndx: 0,
        };
        let s = Shdr {
            index: 0,
            name: ".dynamic".into(),
            sh_name: 0,
            sh_type: SHT_DYNAMIC,
            sh_flags: 0,
            sh_addr: 0,
            sh_offset: offset,
            sh_size: size,
            sh_link: 0,
            sh_info: 0,
            sh_addralign: 8,
            sh_entsize: 16,
        };
        Elf { data, class: Class { is64: true }, ehdr, phdrs: Vec::new(), shdrs: vec![s] }
    }

    #[test]
    fn soname_offsets_past_the_address_space_are_errors_or_skipped() {
        let entries = [(DT_STRTAB, u64::MAX - 0xff), (DT_SONAME, 0x1000), (DT_NULL, 0)];
        let data: Vec<u8> = entries.iter().flat_map(|&(t, v)| [t.to_le_bytes(), v.to_le_bytes()].concat()).collect();
        assert!(check_soname(&dynamic_only(&data, 0, data.len() as u64)).is_ok());
        // An empty dynamic section (unchecked by parsing) at the very end of the offsets.
        let e = check_soname(&dynamic_only(&data, u64::MAX - 7, 0)).unwrap_err();
        assert_eq!(e.reason, Reason::BadDynamic);
    }

    /// `adrp x<rd>, page`, encoded by hand from the Arm ARM (C6.2.11).
    fn adrp(rd: u32, pc: u64, page: u64) -> u32 {
        let imm = ((page as i64 - (pc & !0xfff) as i64) >> 12) as u32 & 0x1f_ffff;
        0x9000_0000 | (imm & 3) << 29 | (imm >> 2) << 5 | rd
    }

    #[test]
    fn adrp_pages_decode_both_ways() {
        assert_eq!(adrp_page(adrp(24, 0x12_3450, 0), 0x12_3450), Some(0));
        assert_eq!(adrp_page(adrp(3, 0x1000, 0x5_0000), 0x1ffc), Some(0x5_0000));
        assert_eq!(adrp_page(adrp(0, 0x40_0000, 0x1000), 0x40_0abc), Some(0x1000));
        assert_eq!(adrp_page(0xd420_0000, 0), None); // brk #0
    }

    #[test]
    fn memchr2_finds_first_of_either_byte() {
        let mut hay = vec![0u8; 40];
        assert_eq!(memchr2(0x8d, 0x8b, &hay), None);
        hay[17] = 0x8b;
        hay[30] = 0x8d;
        assert_eq!(memchr2(0x8d, 0x8b, &hay), Some(17));
        assert_eq!(memchr2(0x8d, 0x8b, &hay[18..]), Some(12));
        hay[3] = 0x8d;
        assert_eq!(memchr2(0x8d, 0x8b, &hay), Some(3));
    }
}
