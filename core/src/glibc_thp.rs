//! What glibc's loader does for a file by itself when the tunable `glibc.elf.thp` is
//! set (glibc 2.44: per process in `GLIBC_TUNABLES`, system-wide in
//! `/etc/tunables.conf` after `ldconfig`), and how much of the kernel's read-ahead the
//! file's layout tolerates before that comes to nothing.
//!
//! ld.so calls `madvise(MADV_HUGEPAGE)` on every read-only (not writable) PT_LOAD of at
//! least one huge page whose address and file offset are both huge-page aligned, for the
//! main program (mapped by the kernel) and for every object it maps itself, DT_NEEDED or
//! `dlopen` (glibc's `_dl_executable_postprocess` and `_dl_segment_thp_eligible`). A
//! cold fault in such a mapping then reads the whole window as one 2 MiB folio — unless
//! some of the window's pages are in the page cache already, which makes the kernel map
//! it with small pages. What puts them there before the code runs:
//! - the ELF header, read with read() by the kernel (the program) or ld.so (a library)
//!   with a few pages of readahead: a window at offset 0 never comes cold;
//! - faults in the loads before the windows, beyond that first page (ld.so reads
//!   `.dynsym`, `.rela.dyn`, ...): each miss reads `read_ahead_kb` around the fault
//!   (mm/filemap.c, `do_sync_mmap_readahead`), and a page marked for readahead that
//!   ld.so then touches reads as much again beyond (`page_cache_async_ra`, asked for the
//!   whole `read_ahead_kb`): the cache fills up to their end plus twice the read-ahead;
//! - the first fault in a writable load after them: the zeroing of the partial page
//!   before its `.bss` (the kernel's, or ld.so's right after mapping it), else the first
//!   access (relocations, `.dynamic`), at its start: half the read-ahead before it.
//!
//! So the windows come cold only while all of these stop short of them. Measured with
//! Debian's glibc 2.44 on Linux 6.18 (XFS): a program whose `.bss` page lies 400 KiB
//! after its last window got it huge up to `read_ahead_kb` 800 and not from 832; one
//! whose writable load follows the windows directly lost its last window at 128.

use crate::elf::consts::{PF_R, PF_W, PT_LOAD};
use crate::elf::{align_down, align_up, Phdr};
use crate::windows::WindowRun;

/// The base page the loader maps with and the kernel reads in (4 KiB: x86-64, where
/// glibc 2.44 advises without asking the kernel, and 4 KiB-page aarch64).
const PAGE: u64 = 4096;

/// What ld.so with `glibc.elf.thp=1` does for one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlibcThp {
    /// Bytes of the file's whole huge-page windows that lie in loads ld.so advises.
    pub advised: u64,
    /// Of them, bytes that never come cold: the window holding the ELF header.
    pub header: u64,
    /// The largest read-ahead (bytes, a multiple of the base page) up to which the
    /// kernel's reads for the faults in the file's other loads at start-up cannot reach
    /// the other advised windows; 0 when none avoids it. None when nothing read at
    /// start-up can reach them, or there are none.
    pub read_ahead_limit: Option<u64>,
}

/// Whether ld.so advises this load: read-only (not writable), at least one huge page
/// long, its address and its file offset huge-page aligned (the rules for the
/// kernel-mapped main program and for the objects ld.so maps agree on such a load).
pub fn advised(p: &Phdr, hp: u64) -> bool {
    let mapped = p.p_memsz.min(align_up(p.p_filesz, PAGE));
    p.p_type == PT_LOAD
        && p.p_flags & (PF_R | PF_W) == PF_R
        && mapped >= hp
        && p.p_vaddr % hp == 0
        && p.p_offset % hp == 0
}

/// The file's advised windows and the read-ahead its layout tolerates, for the whole
/// huge-page windows `windows` (windows::huge_windows) of the loads `phdrs`.
pub fn glibc_thp(phdrs: &[Phdr], windows: &[WindowRun], hp: u64) -> GlibcThp {
    let loads: Vec<&Phdr> = phdrs.iter().filter(|p| p.p_type == PT_LOAD && p.p_filesz > 0).collect();
    let mut runs: Vec<WindowRun> = windows
        .iter()
        .filter(|w| {
            loads.iter().any(|l| {
                advised(l, hp) && w.offset >= l.p_offset && w.offset + w.len <= l.fend() && w.vaddr >= l.p_vaddr
            })
        })
        .copied()
        .collect();
    let advised_bytes = runs.iter().map(|w| w.len).sum();
    // The window holding the ELF header is read with it: the rest of its run can come cold.
    let mut header = 0;
    for w in runs.iter_mut().filter(|w| w.offset == 0) {
        header = hp;
        *w = WindowRun { offset: hp, vaddr: w.vaddr + hp, len: w.len - hp };
    }
    runs.retain(|w| w.len > 0);
    let limit = runs.iter().map(|w| run_limit(&loads, w)).min().filter(|&l| l != u64::MAX);
    GlibcThp { advised: advised_bytes, header, read_ahead_limit: limit.map(|l| align_down(l, PAGE)) }
}

