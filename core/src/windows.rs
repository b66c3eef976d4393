//! The one rule for "which code of this file can be mapped with huge pages as the
//! file is": whole huge-page windows of an executable PT_LOAD whose file offset is
//! congruent to its address and which the loader places at a huge-page-aligned
//! address. `inspect`'s figure for today, each plan's coverage, the probe and the
//! manifest entry all come from here. The libc-free C runtime cannot link this crate,
//! so `hp_exec_range` in runtime/hp_elf.c states the same rule step for step, and
//! tests/test_as_is.py holds the two to the same answer over a table of files.

use crate::elf::{align_down, Phdr};

/// A run of whole huge-page windows inside one executable PT_LOAD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowRun {
    /// File offset of the first window (a multiple of the huge-page size).
    pub offset: u64,
    /// Link-time address of the first window (congruent to `offset`).
    pub vaddr: u64,
    /// Bytes of the run (a multiple of the huge-page size, never 0).
    pub len: u64,
}

impl WindowRun {
    /// One past the last address of the run.
    pub fn vend(&self) -> u64 {
        self.vaddr + self.len
    }
}

/// Whether a load is mapped at an address whose huge-page windows line up with
/// the file's: its offset congruent to its address modulo `hp`, and the address
/// itself where the link put it. `fixed` says the file is an ET_EXEC, whose
/// segments go to their link-time addresses whatever their `p_align`; a PIE or
/// library gets a huge-page-aligned base only if its loads ask for one
/// (`p_align >= hp`), which glibc's loader and the kernel's ELF loader honour.
pub fn huge_placed(p: &Phdr, fixed: bool, hp: u64) -> bool {
    (fixed || p.p_align >= hp) && p.p_vaddr.wrapping_sub(p.p_offset) % hp == 0
}

/// The whole huge-page windows of the executable loads among `phdrs` that are
/// [`huge_placed`]. Only file-backed bytes count (`p_filesz`): the rest of
/// `p_memsz` is anonymous memory.
pub fn huge_windows(phdrs: &[Phdr], fixed: bool, hp: u64) -> Vec<WindowRun> {
    let mut out = Vec::new();
    for p in phdrs.iter().filter(|p| p.is_exec()) {
        // Checked: a corrupt header may put a segment at the very top of the address space.
        let (Some(start), Some(end)) = (p.p_vaddr.checked_next_multiple_of(hp), p.p_vaddr.checked_add(p.p_filesz))
        else {
            continue;
        };
        let end = align_down(end, hp);
        if huge_placed(p, fixed, hp) && end > start {
            out.push(WindowRun { offset: p.p_offset + (start - p.p_vaddr), vaddr: start, len: end - start });
        }
    }
    out
}

/// Bytes of the address ranges `(start, end)` that lie inside the runs.
pub fn covered(runs: &[WindowRun], ranges: impl Iterator<Item = (u64, u64)>) -> u64 {
    ranges.map(|(a, b)| runs.iter().map(|r| b.min(r.vend()).saturating_sub(a.max(r.vaddr))).sum::<u64>()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testelf::load;

    const HP: u64 = 2 << 20;

    #[test]
    fn hugify_output_is_all_windows() {
        let ph = [load(4, 0, 0, 0x1000, 0x1000, HP), load(5, HP, HP, 3 * HP, 3 * HP, HP)];
        assert_eq!(huge_windows(&ph, false, HP), vec![WindowRun { offset: HP, vaddr: HP, len: 3 * HP }]);
    }

    #[test]
    fn small_alignment_places_a_pie_anywhere() {
        let ph = [load(5, 0x1000, 0x1000, 8 * HP, 8 * HP, 0x1000)];
        assert!(huge_windows(&ph, false, HP).is_empty());
        // The same segment of an ET_EXEC sits at its fixed address: inner windows count.
        let runs = huge_windows(&ph, true, HP);
        assert_eq!(runs, vec![WindowRun { offset: HP, vaddr: HP, len: 7 * HP }]);
    }

    #[test]
    fn offsets_must_be_congruent() {
        let ph = [load(5, 0x1000, 0x401000, 8 * HP, 8 * HP, 0x1000)];
        assert_eq!(huge_windows(&ph, true, HP)[0].offset, HP);
        let ph = [load(5, 0x2000, 0x401000, 8 * HP, 8 * HP, 0x1000)];
        assert!(huge_windows(&ph, true, HP).is_empty());
    }

    #[test]
    fn only_file_bytes_and_only_code() {
        // memsz beyond filesz is anonymous; a writable load is not code.
        let ph = [load(5, 0, 0, HP + 0x1000, 4 * HP, HP), load(6, 4 * HP, 4 * HP, 4 * HP, 4 * HP, HP)];
        assert_eq!(huge_windows(&ph, false, HP), vec![WindowRun { offset: 0, vaddr: 0, len: HP }]);
    }

    #[test]
    fn no_whole_window_no_run_and_no_overflow() {
        let ph = [load(5, 0x1000, 0x1000, HP, HP, HP)];
        assert!(huge_windows(&ph, false, HP).is_empty());
        let ph = [load(5, 0, u64::MAX - 10, 100, 100, HP)];
        assert!(huge_windows(&ph, false, HP).is_empty());
        // The start rounds up past the top of the address space (a fuzz finding).
        let ph = [load(5, 0, u64::MAX - 10, 5, 5, HP)];
        assert!(huge_windows(&ph, false, HP).is_empty());
    }

    #[test]
    fn coverage_counts_bytes_inside_runs() {
        let runs = [WindowRun { offset: HP, vaddr: HP, len: 2 * HP }];
        assert_eq!(covered(&runs, [(0, HP + 10), (3 * HP - 5, 4 * HP)].into_iter()), 15);
        assert_eq!(covered(&runs, [(4 * HP, 5 * HP)].into_iter()), 0);
    }
}
