//! References a shift cannot repair: code that computes the address of something
//! that stays (the ELF header, the program headers, loader metadata) pc-relatively.
//! After a shift such code would be off by `dv`. There is no relocation to fix, so
//! the only safe answer is to refuse the shift (alignment-only still works).
//!
//! Two independent detectors, both cheap and free of disassembly:
//! * symbols the linker defines only when something refers to them (`__ehdr_start`
//!   and friends), and the dynamic loader itself (which uses `__ehdr_start`);
//! * a byte probe for RIP-relative `lea`/`mov` whose target lies in what stays.
//!   It catches stripped files too; on the Debian corpus it fired only on ld.so and
//!   ldconfig (research notes §6.3).

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
    if elf.ehdr.e_machine == EM_X86_64 {
        probe_x86_64(elf, an)?;
    }
    Ok(())
}

fn check_symbols(elf: &Elf) -> Result<()> {
    for s in elf.shdrs.iter().filter(|s| s.sh_type == SHT_SYMTAB || s.sh_type == SHT_DYNSYM) {
        let strtab = elf.shdrs.get(s.sh_link as usize).map(|t| elf.section_data(t)).unwrap_or(&[]);
        for (_, sym) in elf.symbols(s)? {
            if sym.shndx == SHN_UNDEF || sym.name == 0 {
                continue;
            }
            let Some(name) = c_string(strtab, u64::from(sym.name)) else {
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
        let Some(off) = elf.vaddr_to_offset(strtab + d.val) else {
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
                let at = s.sh_addr + op as u64 - u64::from(rex);
                return Err(Error::new(
                    Reason::EhdrReference,
                    format!("code at {at:#x} in {} refers pc-relatively to {target:#x}, which stays in place", s.name),
                ));
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
    use super::memchr2;

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
