//! Assembles the output: the plan's loadable content, the non-loaded tail
//! (non-allocated sections and the section header table) laid out after it, the new
//! program and section headers, and the ELF header fields that point at them.
//!
//! The trap padding gets section headers of its own (`.hugify.pad`), so that strip,
//! objcopy and eu-elflint see every byte of the executable segment as belonging to a
//! section and keep it.

use crate::dwarf::Replacement;
use crate::elf::consts::*;
use crate::elf::names::PAD_SECTION;
use crate::elf::{align_up, Elf, Phdr, Shdr};
use crate::error::{Error, Reason, Result};
use crate::layout::Analysis;
use crate::output::{Output, Piece, Source};
use crate::patch::Patches;
use crate::plan::{map_offset, Plan};

/// The largest alignment of a section that is not loaded and has to be placed anew.
const MAX_TAIL_ALIGN: u64 = 1 << 16;

/// A non-allocated section placed after the loadable content: its index, output
/// offset and bytes.
pub type TailPlacement = (usize, u64, u64);

/// Where everything of a plan's output goes, before any byte is written: the
/// sizing pass behind a plan's summary, and what [`assemble`] then fills in.
pub struct Layout {
    /// Non-allocated sections placed after the loadable content, in file order.
    pub tail: Vec<TailPlacement>,
    /// The output's section headers, the trap padding's (`.hugify.pad`) last.
    pub shdrs: Vec<Shdr>,
    /// Output offset of the section header table.
    pub shoff: u64,
    /// Output file size.
    pub size: u64,
}

/// Lays out the output of `plan` whose non-allocated sections by index in
/// `new_sizes` get new contents of that many bytes. [`Layout::size`] is the size
/// [`assemble`] gives the output with replacements of those sizes.
pub fn lay_out(elf: &Elf, an: &Analysis, plan: &Plan, new_sizes: &[Option<u64>]) -> Result<Layout> {
    let pads = pad_sections(elf, plan);
    let mut new_sizes = new_sizes.to_vec();
    if !pads.is_empty() {
        let shstrndx = elf.ehdr.shstrndx as usize;
        if elf.shdrs[shstrndx].is_alloc() || new_sizes[shstrndx].is_some() {
            return Err(replaced_twice(shstrndx));
        }
        new_sizes[shstrndx] = Some(padded_names_size(elf));
    }
    let (tail, tail_end) = tail_layout(elf, plan, &new_sizes)?;
    let shdrs = section_headers(elf, an, plan, &tail, tail_end, &new_sizes, pads)?;
    let class = elf.class;
    let shoff = align_up(tail_end, class.word());
    if plan.phdr_table.is_none() && plan.phdrs.len() != elf.phdrs.len() {
        return Err(Error::new(Reason::Internal, "program header count changed without a relocated table"));
    }
    if plan.phdrs.len() as u64 >= u64::from(PN_XNUM) {
        return Err(Error::new(Reason::UnsupportedLayout, "too many program headers"));
    }
    // The output ends where its last piece does (the pieces do not overlap).
    let phdr_table = plan.phdr_table.map(|(off, _)| (off, plan.phdrs.len() as u64 * class.phdr_size()));
    let size = plan
        .copies
        .iter()
        .map(|c| (c.dst, c.len))
        .chain(plan.traps.iter().copied())
        .chain(tail.iter().map(|&(_, dst, len)| (dst, len)))
        .chain(phdr_table)
        .chain([(shoff, shdrs.len() as u64 * class.shdr_size())])
        .filter(|&(_, len)| len > 0)
        .map(|(dst, len)| dst + len)
        .max()
        .unwrap_or(0);
    Ok(Layout { tail, shdrs, shoff, size })
}

