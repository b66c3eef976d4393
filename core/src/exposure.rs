//! The one rule for "which bytes become executable that were not": what the input
//! maps executable, what an output maps executable, and the difference, measured by
//! file byte ranges from the two files' own headers, never from a plan.
//!
//! **Executable in the input** are the file bytes of every executable PT_LOAD
//! (`[p_offset, p_offset + p_filesz)` of each `PF_X` load), and nothing else: what
//! the loader maps, not what section headers (which the loader never reads) claim. So
//! a GNU ld 2-LOAD or gold file's `.rodata` and `.eh_frame`, which its `R E` load maps
//! already, stay executable without exposing anything new; lld's `.rodata`,
//! `.eh_frame_hdr` and `.eh_frame`, which its `R` load maps, are not executable and
//! must not become so, nor a section outside every `PF_X` load that claims
//! `SHF_EXECINSTR`.
//!
//! **Executable in the output** is what the loader maps with `PROT_EXEC`: each
//! executable PT_LOAD's file bytes rounded out to whole pages (the kernel and ld.so
//! map pages, so the bytes that share the first and last page with the segment are
//! mapped too), except that bytes past `p_filesz` in the last page of a segment whose
//! `p_memsz` is larger are cleared by the loader. The pages are the largest the
//! output may run with: the largest its architecture's distribution kernels use
//! (64 KiB on aarch64: RHEL's `kernel-64k`, Ubuntu's `-64k`), or the policy's
//! `page_size`, as far as the file's loads are congruent modulo it
//! ([`crate::layout::Analysis::page`]).
//!
//! **Exposed** is every byte executable in the output that is not, by where it came
//! from, a byte executable in the input and not trap padding (each byte of
//! `.hugify.pad` the trap instruction's byte at its place, so that a pad starting
//! mid-word completes the input's last word with trap bytes). Where a byte came
//! from is read from the section headers: section `i` of the output holds section
//! `i` of the input (the rewriter keeps the section table and appends only its trap
//! padding, `.hugify.pad`), the ELF header and the program header table hold theirs;
//! a byte outside all of them (alignment gaps between sections) must be a trap or
//! equal the input byte at the same distance from the section before it, and that
//! input byte must be executable.

use crate::elf::names::PAD_SECTION;
use crate::elf::{align_down, align_up, Elf};

/// The name exposure reports give bytes that lie in no section (gaps between sections).
pub const OUTSIDE_SECTIONS: &str = "(bytes outside sections)";

/// What became executable: bytes in all, and per output section (in file order).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Exposure {
    /// Bytes newly executable.
    pub bytes: u64,
    /// Where they lie: a section's name, or a parenthesised description of bytes
    /// outside sections, with the bytes of each.
    pub sections: Vec<(String, u64)>,
}

impl Exposure {
    fn add(&mut self, name: &str, n: u64) {
        if n == 0 {
            return;
        }
        self.bytes += n;
        match self.sections.iter_mut().find(|(s, _)| s == name) {
            Some((_, b)) => *b += n,
            None => self.sections.push((name.to_owned(), n)),
        }
    }

    /// "N bytes (.rodata 12, .eh_frame 4)", for messages.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self.sections.iter().map(|(s, n)| format!("{s} {n}")).collect();
        format!("{} bytes ({})", self.bytes, parts.join(", "))
    }
}

