//! The self-check: the output is parsed again, from scratch, and every invariant of
//! the transformation is checked against the input before the file is used.
//! It checks structure, not arithmetic: it does not repeat the repairs' formulas.

use crate::elf::names::PAD_SECTION;
use crate::elf::{align_down, align_up, notes, Elf};
use crate::error::{Error, Reason, Result};
use crate::exposure::{self, Exposure};
use crate::layout::{self, Analysis};
use crate::plan::{Mode, Plan};
use crate::windows::huge_windows;

fn fail(detail: impl Into<String>) -> Error {
    Error::new(Reason::SelfCheck, detail)
}

/// Checks `out` against the input `elf` and the `plan` that produced it, and that at
/// most `exposure_limit` bytes became executable that were not; returns those.
pub fn check(elf: &Elf, an: &Analysis, plan: &Plan, exposure_limit: u64, out: &[u8]) -> Result<Exposure> {
    let new = Elf::parse(out).map_err(|e| fail(format!("output does not parse: {e}")))?;
    // Re-analysing checks that every section and memory-describing header lies
    // inside a PT_LOAD at a consistent offset.
    let new_an = layout::analyse(&new).map_err(|e| fail(format!("output layout: {e}")))?;
    let hp = plan.huge_page;
    let page = an.page;
    let x = new_an.exec_load();

    // The executable segment: whole pages, offsets congruent to addresses modulo hp,
    // at least one whole window, and no page shared with another segment. (A
    // rodata-first shift leaves the window at one end partial, in small pages.)
    match plan.mode {
        Mode::Shift => {
            let pages = [x.p_vaddr, x.p_offset, x.p_memsz].iter().all(|v| v % page == 0);
            let windows = huge_windows(std::slice::from_ref(x), new_an.kind.fixed_addresses(), hp);
            if !pages || x.p_vaddr % hp != x.p_offset % hp || x.p_filesz != x.p_memsz || x.p_align != hp {
                return Err(fail(format!("executable segment {x:x?} is not whole pages congruent modulo {hp:#x}")));
            }
            if windows.is_empty() {
                return Err(fail(format!("executable segment {x:x?} holds no whole {hp:#x} window")));
            }
            for l in new_an.loads.iter().filter(|l| !std::ptr::eq(*l, x)) {
                let (a, b) = (align_down(l.p_vaddr, page), align_up(l.vend(), page));
                if b > x.p_vaddr && a < x.vend() {
                    return Err(fail(format!("segment at {:#x} shares a page with the code", l.p_vaddr)));
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

    // Sections: same set, addresses moved exactly as planned.
    for (o, n) in elf.shdrs.iter().zip(&new.shdrs) {
        if o.name != n.name || o.sh_type != n.sh_type || o.sh_flags != n.sh_flags {
            return Err(fail(format!("section {} changed identity ({} -> {})", o.index, o.name, n.name)));
        }
        let moves = an.section_moves[o.index] || (o.is_alloc() && plan.map.relocated.holds(o.sh_addr));
        let want = if moves { plan.map.map(o.sh_addr) } else { o.sh_addr };
        if n.sh_addr != want {
            return Err(fail(format!("section {} ({}) is at {:#x}, planned {want:#x}", o.index, o.name, n.sh_addr)));
        }
        if o.is_code() {
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

    // No byte that was not executable became executable, beyond the limit: measured
    // from the two files' headers by byte ranges, whatever the plan says, in the
    // largest pages (up to the limit) a kernel could map the output with.
    let mappable = layout::congruent_page(&new_an.loads, an.arch.min_page, an.page_limit).max(page);
    let exposed = exposure::measure(elf, &new, an.arch.trap, mappable);
    if exposed.bytes > exposure_limit {
        return Err(fail(format!(
            "{} that were not executable became executable, over the exposure limit of {exposure_limit}",
            exposed.describe()
        )));
    }
    Ok(exposed)
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
    use crate::elf::consts::*;
    use crate::elf::names::PAD_SECTION;
    use crate::elf::Elf;
    use crate::error::Reason;
    use crate::testelf::{opts, run, Arrangement, Dso};
    use crate::{ModeChoice, Options};

    const HP: u64 = 2 << 20;

    /// The self-check's detail for `out` changed by `damage`.
    fn rejected(damage: impl Fn(&Elf, &mut Vec<u8>)) -> String {
        let (built, mut t, out) = run(&Dso::new(Arrangement::SeparateCode, 0x2ff0), ModeChoice::Shift, 2 << 20);
        assert!(crate::verify(&built.data, &out, &mut t).is_ok());
        let mut bad = out.clone();
        damage(&Elf::parse(&out).unwrap(), &mut bad);
        let e = crate::verify(&built.data, &bad, &mut t).unwrap_err();
        assert_eq!(e.reason, Reason::SelfCheck, "{e}");
        e.detail
    }

    fn exec_phdr(elf: &Elf) -> usize {
        elf.phdrs.iter().position(|p| p.is_exec()).unwrap()
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
        let (built, mut t, out) = run(&Dso::new(Arrangement::RodataFirst, 0x30000), ModeChoice::Align, hp);
        assert!(crate::verify(&built.data, &out, &mut t).is_ok());
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
        let e = crate::verify(&built.data, &bad, &mut t).unwrap_err();
        assert_eq!(e.reason, Reason::SelfCheck, "{e}");
        assert!(e.detail.starts_with("executable segment offset is not congruent"), "{e}");
    }

    /// A rodata-first file whose code fills two windows but for 32 KiB: the shift that
    /// makes the code's first window whole exposes the (little) read-only data below it.
    fn rodata_first_two_windows() -> Dso {
        Dso::new(Arrangement::RodataFirst, 2 * HP - 0x8000)
    }

    #[test]
    fn read_only_data_may_become_executable_only_within_the_limit() {
        let data = rodata_first_two_windows().build().data;
        let o = Options { exposure_limit: 0x10000, ..opts(ModeChoice::Shift, HP) };
        let (mut t, out) = crate::transform_to_vec(&data, &o).unwrap();
        let exposed = t.summary().exposed;
        assert!(exposed > 0 && exposed < 0x100, "{exposed:#x}");
        // Measured by the self-check, the same bytes as planned, in the same sections.
        assert_eq!(t.summary().exposed_sections, t.plan.exposed_sections);
        assert_eq!(exposed, t.plan.exposed);
        // A planner that says it exposes nothing, and a limit of 0: the check reads the
        // files, not the plan.
        t.plan.exposed = 0;
        t.plan.exposed_sections.clear();
        t.exposure_limit = 0;
        let e = crate::verify(&data, &out, &mut t).unwrap_err();
        assert_eq!(e.reason, Reason::SelfCheck, "{e}");
        assert!(e.detail.contains("became executable") && e.detail.contains(".eh_frame"), "{e}");
        t.exposure_limit = exposed - 1;
        assert!(crate::verify(&data, &out, &mut t).unwrap_err().detail.contains("over the exposure limit"));
        t.exposure_limit = exposed;
        assert!(crate::verify(&data, &out, &mut t).is_ok());
    }

    #[test]
    fn bytes_copied_into_the_padding_are_caught() {
        // A planner that fills the trap padding before the code with bytes the input
        // never mapped (its section header table): no section claims them, no section
        // moved, every header is right.
        let built = Dso::new(Arrangement::SeparateCode, 0x2ff0).build();
        let old = Elf::parse(&built.data).unwrap();
        let (shoff, table) = (old.ehdr.e_shoff, old.ehdr.shnum * 64);
        let (mut t, out) = crate::transform_broken(&built.data, &opts(ModeChoice::Shift, HP), |p| {
            let (at, len) = p.traps[0];
            assert!(len > table);
            p.traps[0] = (at + table, len - table);
            p.copies.push(crate::plan::Placement { src: shoff, len: table, dst: at });
        });
        let e = crate::verify(&built.data, &out, &mut t).unwrap_err();
        assert_eq!(e.reason, Reason::SelfCheck, "{e}");
        assert!(e.detail.starts_with(&format!("{table} bytes ((bytes outside sections) {table})")), "{e}");
    }

    #[test]
    fn what_shares_the_codes_pages_in_lld_files_is_trap_padding() {
        // lld's file layout: the code's first and last file pages hold the end of
        // .eh_frame and the start of the writable data, which the input maps executable
        // along with the code. An alignment moves the code in the file: what shares its
        // pages there is trap padding.
        let mut dso = Dso::new(Arrangement::RodataFirst, 0x30000 - 0x100);
        dso.contiguous = true;
        let built = dso.build();
        let (text_in, dynamic_in) = (built.sec(".text"), built.sec(".dynamic"));
        assert!(text_in.offset % 0x1000 != 0 && dynamic_in.offset == text_in.offset + text_in.size);
        let hp = 0x10000;
        let (_, mut t, out) = run(&dso, ModeChoice::Align, hp);
        assert_eq!((t.summary().exposed, t.summary().exposed_sections.len()), (0, 0));
        let new = Elf::parse(&out).unwrap();
        let x = new.phdrs[exec_phdr(&new)];
        assert_eq!((x.p_vaddr % 0x1000, x.p_offset % 0x1000, x.p_filesz % 0x1000), (0, 0, 0), "{x:x?}");
        let text = new.section(".text").unwrap();
        let mapped = &out[x.p_offset as usize..x.fend() as usize];
        let code = (text.sh_offset - x.p_offset) as usize..(text.fend() - x.p_offset) as usize;
        let tail = 0x1000 - (text_in.offset + text_in.size) % 0x1000;
        assert_eq!((code.start as u64, (mapped.len() - code.end) as u64), (text_in.offset % 0x1000, tail));
        assert!(mapped[..code.start].iter().chain(&mapped[code.end..]).all(|&b| b == 0xcc));
        assert!(crate::verify(&built.data, &out, &mut t).is_ok());

        // The same plan without the padding after the code: the next load right after
        // it, as in the input.
        let (mut t, out) = crate::transform_broken(&built.data, &opts(ModeChoice::Align, hp), |p| {
            let end = p.traps.pop().unwrap();
            let x = p.phdrs.iter_mut().find(|l| l.is_exec()).unwrap();
            (x.p_filesz, x.p_memsz) = (x.p_filesz - end.1, x.p_memsz - end.1);
            let next = p.copies.iter_mut().find(|c| c.dst >= end.0).unwrap();
            let load = p.phdrs.iter_mut().find(|l| l.p_type == PT_LOAD && l.p_offset == next.dst).unwrap();
            next.dst -= 0x1000;
            (load.p_offset, load.p_align) = (next.dst, 0x1000);
            for h in p.phdrs.iter_mut().filter(|h| h.p_type == PT_DYNAMIC) {
                h.p_offset -= 0x1000;
            }
        });
        let e = crate::verify(&built.data, &out, &mut t).unwrap_err();
        assert_eq!(e.reason, Reason::SelfCheck, "{e}");
        assert!(e.detail.contains("became executable") && e.detail.contains(".dynamic"), "{e}");
    }

    #[test]
    fn damaged_contents_are_rejected() {
        let pad = |e: &Elf| e.shdrs.iter().find(|s| s.name == PAD_SECTION).unwrap().sh_offset as usize;
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