/// Builds the output of `plan`, applying `patches` (input-offset edits) and giving
/// non-allocated sections in `replacements` their new contents (and sizes).
pub fn assemble(
    elf: &Elf,
    an: &Analysis,
    plan: &Plan,
    mut patches: Patches,
    replacements: Vec<Replacement>,
) -> Result<Output> {
    let class = elf.class;
    let mut replaced: Vec<Option<Vec<u8>>> = vec![None; elf.shdrs.len()];
    for r in replacements {
        if elf.shdrs[r.index].is_alloc() || replaced[r.index].is_some() {
            return Err(replaced_twice(r.index));
        }
        replaced[r.index] = Some(r.data);
    }
    let new_sizes: Vec<Option<u64>> = replaced.iter().map(|r| r.as_ref().map(|d| d.len() as u64)).collect();
    let layout = lay_out(elf, an, plan, &new_sizes)?;
    if layout.shdrs.len() > elf.shdrs.len() {
        replaced[elf.ehdr.shstrndx as usize] = Some(padded_names(elf));
    }

    let mut pieces: Vec<Piece> =
        plan.copies.iter().map(|c| Piece { dst: c.dst, len: c.len, src: Source::Input(c.src) }).collect();
    pieces.extend(plan.traps.iter().map(|&(dst, len)| Piece { dst, len, src: Source::Trap(an.arch.trap) }));
    for &(index, dst, len) in &layout.tail {
        let src = match replaced[index].take() {
            Some(data) => Source::Owned(data),
            None => Source::Input(elf.shdrs[index].sh_offset),
        };
        pieces.push(Piece { dst, len, src });
    }
    let table: Vec<u8> = layout.shdrs.iter().flat_map(|s| class.encode_shdr(s)).collect();
    pieces.push(Piece { dst: layout.shoff, len: table.len() as u64, src: Source::Owned(table) });

    // Program headers: patched in place when the count is unchanged, else written whole.
    let phdr_bytes: Vec<u8> = plan.phdrs.iter().flat_map(|p| class.encode_phdr(p)).collect();
    match plan.phdr_table {
        Some((off, _)) => pieces.push(Piece { dst: off, len: phdr_bytes.len() as u64, src: Source::Owned(phdr_bytes) }),
        None => patch_changed(&mut patches, elf, elf.ehdr.e_phoff, &phdr_bytes, class.word()),
    }
    let ehdr = elf_header(elf, plan, &layout);
    patch_changed(&mut patches, elf, 0, &ehdr, 2);
    Output::new(pieces, patches.into_sorted()?, plan.map)
}

fn replaced_twice(index: usize) -> Error {
    Error::new(Reason::Internal, format!("section {index} replaced twice or allocated"))
}

/// Section headers for the trap padding, so that strip and objcopy keep its bytes.
fn pad_sections(elf: &Elf, plan: &Plan) -> Vec<Shdr> {
    let Some(exec) = plan.phdrs.iter().find(|p| p.is_exec()) else { return Vec::new() };
    let name = elf.section_data(&elf.shdrs[elf.ehdr.shstrndx as usize]).len() as u32;
    plan.traps
        .iter()
        .filter(|t| t.1 > 0)
        .enumerate()
        .map(|(i, &(off, len))| Shdr {
            index: elf.shdrs.len() + i,
            name: PAD_SECTION.into(),
            sh_name: name,
            sh_type: SHT_PROGBITS,
            sh_flags: SHF_ALLOC | SHF_EXECINSTR,
            sh_addr: exec.p_vaddr + (off - exec.p_offset),
            sh_offset: off,
            sh_size: len,
            sh_link: 0,
            sh_info: 0,
            sh_addralign: 1,
            sh_entsize: 0,
        })
        .collect()
}

/// `.shstrtab` with the padding sections' name appended.
fn padded_names(elf: &Elf) -> Vec<u8> {
    let mut grown = elf.section_data(&elf.shdrs[elf.ehdr.shstrndx as usize]).to_vec();
    grown.extend_from_slice(PAD_SECTION.as_bytes());
    grown.push(0);
    grown
}

