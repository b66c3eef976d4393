//! The self-check: the output is parsed again, from scratch, and every invariant of
//! the transformation is checked against the input before the file is used.
//! It checks structure, not arithmetic: it does not repeat the repairs' formulas.

use crate::assemble::PAD_SECTION;
use crate::elf::consts::*;
use crate::elf::{align_down, align_up, notes, Elf};
use crate::error::{Error, Reason, Result};
use crate::layout::{self, Analysis};
use crate::plan::{Mode, Plan};

fn fail(detail: impl Into<String>) -> Error {
    Error::new(Reason::SelfCheck, detail)
}

/// Checks `out` against the input `elf` and the `plan` that produced it.
pub fn check(elf: &Elf, an: &Analysis, plan: &Plan, out: &[u8]) -> Result<()> {
    let new = Elf::parse(out).map_err(|e| fail(format!("output does not parse: {e}")))?;
    // Re-analysing checks that every section and memory-describing header lies
    // inside a PT_LOAD at a consistent offset.
    let new_an = layout::analyse(&new).map_err(|e| fail(format!("output layout: {e}")))?;
    let hp = plan.huge_page;
    let page = an.arch.min_page;
    let x = new_an.exec_load();

    // The executable segment.
    match plan.mode {
        Mode::Shift => {
            if x.p_vaddr % hp != 0
                || x.p_offset % hp != 0
                || x.p_filesz != x.p_memsz
                || x.p_memsz % hp != 0
                || x.p_align != hp
            {
                return Err(fail(format!("executable segment {x:x?} does not cover whole {hp:#x} windows")));
            }
            for l in new_an.loads.iter().filter(|l| !std::ptr::eq(*l, x)) {
                let (a, b) = (align_down(l.p_vaddr, page), align_up(l.vend(), page));
                if b > x.p_vaddr && a < x.vend() {
                    return Err(fail(format!("segment at {:#x} shares a huge-page window with the code", l.p_vaddr)));
                }
            }
        }
        Mode::Align => {
            if x.p_offset % hp != x.p_vaddr % hp || x.p_align < hp {
                return Err(fail("executable segment offset is not congruent to its address"));
            }
        }
    }
    for l in &new_an.loads {
        if l.p_offset % page != l.p_vaddr % page {
            return Err(fail(format!(
                "segment at {:#x} has offset {:#x} not congruent modulo the page size",
                l.p_vaddr, l.p_offset
            )));
        }
    }

    // Sections: same set, addresses moved exactly as planned, and no byte that was
    // not executable became executable.
    let old_x = an.exec_load();
    // A rodata-first shift may expose the read-only data that shares the code's first
    // window, and nothing above the code.
    let new_code_start = new.shdrs[..elf.shdrs.len()]
        .iter()
        .filter(|s| s.is_alloc() && s.sh_flags & SHF_EXECINSTR != 0 && s.sh_size > 0)
        .map(|s| s.sh_addr)
        .min()
        .unwrap_or(0);
    let mut exposed = 0;
    for (o, n) in elf.shdrs.iter().zip(&new.shdrs) {
        if o.name != n.name || o.sh_type != n.sh_type || o.sh_flags != n.sh_flags {
            return Err(fail(format!("section {} changed identity ({} -> {})", o.index, o.name, n.name)));
        }
        let want = if an.section_moves[o.index] { plan.map.map(o.sh_addr) } else { o.sh_addr };
        if n.sh_addr != want {
            return Err(fail(format!("section {} ({}) is at {:#x}, planned {want:#x}", o.index, o.name, n.sh_addr)));
        }
        // A .tbss takes no address space of its own (lld puts its address in the page gap
        // after the code): only the TLS template's layout uses it.
        if o.is_alloc() && o.sh_size > 0 && o.sh_flags & SHF_EXECINSTR == 0 && !o.is_tls_bss() {
            let was_exec = o.sh_addr >= old_x.p_vaddr && o.sh_addr < old_x.vend();
            let is_exec = n.sh_addr >= x.p_vaddr && n.sh_addr < x.vend();
            if is_exec && !was_exec {
                exposed += o.sh_size;
                if n.sh_addr + n.sh_size > new_code_start || exposed > plan.exposed {
                    return Err(fail(format!("section {} ({}) became executable", o.index, o.name)));
                }
            }
        }
        if o.sh_flags & SHF_EXECINSTR != 0 && o.has_file_data() {
            spot_check(elf, &new, o.sh_offset, n.sh_offset, o.sh_size, &o.name)?;
        }
    }
    for pad in new.shdrs[elf.shdrs.len()..].iter() {
        if pad.name != PAD_SECTION {
            return Err(fail(format!("unexpected new section {}", pad.name)));
        }
        let bytes = new.section_data(pad);
        let t = an.arch.trap;
        if bytes.iter().enumerate().any(|(i, &b)| b != t[((pad.sh_offset + i as u64) % t.len() as u64) as usize]) {
            return Err(fail(format!("padding at {:#x} is not all trap instructions", pad.sh_addr)));
        }
    }

    // Entry point and build-id.
    if new.ehdr.e_entry != plan.map.map(elf.ehdr.e_entry) {
        return Err(fail("entry point did not move with the code"));
    }
    let (old_id, new_id) = (notes::build_id(elf)?.map(|n| n.1), notes::build_id(&new)?.map(|n| n.1));
    match (old_id, new_id) {
        (Some(a), Some(b)) => {
            let bits: u32 = a.iter().zip(b).map(|(x, y)| (x ^ y).count_ones()).sum();
            if a.len() != b.len() || bits != 1 {
                return Err(fail(format!("build-id differs in {bits} bits, not exactly one")));
            }
        }
        (None, None) => {}
        _ => return Err(fail("build-id note appeared or disappeared")),
    }

    Ok(())
}