/// Sorted, merged half-open ranges.
fn merged(mut r: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    r.retain(|(a, b)| b > a);
    r.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(r.len());
    for (a, b) in r {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// Bytes of `[a, b)` that lie in none of the merged `ranges`.
fn outside(ranges: &[(u64, u64)], a: u64, b: u64) -> u64 {
    let inside: u64 = ranges.iter().map(|&(x, y)| b.min(y).saturating_sub(a.max(x))).sum();
    (b - a) - inside
}

fn contains(ranges: &[(u64, u64)], at: u64) -> bool {
    ranges.iter().any(|&(x, y)| at >= x && at < y)
}

/// The input's executable file ranges (see the module documentation): what its
/// executable loads map, whatever its section headers say.
pub fn input_executable(elf: &Elf) -> Vec<(u64, u64)> {
    merged(elf.loads().filter(|p| p.is_exec()).map(|p| (p.p_offset, p.fend())).collect())
}

/// The file ranges the loader maps executable (see the module documentation), clipped
/// to the file.
pub fn mapped_executable(elf: &Elf, page: u64) -> Vec<(u64, u64)> {
    let size = elf.data.len() as u64;
    let ranges = elf.loads().filter(|p| p.is_exec() && p.p_filesz > 0).map(|p| {
        let end = if p.p_memsz > p.p_filesz { p.fend() } else { align_up(p.fend(), page) };
        (align_down(p.p_offset, page).min(size), end.min(size))
    });
    merged(ranges.collect())
}

/// Where a range of output bytes came from.
enum From {
    /// The input bytes at this offset, at the same distance.
    Input(u64),
    /// Trap padding.
    Trap,
    /// Nothing of the input: new bytes.
    New,
}

struct Origin {
    start: u64,
    end: u64,
    from: From,
    name: String,
}

fn origins(old: &Elf, new: &Elf) -> Vec<Origin> {
    let mut out = Vec::new();
    let ehdr = new.class.ehdr_size();
    out.push(Origin { start: 0, end: ehdr, from: From::Input(0), name: "(ELF header)".into() });
    let table = |e: &Elf| e.ehdr.phnum * e.class.phdr_size();
    let (old_table, new_table) = (table(old), table(new));
    let kept = old_table.min(new_table);
    let at = new.ehdr.e_phoff;
    out.push(Origin {
        start: at,
        end: at + kept,
        from: From::Input(old.ehdr.e_phoff),
        name: "(program headers)".into(),
    });
    out.push(Origin { start: at + kept, end: at + new_table, from: From::New, name: "(program headers)".into() });
    for (i, n) in new.shdrs.iter().enumerate().skip(1).filter(|(_, n)| n.has_file_data()) {
        let from = match old.shdrs.get(i) {
            Some(o) if o.has_file_data() && o.sh_size == n.sh_size => From::Input(o.sh_offset),
            None if n.name == PAD_SECTION => From::Trap,
            _ => From::New,
        };
        out.push(Origin { start: n.sh_offset, end: n.fend(), from, name: n.name.clone() });
    }
    let shoff = new.ehdr.e_shoff;
    let shtab = new.ehdr.shnum * new.class.shdr_size();
    out.push(Origin { start: shoff, end: shoff + shtab, from: From::New, name: "(section headers)".into() });
    out.retain(|o| o.end > o.start);
    out.sort_by_key(|o| (o.start, o.end));
    out
}

/// Whether the trap instruction unit holding output byte `at` lies inside `[a, b)`
/// and is a whole trap instruction.
fn trap_at(data: &[u8], trap: &[u8], at: u64, a: u64, b: u64) -> bool {
    let len = trap.len() as u64;
    let unit = at - at % len;
    unit >= a && unit + len <= b && data.get(unit as usize..(unit + len) as usize) == Some(trap)
}

/// Whether output byte `at` is the trap's byte at its place (traps repeat from offset 0).
fn trap_byte(data: &[u8], trap: &[u8], at: u64) -> bool {
    data.get(at as usize) == Some(&trap[(at % trap.len() as u64) as usize])
}

/// Measures what `new` (the output) maps executable that `old` (the input) did not.
/// `trap` is the architecture's trap instruction, `page` its smallest page size.
pub fn measure(old: &Elf, new: &Elf, trap: &[u8], page: u64) -> Exposure {
    let was = input_executable(old);
    let origins = origins(old, new);
    let mut exposure = Exposure::default();
    for (a, b) in mapped_executable(new, page) {
        let mut cursor = a;
        for (k, o) in origins.iter().enumerate().filter(|(_, o)| o.end > a && o.start < b) {
            if o.start > cursor {
                gap(old, new, &was, &origins[..k], trap, cursor, o.start, &mut exposure);
            }
            let (s, e) = (o.start.max(cursor), o.end.min(b));
            if e <= s {
                continue;
            }
            match o.from {
                From::Input(at) => {
                    let from = at + (s - o.start);
                    exposure.add(&o.name, outside(&was, from, from + (e - s)));
                }
                From::Trap => {
                    // Byte by byte, as the rewriter fills it (verify checks the same): a pad
                    // that starts or ends off an instruction boundary (the input's code load
                    // ending mid-word, after .gcc_except_table) shares its edge unit with the
                    // neighbour's bytes, which are measured as theirs.
                    let bad = (s..e).filter(|&i| !trap_byte(new.data, trap, i)).count();
                    exposure.add(&o.name, bad as u64);
                }
                From::New => exposure.add(&o.name, e - s),
            }
            cursor = e;
        }
        if b > cursor {
            gap(old, new, &was, &origins, trap, cursor, b, &mut exposure);
        }
    }
    exposure
}

/// Output bytes `[a, b)` that no section or header holds: traps, or copies of the
/// input bytes at the same distance from the last origin before them (the gaps a
/// linker leaves between sections move with the sections around them).
#[allow(clippy::too_many_arguments)]
fn gap(old: &Elf, new: &Elf, was: &[(u64, u64)], before: &[Origin], trap: &[u8], a: u64, b: u64, out: &mut Exposure) {
    let anchor = before.iter().rev().find_map(|o| match o.from {
        From::Input(at) if o.end <= a => Some((o.start, at)),
        _ => None,
    });
    let bad = (a..b)
        .filter(|&i| {
            if trap_at(new.data, trap, i, a, b) {
                return false;
            }
            let Some((out_at, in_at)) = anchor else { return true };
            let from = (i - out_at).checked_add(in_at);
            !from.is_some_and(|f| contains(was, f) && old.data.get(f as usize) == new.data.get(i as usize))
        })
        .count();
    out.add(OUTSIDE_SECTIONS, bad as u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_subtract() {
        let r = merged(vec![(10, 20), (0, 5), (15, 30), (40, 40)]);
        assert_eq!(r, [(0, 5), (10, 30)]);
        assert_eq!(outside(&r, 0, 40), 5 + 10);
        assert_eq!(outside(&r, 12, 18), 0);
    }

    #[test]
    fn a_pad_starting_mid_word_is_trap_padding() {
        // Debian's arm64 libstdc++: the code load ends mid-word (.gcc_except_table's
        // length is odd), so the trap padding after it starts mid-word too; its first
        // bytes complete that word with the trap's last bytes. A 4-byte trap filled
        // as the rewriter fills it, into a TextInFirst file whose load ends the same way.
        use crate::testelf::{run, Arrangement, Dso};
        let mut dso = Dso::new(Arrangement::TextInFirst, 0x3000);
        (dso.eh_frame, dso.rodata_size) = (false, 0x41);
        let (built, _, mut out) = run(&dso, crate::ModeChoice::Shift, 2 << 20);
        let old = Elf::parse(&built.data).unwrap();
        let pads: Vec<(u64, u64)> = Elf::parse(&out)
            .unwrap()
            .shdrs
            .iter()
            .filter(|s| s.name == PAD_SECTION)
            .map(|s| (s.sh_offset, s.sh_size))
            .collect();
        assert!(pads.iter().any(|&(at, _)| at % 4 != 0), "{pads:x?}");
        let brk: &[u8] = &[0x00, 0x00, 0x20, 0xd4];
        for &(at, len) in &pads {
            for i in at..at + len {
                out[i as usize] = brk[(i % 4) as usize];
            }
        }
        assert_eq!(measure(&old, &Elf::parse(&out).unwrap(), brk, 4096), Exposure::default());
        // Any other byte there is exposed, and only it.
        let (at, _) = pads.iter().find(|&&(at, _)| at % 4 != 0).unwrap();
        out[*at as usize] = 0x90;
        let exposed = measure(&old, &Elf::parse(&out).unwrap(), brk, 4096);
        assert_eq!(exposed.sections, [(PAD_SECTION.to_owned(), 1)]);
    }

    #[test]
    fn a_section_that_claims_to_be_code_is_not_executable_unless_a_pf_x_load_maps_it() {
        // lld's layout, 0x280000 bytes of code: the R load holds the metadata and then
        // .rodata (file 0x2c0-0x300), .eh_frame_hdr and .eh_frame (to 0x36c); the RX
        // load is .text alone, from file offset 0x1000 (address 0x2000). A .rodata whose
        // header claims SHF_EXECINSTR is still mapped by the R load: the input's
        // executable bytes are the RX load's, [0x1000, 0x1000 + 0x280000), and nothing
        // of .rodata may share the code's executable load in the output.
        use crate::elf::consts::SHF_EXECINSTR;
        use crate::testelf::{opts, Arrangement, Dso};
        let dso = Dso::new(Arrangement::RodataFirst, 0x28_0000);
        let mut data = dso.build().data;
        let rodata = Elf::parse(&data).unwrap().section(".rodata").unwrap().index as u64;
        let flags = (Elf::parse(&data).unwrap().ehdr.e_shoff + rodata * 64 + 8) as usize;
        data[flags] |= SHF_EXECINSTR as u8;
        let old = Elf::parse(&data).unwrap();
        assert_eq!((old.shdrs[rodata as usize].sh_offset, old.shdrs[rodata as usize].sh_size), (0x2c0, 0x40));
        assert_eq!(input_executable(&old), [(0x1000, 0x1000 + 0x28_0000)]);
        let (t, out) = crate::transform_to_vec(&data, &opts(crate::ModeChoice::Shift, 2 << 20)).unwrap();
        let new = Elf::parse(&out).unwrap();
        let (ro, x) = (&new.shdrs[rodata as usize], new.loads().find(|l| l.is_exec()).unwrap());
        assert!(ro.fend() <= align_down(x.p_offset, 4096), "{ro:x?} {x:x?}");
        assert_eq!((t.summary().exposed, measure(&old, &new, &[0xcc], 4096)), (0, Exposure::default()));
    }

    #[test]
    fn a_64k_kernel_maps_executable_what_shares_a_64k_page_with_the_code() {
        // An RX load 32 KiB into a 64 KiB page, below it 32 KiB of the R load (filled
        // with 0xcc, not the trap measured with): 4 KiB pages map the RX load's bytes
        // alone; 64 KiB pages the whole first 64 KiB of the file, the ELF header (64
        // bytes), the program headers (2 x 56) and the R load's rest included.
        use crate::testelf::{Seg, TestElf};
        let r = Seg::data(0, 0, 0x8000).align(0x10000);
        let data = TestElf::pie(&[r, Seg::code(0x8000, 0x1_8000, 0x8000).align(0x10000)]).build();
        let elf = Elf::parse(&data).unwrap();
        let brk: &[u8] = &[0x00, 0x00, 0x20, 0xd4];
        assert_eq!(mapped_executable(&elf, 0x1000), [(0x8000, 0x10000)]);
        assert_eq!(mapped_executable(&elf, 0x10000), [(0, 0x10000)]);
        assert_eq!(measure(&elf, &elf, brk, 0x1000), Exposure::default());
        let at_64k = measure(&elf, &elf, brk, 0x10000);
        assert_eq!(at_64k.bytes, 0x8000);
        let want = [("(ELF header)", 64), ("(program headers)", 112), (OUTSIDE_SECTIONS, 0x8000 - 176)];
        assert_eq!(at_64k.sections, want.map(|(n, b)| (n.to_owned(), b)));
    }

    #[test]
    fn aarch64_files_are_measured_and_laid_out_in_64k_pages_as_far_as_their_loads_allow() {
        // GNU ld and lld lay aarch64 loads out for 64 KiB pages: such a file runs under
        // RHEL's kernel-64k, and is measured and shifted in 64 KiB pages unless the
        // policy says 16 KiB (or 4 KiB); one linked for 4 KiB pages runs on no such
        // kernel and is measured in 4 KiB; x86-64 has 4 KiB pages only.
        use crate::elf::consts::EM_AARCH64;
        use crate::layout::analyse_for;
        use crate::testelf::{opts, Arrangement, Dso};
        let aarch64 = |page| {
            // lld's arrangement: each load after the first one page above its offset.
            let mut dso = Dso::new(Arrangement::RodataFirst, 0x28_0000);
            (dso.machine, dso.page) = (EM_AARCH64, page);
            dso.build().data
        };
        let (linked_64k, linked_4k) = (aarch64(0x10000), aarch64(0x1000));
        let x86 = Dso::new(Arrangement::RodataFirst, 0x28_0000).build().data;
        let page = |data: &[u8], limit| {
            let an = analyse_for(&Elf::parse(data).unwrap(), limit).unwrap();
            (an.page, an.page_limit)
        };
        assert_eq!(page(&linked_64k, 0), (0x10000, 0x10000));
        assert_eq!(page(&linked_64k, 0x4000), (0x4000, 0x4000));
        assert_eq!(page(&linked_4k, 0), (0x1000, 0x10000));
        assert_eq!(page(&x86, 0), (0x1000, 0x1000));
        let (t, out) = crate::transform_to_vec(&linked_64k, &opts(crate::ModeChoice::Shift, 2 << 20)).unwrap();
        assert_eq!((t.report.page_size, t.report.page, t.summary().exposed), (0x10000, 0x10000, 0));
        let new = Elf::parse(&out).unwrap();
        assert!(new.loads().all(|l| l.p_offset % 0x10000 == l.p_vaddr % 0x10000), "{:x?}", new.phdrs);
    }
}