fn padded_names_size(elf: &Elf) -> u64 {
    elf.section_data(&elf.shdrs[elf.ehdr.shstrndx as usize]).len() as u64 + PAD_SECTION.len() as u64 + 1
}

/// The tail: non-allocated sections that no copy carries (or that get new contents,
/// `new_sizes`), in file order from the plan's `tail_start`, each at its alignment.
/// Returns them (index, output offset, bytes) and where the last one ends.
fn tail_layout(elf: &Elf, plan: &Plan, new_sizes: &[Option<u64>]) -> Result<(Vec<TailPlacement>, u64)> {
    let in_copies = |s: &Shdr| {
        s.has_file_data()
            && map_offset(&plan.copies, s.sh_offset).is_some()
            && map_offset(&plan.copies, s.fend() - 1).is_some()
    };
    let mut tail: Vec<&Shdr> =
        elf.shdrs[1..].iter().filter(|s| !s.is_alloc() && (!in_copies(s) || new_sizes[s.index].is_some())).collect();
    tail.sort_by_key(|s| (s.sh_offset, s.index));
    let mut placed = Vec::with_capacity(tail.len());
    let mut cursor = plan.tail_start;
    for s in tail {
        // Real files align what is not loaded to a few bytes; a huge alignment would only
        // pad the output with holes (and a file built in memory with gigabytes).
        if s.sh_addralign > MAX_TAIL_ALIGN {
            return Err(Error::new(
                Reason::UnsupportedLayout,
                format!("section {} ({}) is not loaded but aligned to {:#x}", s.index, s.name, s.sh_addralign),
            ));
        }
        let dst = align_up(cursor, s.sh_addralign);
        let len = match new_sizes[s.index] {
            Some(size) => size,
            None if s.has_file_data() => s.sh_size,
            None => 0,
        };
        placed.push((s.index, dst, len));
        cursor = dst + len;
    }
    Ok((placed, cursor))
}

/// The output's section headers: moved addresses, offsets through the copies or the
/// tail, new sizes, the padding sections last, and the extended-numbering fields of
/// header 0 where the counts need them.
fn section_headers(
    elf: &Elf,
    an: &Analysis,
    plan: &Plan,
    tail: &[TailPlacement],
    tail_end: u64,
    new_sizes: &[Option<u64>],
    pads: Vec<Shdr>,
) -> Result<Vec<Shdr>> {
    let mut new_offset = vec![None; elf.shdrs.len()];
    for &(index, dst, _) in tail {
        new_offset[index] = Some(dst);
    }
    let mut shdrs = Vec::with_capacity(elf.shdrs.len() + pads.len());
    for s in &elf.shdrs {
        let mut n = s.clone();
        if s.index == 0 {
            shdrs.push(n);
            continue;
        }
        if an.section_moves[s.index] || (s.is_alloc() && plan.map.relocated.holds(s.sh_addr)) {
            n.sh_addr = plan.map.map(s.sh_addr);
        }
        n.sh_offset = match new_offset[s.index] {
            Some(o) => o,
            None if s.has_file_data() => map_offset(&plan.copies, s.sh_offset).ok_or_else(|| {
                Error::new(Reason::Internal, format!("section {} ({}) lands nowhere in the output", s.index, s.name))
            })?,
            None if s.is_alloc() => offset_in_loads(&plan.phdrs, n.sh_addr).unwrap_or(s.sh_offset),
            None => map_offset(&plan.copies, s.sh_offset).unwrap_or(tail_end),
        };
        if let Some(size) = new_sizes[s.index].filter(|_| new_offset[s.index].is_some()) {
            n.sh_size = size;
        }
        shdrs.push(n);
    }
    shdrs.extend(pads);
    let shnum = shdrs.len() as u64;
    if shnum >= u64::from(SHN_LORESERVE) {
        shdrs[0].sh_size = shnum;
    }
    let shstrndx = elf.ehdr.shstrndx as usize;
    if shstrndx as u64 >= u64::from(SHN_LORESERVE) {
        shdrs[0].sh_link = shstrndx as u32;
    }
    Ok(shdrs)
}