/// Compares the first and last 4 KiB of a code section: code is never edited. (A
/// section whose bytes lie outside the file must stay so.)
fn spot_check(old: &Elf, new: &Elf, o: u64, n: u64, size: u64, name: &str) -> Result<()> {
    let k = size.min(4096);
    let bytes = |data, at: u64| crate::elf::slice(data, at, k).ok();
    for (a, b) in [(o, n), (o.saturating_add(size - k), n.saturating_add(size - k))] {
        if bytes(old.data, a) != bytes(new.data, b) {
            return Err(fail(format!("contents of {name} changed")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::elf::Elf;
    use crate::error::Reason;
    use crate::testelf::{run, Arrangement, Dso};
    use crate::ModeChoice;

    /// The self-check's detail for `out` changed by `damage`.
    fn rejected(damage: impl Fn(&Elf, &mut Vec<u8>)) -> String {
        let (built, t, out) = run(&Dso::new(Arrangement::SeparateCode, 0x2ff0), ModeChoice::Shift, 2 << 20);
        assert!(crate::verify(&built.data, &out, &t).is_ok());
        let mut bad = out.clone();
        damage(&Elf::parse(&out).unwrap(), &mut bad);
        let e = crate::verify(&built.data, &bad, &t).unwrap_err();
        assert_eq!(e.reason, Reason::SelfCheck, "{e}");
        e.detail
    }

    fn exec_phdr(elf: &Elf) -> usize {
        elf.phdrs.iter().position(|p| p.p_flags & crate::elf::consts::PF_X != 0).unwrap()
    }

    #[test]
    fn a_damaged_header_is_rejected() {
        assert!(rejected(|_, b| b[24] ^= 1).contains("entry point"));
        // p_vaddr of the code: no longer congruent to its offset.
        let d = rejected(|e, b| b[64 + 56 * exec_phdr(e) + 17] ^= 1);
        assert!(d.contains("does not parse"), "{d}");
        // p_offset and p_vaddr together: a load that no longer covers whole windows.
        let d = rejected(|e, b| {
            let at = 64 + 56 * exec_phdr(e);
            b[at + 9] ^= 0x10;
            b[at + 17] ^= 0x10;
        });
        assert!(d.contains("output layout") || d.contains("whole"), "{d}");
        assert!(rejected(|_, b| b.truncate(b.len() - 1)).contains("does not parse"));
    }

    #[test]
    fn an_aligned_output_with_its_code_moved_back_is_rejected() {
        let hp = 0x10000;
        let (built, t, out) = run(&Dso::new(Arrangement::RodataFirst, 0x30000), ModeChoice::Align, hp);
        assert!(crate::verify(&built.data, &out, &t).is_ok());
        let new = Elf::parse(&out).unwrap();
        let x = exec_phdr(&new);
        // The input's p_offset and p_align, and the matching section offset: a file
        // that parses, but whose code is not congruent modulo the huge page.
        let mut bad = out.clone();
        let at = 64 + 56 * x;
        for field in [at + 8..at + 16, at + 48..at + 56] {
            bad[field.clone()].copy_from_slice(&built.data[field]);
        }
        let text = (new.ehdr.e_shoff + 64 * new.section(".text").unwrap().index as u64 + 24) as usize;
        bad[text..text + 8].copy_from_slice(&(built.sec(".text").offset).to_le_bytes());
        let e = crate::verify(&built.data, &bad, &t).unwrap_err();
        assert_eq!(e.reason, Reason::SelfCheck, "{e}");
        assert!(e.detail.starts_with("executable segment offset is not congruent"), "{e}");
    }

    #[test]
    fn read_only_data_may_become_executable_only_as_planned() {
        // Code short of a window: the read-only data below it shares the code's window.
        let (built, mut t, out) = run(&Dso::new(Arrangement::RodataFirst, 0x3000), ModeChoice::Shift, 2 << 20);
        assert!(t.plan.exposed > 0);
        assert!(crate::verify(&built.data, &out, &t).is_ok());
        t.plan.exposed = 0;
        let e = crate::verify(&built.data, &out, &t).unwrap_err();
        assert!(e.detail.contains("became executable"), "{e}");
    }

    #[test]
    fn damaged_contents_are_rejected() {
        let pad = |e: &Elf| e.shdrs.iter().find(|s| s.name == super::PAD_SECTION).unwrap().sh_offset as usize;
        assert!(rejected(|e, b| b[pad(e) + 5] = 0x90).contains("not all trap"));
        let text = |e: &Elf| e.section(".text").unwrap().sh_offset as usize;
        assert!(rejected(|e, b| b[text(e) + 3] = 0x90).contains("contents of .text changed"));
        let id = |e: &Elf| crate::elf::notes::build_id(e).unwrap().unwrap().0 as usize;
        assert!(rejected(|e, b| b[id(e)] ^= crate::repair::BUILD_ID_FLIP).contains("differs in 0 bits"));
        // sh_addr and sh_offset of .data: consistent, but not where the plan moved it.
        let d = rejected(|e, b| {
            let at = (e.ehdr.e_shoff + 64 * e.section(".data").unwrap().index as u64) as usize;
            b[at + 16] ^= 8;
            b[at + 24] ^= 8;
        });
        assert!(d.contains("(.data)") && d.contains("planned"), "{d}");
    }
}