/// The read-ahead up to which nothing the kernel reads for the other loads at start-up
/// reaches the run `w` (u64::MAX: nothing does at any).
fn run_limit(loads: &[&Phdr], w: &WindowRun) -> u64 {
    let (start, end) = (w.offset, w.offset + w.len);
    if loads.iter().any(|l| l.p_offset < end && l.fend() > start && !(l.p_offset <= start && l.fend() >= end)) {
        return 0; // another load shares a window
    }
    // The file bytes of the other loads before the run (the advised load's own pages
    // fault into its advised mapping, which reads whole windows); the first page is
    // the ELF header's, read before anything faults, so nothing beyond it: no faults.
    let holds = |l: &&&Phdr| l.p_offset <= start && l.fend() >= end;
    let before =
        loads.iter().filter(|l| l.p_offset < start && !holds(l)).map(|l| align_up(l.fend().min(start), PAGE)).max();
    let front = match before {
        Some(b) if b > PAGE => (start - b) / 2,
        _ => u64::MAX,
    };
    let back = loads.iter().filter(|l| l.p_flags & PF_W != 0 && l.fend() > end).map(|l| writable_limit(l, end)).min();
    front.min(back.unwrap_or(u64::MAX))
}

/// The read-ahead up to which the faults in the writable load `l` at start-up read
/// nothing at or before `end`: its first is the zeroing of the page before its `.bss`
/// (when its file part ends inside a page), read around with half the read-ahead on
/// each side; what that misses of the load below, from its start on, reads around
/// itself.
fn writable_limit(l: &Phdr, end: u64) -> u64 {
    let first = align_down(l.p_offset, PAGE).saturating_sub(end);
    if l.p_memsz <= l.p_filesz || l.fend() % PAGE == 0 {
        return 2 * first;
    }
    let zeroed = align_down(l.fend() - 1, PAGE).saturating_sub(end);
    // Once the read-around of the zeroed page covers the load's start, nothing of the
    // load faults again before the code runs.
    let covered_from = 2 * (zeroed - first);
    if covered_from <= 2 * first {
        2 * zeroed
    } else {
        2 * first
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::consts::{PF_W, PF_X};
    use crate::testelf::load;
    use crate::windows::huge_windows;

    const HP: u64 = 2 << 20;
    const R: u32 = PF_R;
    const RX: u32 = PF_R | PF_X;
    const RW: u32 = PF_R | PF_W;

    fn of(ph: &[Phdr]) -> GlibcThp {
        glibc_thp(ph, &huge_windows(ph, false, HP), HP)
    }

    /// tests/fixtures gcc-bfd's program after `hugify transform` (GNU ld separate-code):
    /// the limit is its `.bss` page's, 400 KiB after the windows (the host measured the
    /// windows huge up to 800 KiB and not from 832).
    #[test]
    fn separate_code_shift_is_limited_by_its_writable_load() {
        let ph = [
            load(R, 0, 0, 0x11088, 0x11088, HP),
            load(RX, HP, HP, 2 * HP, 2 * HP, HP),
            load(R, 3 * HP, 3 * HP, 0x5dad8, 0x5dad8, HP),
            load(RW, 0x65e5f0, 0x65e5f0, 0x5a8e, 0x5af0, HP),
        ];
        let g = of(&ph);
        assert_eq!((g.advised, g.header), (2 * HP, 0));
        // front: (2 MiB - 72 KiB) / 2 = 988 KiB; back: its .bss page 0x664000, 2 * 400 KiB.
        assert_eq!(g.read_ahead_limit, Some(800 << 10));
        // Without .bss the first fault is at its start, 376 KiB after the windows.
        let mut no_bss = ph;
        no_bss[3].p_memsz = no_bss[3].p_filesz;
        assert_eq!(of(&no_bss).read_ahead_limit, Some(752 << 10));
    }

    /// gold, lld and `-z noseparate-code` outputs: the writable load follows the last
    /// window in the same page, so any read-ahead reaches it (measured: lost at 128).
    #[test]
    fn writable_load_right_after_the_windows_leaves_no_read_ahead() {
        let ph = [
            load(R, 0, 0, 0x11320, 0x11320, HP),
            load(RX, HP, HP, 2 * HP, 2 * HP, HP),
            load(RW, 0x6005e0, 0x6005e0, 0x5ab2, 0x5b28, HP),
        ];
        // Its .bss page is 24 KiB after the windows, and what that read misses of its start
        // (.dynamic, relocations) reads around the window's end itself.
        assert_eq!(of(&ph), GlibcThp { advised: 2 * HP, header: 0, read_ahead_limit: Some(0) });
    }

    /// The front: what lies mapped before the first window, whose end the kernel's
    /// read-ahead passes by up to twice the read-ahead.
    #[test]
    fn loads_before_the_windows_limit_by_half_their_distance() {
        let ph = [load(R, 0, 0, HP - 0x40000, HP - 0x40000, HP), load(RX, HP, HP, HP, HP, HP)];
        // 256 KiB away: 128 KiB.
        assert_eq!(of(&ph).read_ahead_limit, Some(0x20000));
        // Nothing writable after the windows: the front alone.
        let ph = [load(R, 0, 0, 0x3000, 0x3000, HP), load(RX, 4 * HP, 4 * HP, HP, HP, HP)];
        assert_eq!(of(&ph).read_ahead_limit, Some(align_down((4 * HP - 0x3000) / 2, PAGE)));
        // Only the ELF header's page before them: nothing there faults, no limit.
        let ph = [load(R, 0, 0, 0x548, 0x548, HP), load(RX, HP, HP, HP, HP, HP)];
        assert_eq!(of(&ph).read_ahead_limit, None);
    }

    /// A window holding the ELF header (align outputs of 2-LOAD and Go layouts, whose
    /// executable load starts at offset 0) is read into small folios with the header;
    /// the windows after it can come cold (measured: Debian's libLLVM-14 aligned, 47 of
    /// its 48 windows at 128).
    #[test]
    fn a_window_at_offset_zero_never_comes_cold() {
        let ph = [load(RX, 0, 0, 0x2935a0, 0x2935a0, HP), load(RW, 0x2935e0, 0x2945e0, 0x5ab2, 0x5b28, 0x1000)];
        assert_eq!(of(&ph), GlibcThp { advised: HP, header: HP, read_ahead_limit: None });
        // libLLVM-14.so.1 of Debian 12, aligned: 48 windows from offset 0, .bss page
        // 8.9 MiB after them.
        let ph = [load(RX, 0, 0, 0x6161880, 0x6161880, HP), load(RW, 0x61620a0, 0x61630a0, 0x77cde0, 0x7f6c49, 0x1000)];
        let g = of(&ph);
        assert_eq!((g.advised, g.header), (48 * HP, HP));
        assert_eq!(g.read_ahead_limit, Some(2 * (0x6162000 - 48 * HP)));
    }

    /// Not advised: an executable load starting inside a window (align outputs of
    /// separate-code files, lld layouts whose code keeps its first partial window,
    /// programs listed as is), a writable one, one shorter than a window.
    #[test]
    fn loads_ld_so_leaves_alone() {
        let mid = [load(R, 0, 0, 0x11000, 0x11000, HP), load(RX, 0x12000, 0x12000, 3 * HP, 3 * HP, HP)];
        assert_eq!(huge_windows(&mid, false, HP).len(), 1);
        assert_eq!(of(&mid), GlibcThp { advised: 0, header: 0, read_ahead_limit: None });
        assert!(!advised(&load(PF_R | PF_W | PF_X, HP, HP, HP, HP, HP), HP));
        assert!(!advised(&load(RX, HP, HP, HP - 0x1000, HP - 0x1000, HP), HP));
        assert!(advised(&load(R, HP, 3 * HP, HP, HP, HP), HP)); // read-only data too
        assert!(!advised(&load(R, HP + 0x1000, 3 * HP + 0x1000, HP, HP, HP), HP));
    }

    /// Go's PIE layout shifted: headers only before the windows, read-only data after
    /// them (advised too: not code), the writable loads 3.7 MiB further.
    #[test]
    fn go_shift_is_limited_by_its_front() {
        let ph = [
            load(R, 0, 0x400000, 0x12a0, 0x12a0, HP),
            load(RX, HP, 0x600000, 2 * HP, 2 * HP, HP),
            load(R, 3 * HP, 0xa00000, 0x3b21f0, 0x3b21f0, HP),
            load(RW, 0x9b3000, 0xdb3000, 0xc43a0, 0xc43a0, HP),
        ];
        let g = of(&ph);
        assert_eq!(g, GlibcThp { advised: 2 * HP, header: 0, read_ahead_limit: Some((HP - 0x2000) / 2) });
    }
}