/// The output's ELF header: entry point through the address map, the tables' new
/// offsets and counts (extended numbering past SHN_LORESERVE).
fn elf_header(elf: &Elf, plan: &Plan, layout: &Layout) -> Vec<u8> {
    let class = elf.class;
    let f = class.ehdr_fields();
    let mut ehdr = elf.data[..class.ehdr_size() as usize].to_vec();
    let put_word = |e: &mut Vec<u8>, at: u64, v: u64| {
        let b = class.word_bytes(v);
        e[at as usize..at as usize + b.len()].copy_from_slice(&b);
    };
    put_word(&mut ehdr, f.entry, plan.map.map(elf.ehdr.e_entry));
    put_word(&mut ehdr, f.shoff, layout.shoff);
    if let Some((off, _)) = plan.phdr_table {
        put_word(&mut ehdr, f.phoff, off);
    }
    let put_half = |e: &mut Vec<u8>, at: u64, v: u16| e[at as usize..at as usize + 2].copy_from_slice(&v.to_le_bytes());
    // lay_out refused counts past PN_XNUM.
    put_half(&mut ehdr, f.phnum, plan.phdrs.len() as u16);
    let shnum = layout.shdrs.len() as u64;
    put_half(&mut ehdr, f.shnum, if shnum >= u64::from(SHN_LORESERVE) { 0 } else { shnum as u16 });
    let shstrndx = elf.ehdr.shstrndx;
    put_half(&mut ehdr, f.shstrndx, if shstrndx >= u64::from(SHN_LORESERVE) { SHN_XINDEX } else { shstrndx as u16 });
    ehdr
}

/// Adds edits for the chunks of `new` that differ from the input at `at`.
fn patch_changed(patches: &mut Patches, elf: &Elf, at: u64, new: &[u8], chunk: u64) {
    let old = &elf.data[at as usize..at as usize + new.len()];
    for (i, (o, n)) in old.chunks(chunk as usize).zip(new.chunks(chunk as usize)).enumerate() {
        if o != n {
            patches.put(at + i as u64 * chunk, n);
        }
    }
}

/// The file offset at which a load maps `vaddr` (also for addresses past p_filesz).
fn offset_in_loads(phdrs: &[Phdr], vaddr: u64) -> Option<u64> {
    phdrs
        .iter()
        .filter(|l| l.p_type == PT_LOAD)
        .find(|l| vaddr >= l.p_vaddr && vaddr <= l.vend())
        .map(|l| l.p_offset + (vaddr - l.p_vaddr))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr_map::AddrMap;
    use crate::layout::analyse;
    use crate::plan::Placement;
    use crate::testelf::{load, run, write, Arrangement, Dso, Sec};
    use crate::ModeChoice;

    const HP: u64 = 2 << 20;

    /// A hand-made file: one R+X load of 0x2000 bytes at 0 holding .text
    /// (0x1000..0x1100, the entry 0x10 into it), then, not loaded, .comment (5 bytes
    /// at 0x2000), .debug_x (0x10 bytes, 8-aligned: at 0x2008) and .shstrtab ("\0"
    /// and four names: 1 + 6 + 9 + 9 + 10 = 0x23 bytes at 0x2018); headers at 0x2040.
    fn small() -> Vec<u8> {
        let code = SHF_ALLOC | SHF_EXECINSTR;
        let text = Sec {
            addr: 0x1000,
            offset: Some(0x1000),
            align: 16,
            ..Sec::new(".text", SHT_PROGBITS, code, vec![0x90; 0x100])
        };
        let comment = Sec::new(".comment", SHT_PROGBITS, 0, b"abcd\0".to_vec());
        let debug = Sec { align: 8, ..Sec::new(".debug_x", SHT_PROGBITS, 0, vec![1; 0x10]) };
        write(ET_DYN, 0x1010, &[load(PF_R | PF_X, 0, 0, 0x2000, 0x2000, 0x1000)], vec![text, comment, debug])
    }

    /// A plan for [`small`] with the given copies, traps, address map, loads and tail
    /// start (the rest, which assembling does not read, from an alignment-only plan of
    /// another file: no table relocated).
    fn hand_plan(
        copies: Vec<Placement>,
        traps: Vec<(u64, u64)>,
        map: AddrMap,
        phdrs: Vec<Phdr>,
        tail_start: u64,
    ) -> Plan {
        let other = Dso::new(Arrangement::RodataFirst, 0x30000).build().data;
        let elf = Elf::parse(&other).unwrap();
        let mut p = crate::plan::candidates(&elf, &analyse(&elf).unwrap(), 0x10000, 0).align.unwrap();
        assert_eq!(p.phdr_table, None);
        p.copies = copies;
        p.traps = traps;
        p.map = map;
        p.phdrs = phdrs;
        p.tail_start = tail_start;
        p
    }

    /// .text moved by 2 MiB into a window of its own: trap padding before it (a page)
    /// and after it (0xf00 bytes), the tail from 0x202000.
    fn moved_plan(elf: &Elf) -> Plan {
        let copies =
            vec![Placement { src: 0, len: 0x1000, dst: 0 }, Placement { src: 0x1000, len: 0x100, dst: 0x20_1000 }];
        let window = load(PF_R | PF_X, 0x20_0000, 0x20_0000, 0x2000, 0x2000, HP);
        let traps = vec![(0x20_0000, 0x1000), (0x20_1100, 0xf00)];
        hand_plan(copies, traps, AddrMap::shift(0x1000, 0x2000, 0x20_0000), vec![window; elf.phdrs.len()], 0x20_2000)
    }

    #[test]
    fn the_tail_takes_unloaded_sections_in_file_order_at_their_alignment() {
        let data = small();
        let elf = Elf::parse(&data).unwrap();
        let plan = |tail_start| {
            hand_plan(
                vec![Placement { src: 0, len: 0x2000, dst: 0 }],
                Vec::new(),
                AddrMap::default(),
                elf.phdrs.clone(),
                tail_start,
            )
        };
        let none = vec![None; elf.shdrs.len()];
        // From where they were, they stay where they were.
        let (tail, end) = tail_layout(&elf, &plan(0x2000), &none).unwrap();
        assert_eq!((tail, end), (vec![(2, 0x2000, 5), (3, 0x2008, 0x10), (4, 0x2018, 0x23)], 0x203b));
        // From an odd offset .debug_x keeps its 8-byte alignment; a new size moves what follows.
        let mut sizes = none.clone();
        sizes[3] = Some(0x30);
        let (tail, end) = tail_layout(&elf, &plan(0x20_0001), &sizes).unwrap();
        assert_eq!((tail, end), (vec![(2, 0x20_0001, 5), (3, 0x20_0008, 0x30), (4, 0x20_0038, 0x23)], 0x20_005b));
        // A section a copy carries is no part of the tail, unless it gets new contents.
        let carried = hand_plan(
            vec![Placement { src: 0, len: 0x2008, dst: 0 }],
            Vec::new(),
            AddrMap::default(),
            elf.phdrs.clone(),
            0x2008,
        );
        assert_eq!(tail_layout(&elf, &carried, &none).unwrap().0, [(3, 0x2008, 0x10), (4, 0x2018, 0x23)]);
        sizes[3] = None;
        sizes[2] = Some(7);
        assert_eq!(
            tail_layout(&elf, &carried, &sizes).unwrap().0,
            [(2, 0x2008, 7), (3, 0x2010, 0x10), (4, 0x2020, 0x23)]
        );
    }

    #[test]
    fn section_headers_follow_the_copies_the_map_and_the_tail() {
        let data = small();
        let elf = Elf::parse(&data).unwrap();
        let an = analyse(&elf).unwrap();
        let l = lay_out(&elf, &an, &moved_plan(&elf), &vec![None; elf.shdrs.len()]).unwrap();
        // .shstrtab grows by ".hugify.pad\0" (12 bytes) to 0x2f; the tail runs from
        // 0x202000: .comment, .debug_x at 0x202008, .shstrtab at 0x202018 to 0x202047.
        let got: Vec<(&str, u64, u64, u64)> =
            l.shdrs.iter().map(|s| (s.name.as_str(), s.sh_addr, s.sh_offset, s.sh_size)).collect();
        assert_eq!(
            got[1..],
            [
                (".text", 0x20_1000, 0x20_1000, 0x100),
                (".comment", 0, 0x20_2000, 5),
                (".debug_x", 0, 0x20_2008, 0x10),
                (".shstrtab", 0, 0x20_2018, 0x2f),
                (PAD_SECTION, 0x20_0000, 0x20_0000, 0x1000),
                (PAD_SECTION, 0x20_1100, 0x20_1100, 0xf00),
            ]
        );
        // The padding's name is appended at the end of the old names.
        assert!(l.shdrs[5..].iter().all(|s| s.sh_name == 0x23 && s.sh_flags == SHF_ALLOC | SHF_EXECINSTR));
        assert_eq!((l.shdrs[0].sh_size, l.shdrs[0].sh_link), (0, 0));
        // The table is 8-aligned after the tail: 7 headers of 64 bytes end the file.
        assert_eq!((l.shoff, l.size), (0x20_2048, 0x20_2048 + 7 * 64));
    }

    #[test]
    fn the_elf_header_points_at_the_new_tables_and_entry() {
        let data = small();
        let elf = Elf::parse(&data).unwrap();
        let an = analyse(&elf).unwrap();
        let plan = moved_plan(&elf);
        let l = lay_out(&elf, &an, &plan, &vec![None; elf.shdrs.len()]).unwrap();
        let e = elf_header(&elf, &plan, &l);
        let half = |at: usize| u16::from_le_bytes(e[at..at + 2].try_into().unwrap());
        let word = |at: usize| u64::from_le_bytes(e[at..at + 8].try_into().unwrap());
        // e_entry 0x1010 moves by 2 MiB; e_phoff stays (no table relocated).
        assert_eq!((word(24), word(32), word(40)), (0x20_1010, 64, 0x20_2048));
        assert_eq!((half(56), half(60), half(62)), (1, 7, 4));
        assert_eq!(e[..24], data[..24]);
    }

    #[test]
    fn assemble_writes_the_layout_the_sizing_pass_gives() {
        let data = small();
        let elf = Elf::parse(&data).unwrap();
        let an = analyse(&elf).unwrap();
        let out = assemble(&elf, &an, &moved_plan(&elf), Patches::default(), Vec::new()).unwrap().to_vec(&data);
        assert_eq!(out.len() as u64, 0x20_2048 + 7 * 64);
        assert_eq!(out[0x20_1000..0x20_1100], data[0x1000..0x1100]);
        assert!(out[0x20_0000..0x20_1000].iter().chain(&out[0x20_1100..0x20_2000]).all(|&b| b == 0xcc));
        assert_eq!(&out[0x20_2000..0x20_2005], b"abcd\0");
        assert_eq!(&out[0x20_2018 + 0x23..0x20_2047], b".hugify.pad\0");
        let new = Elf::parse(&out).unwrap();
        assert_eq!(new.section(".debug_x").map(|s| new.section_data(s)), Some(&[1u8; 0x10][..]));
        // A replaced section's new size moves what follows it, in the layout as in the file.
        let replaced = vec![Replacement { index: 3, data: vec![2; 0x30] }];
        let mut sizes = vec![None; elf.shdrs.len()];
        sizes[3] = Some(0x30);
        let sized = lay_out(&elf, &an, &moved_plan(&elf), &sizes).unwrap().size;
        let out = assemble(&elf, &an, &moved_plan(&elf), Patches::default(), replaced).unwrap();
        assert_eq!((sized, out.size), (0x20_2068 + 7 * 64, 0x20_2068 + 7 * 64));
    }

    #[test]
    fn shift_pads_the_code_window_with_traps() {
        // Code that ends short of a page: padding before and after it.
        let (built, t, out) = run(&Dso::new(Arrangement::SeparateCode, 0x2ff0), ModeChoice::Shift, HP);
        let new = Elf::parse(&out).unwrap();
        let execs: Vec<&Phdr> = new.loads().filter(|p| p.is_exec()).collect();
        let [x] = execs.as_slice() else { panic!("{execs:?}") };
        assert_eq!((x.p_offset % HP, x.p_vaddr % HP, x.p_filesz), (0, 0, HP));
        let text = new.section(".text").unwrap();
        assert_eq!(text.sh_addr, built.addr(".text") + t.summary().dv);
        assert_eq!(new.section_data(text), &built.data[0x1000..0x3ff0]);
        let window = &out[x.p_offset as usize..x.fend() as usize];
        let code = (text.sh_offset - x.p_offset) as usize..(text.fend() - x.p_offset) as usize;
        assert!(window[..code.start].iter().chain(&window[code.end..]).all(|&b| b == 0xcc));
        // Both paddings are sections, so strip and objcopy keep them.
        let pads: Vec<(u64, u64)> =
            new.shdrs.iter().filter(|s| s.name == PAD_SECTION).map(|s| (s.sh_offset, s.fend())).collect();
        assert_eq!(pads, [(x.p_offset, text.sh_offset), (text.fend(), x.fend())]);
        assert!(new.shdrs.iter().all(|s| s.name != PAD_SECTION || s.sh_flags == SHF_ALLOC | SHF_EXECINSTR));
        assert_eq!(new.ehdr.shnum, Elf::parse(&built.data).unwrap().ehdr.shnum + 2);
        assert_eq!(new.ehdr.e_entry, built.addr(".text") + t.summary().dv);
        assert_eq!(t.output.size, out.len() as u64);
    }

    /// The grown table is where it was, at e_phoff in front of every section, and the
    /// metadata that made room for it (the build-id note and .dynsym of the test file)
    /// lies behind what stays with its bytes, its headers and .dynamic's pointer.
    fn assert_table_grew_in_place(old: &Elf, new: &Elf, stays_until: &str) {
        assert_eq!((new.ehdr.e_phoff, new.ehdr.phnum), (old.ehdr.e_phoff, old.ehdr.phnum + 1));
        let table_end = new.ehdr.e_phoff + new.ehdr.phnum * 56;
        let first = *new.loads().next().unwrap();
        assert_eq!(first.p_flags, PF_R);
        let in_first: Vec<&Shdr> = new.shdrs.iter().filter(|s| s.is_alloc() && s.fend() <= first.fend()).collect();
        assert!(in_first.iter().all(|s| s.sh_offset >= table_end), "{in_first:x?}");
        let last_staying = old.section(stays_until).unwrap();
        for name in [crate::testelf::NOTE, ".dynsym"] {
            let (o, n) = (old.section(name).unwrap(), new.section(name).unwrap());
            assert!(n.sh_offset >= last_staying.fend() && n.fend() <= first.fend(), "{name}");
            assert_eq!(n.sh_addr - n.sh_offset, first.p_vaddr - first.p_offset, "{name}");
            assert_eq!((n.sh_offset - o.sh_offset) % o.sh_addralign, 0, "{name}");
            if name == ".dynsym" {
                // Its symbols (whose values the repair moves) are read from there.
                let names = |e: &Elf, s: &Shdr| -> Vec<String> {
                    e.symbols(s).unwrap().iter().map(|(_, y)| e.symbol_name(s, y).unwrap_or("").to_owned()).collect()
                };
                assert_eq!((n.sh_size, names(new, n)), (o.sh_size, names(old, o)));
                let symtab = new.dynamic().unwrap().iter().find(|(_, d)| d.tag == DT_SYMTAB).unwrap().1.val;
                assert_eq!(symtab, n.sh_addr);
            }
        }
        let note = new.phdrs.iter().find(|p| p.p_type == PT_NOTE).unwrap();
        let n = new.section(crate::testelf::NOTE).unwrap();
        assert_eq!((note.p_offset, note.p_vaddr, note.p_filesz), (n.sh_offset, n.sh_addr, n.sh_size));
        assert_eq!(crate::elf::notes::build_id(new).unwrap().map(|b| b.1.len()), Some(20));
        // What did not need to move stays, bytes and all.
        let (o, n) = (old.section(".dynstr").unwrap(), new.section(".dynstr").unwrap());
        assert_eq!((n.sh_offset, n.sh_addr, new.section_data(n)), (o.sh_offset, o.sh_addr, old.section_data(o)));
    }

    #[test]
    fn a_split_first_load_grows_its_header_table_in_place() {
        let (built, mut t, out) = run(&Dso::new(Arrangement::TextInFirst, 0x3000), ModeChoice::Shift, HP);
        crate::verify(&built.data, &out, &mut t).unwrap();
        let (old, new) = (Elf::parse(&built.data).unwrap(), Elf::parse(&out).unwrap());
        let loads: Vec<&Phdr> = new.loads().collect();
        assert_eq!(loads.iter().map(|l| l.p_flags).collect::<Vec<_>>(), [PF_R, PF_R | PF_X, PF_R | PF_W]);
        assert_table_grew_in_place(&old, &new, ".rela.dyn");
        assert_eq!(&out[..64][..16], &built.data[..16]);
    }

    #[test]
    fn a_rodata_first_shift_keeps_the_read_only_data_and_grows_the_table_in_place() {
        // The code's first window fits in the page gap below the code: no data shares it.
        for code in [0x1ff000, 0x5ff000] {
            let (built, mut t, out) = run(&Dso::new(Arrangement::RodataFirst, code), ModeChoice::Shift, HP);
            crate::verify(&built.data, &out, &mut t).unwrap();
            assert_eq!(t.summary().exposed, 0);
            let (old, new) = (Elf::parse(&built.data).unwrap(), Elf::parse(&out).unwrap());
            let dv = t.summary().dv;
            for name in [".rodata", ".text"] {
                let (o, n) = (old.section(name).unwrap(), new.section(name).unwrap());
                assert_eq!((n.sh_addr, new.section_data(n)), (o.sh_addr + dv, old.section_data(o)), "{name}");
            }
            assert_eq!(t.summary().covered_code, code);
            assert_table_grew_in_place(&old, &new, ".rela.dyn");
        }
    }

    #[test]
    fn align_only_pads_file_offsets() {
        let hp = 0x10000;
        let (built, t, out) = run(&Dso::new(Arrangement::RodataFirst, 0x30000), ModeChoice::Align, hp);
        let (old, new) = (Elf::parse(&built.data).unwrap(), Elf::parse(&out).unwrap());
        assert_eq!(new.ehdr.shnum, old.ehdr.shnum, "no trap padding in align mode");
        for (o, n) in old.shdrs.iter().zip(&new.shdrs) {
            assert_eq!((o.sh_addr, o.sh_size), (n.sh_addr, n.sh_size), "{}", o.name);
            if o.is_alloc() && o.sh_offset >= old.phdrs[1].p_offset {
                assert_eq!(n.sh_offset, o.sh_offset + t.summary().df, "{}", o.name);
            }
            if o.name != crate::testelf::NOTE {
                assert_eq!(new.section_data(n), old.section_data(o), "{}", o.name);
            }
        }
    }
}
