//! Assembles the output: the plan's loadable content, the non-loaded tail
//! (non-allocated sections and the section header table) laid out after it, the new
//! program and section headers, and the ELF header fields that point at them.
//!
//! The trap padding gets section headers of its own (`.hugify.pad`), so that strip,
//! objcopy and eu-elflint see every byte of the executable segment as belonging to a
//! section and keep it.

use crate::dwarf::Replacement;
use crate::elf::consts::*;
use crate::elf::{align_up, Elf, Phdr, Shdr};
use crate::error::{Error, Reason, Result};
use crate::layout::Analysis;
use crate::output::{Output, Piece, Source};
use crate::patch::Patches;
use crate::plan::{map_offset, Plan};

/// Name of the sections covering trap padding.
pub const PAD_SECTION: &str = ".hugify.pad";

/// The largest alignment of a section that is not loaded and has to be placed anew.
const MAX_TAIL_ALIGN: u64 = 1 << 16;

/// Builds the output of `plan`, applying `patches` (input-offset edits) and giving
/// non-allocated sections in `replacements` their new contents (and sizes).
pub fn assemble(
    elf: &Elf,
    an: &Analysis,
    plan: &Plan,
    mut patches: Patches,
    mut replacements: Vec<Replacement>,
) -> Result<Output> {
    let class = elf.class;
    let mut pieces: Vec<Piece> =
        plan.copies.iter().map(|c| Piece { dst: c.dst, len: c.len, src: Source::Input(c.src) }).collect();
    pieces.extend(plan.traps.iter().map(|&(dst, len)| Piece { dst, len, src: Source::Trap(an.arch.trap) }));

    // Padding sections, and the names they need in .shstrtab.
    let exec = plan.phdrs.iter().find(|p| p.is_exec()).expect("plans keep the code");
    let shstrndx = elf.ehdr.shstrndx as usize;
    let old_names = elf.section_data(&elf.shdrs[shstrndx]);
    let mut names = None;
    let mut pads = Vec::new();
    for &(off, len) in plan.traps.iter().filter(|t| t.1 > 0) {
        let name = *names.get_or_insert(old_names.len() as u32);
        pads.push(Shdr {
            index: elf.shdrs.len() + pads.len(),
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
        });
    }

    if names.is_some() {
        let mut grown = old_names.to_vec();
        grown.extend_from_slice(PAD_SECTION.as_bytes());
        grown.push(0);
        replacements.push(Replacement { index: shstrndx, data: grown });
    }
    let mut replaced: Vec<Option<Vec<u8>>> = vec![None; elf.shdrs.len()];
    for r in replacements {
        if elf.shdrs[r.index].is_alloc() || replaced[r.index].is_some() {
            return Err(Error::new(Reason::Internal, format!("section {} replaced twice or allocated", r.index)));
        }
        replaced[r.index] = Some(r.data);
    }

    // The tail: non-allocated sections that no copy carries (or that get new
    // contents), in file order.
    let in_copies = |s: &Shdr| {
        s.has_file_data()
            && map_offset(&plan.copies, s.sh_offset).is_some()
            && map_offset(&plan.copies, s.fend() - 1).is_some()
    };
    let mut tail: Vec<&Shdr> =
        elf.shdrs[1..].iter().filter(|s| !s.is_alloc() && (!in_copies(s) || replaced[s.index].is_some())).collect();
    tail.sort_by_key(|s| (s.sh_offset, s.index));
    let mut new_offset = vec![None; elf.shdrs.len()];
    let mut new_size = vec![None; elf.shdrs.len()];
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
        new_offset[s.index] = Some(dst);
        let (src, len) = match replaced[s.index].take() {
            Some(data) => {
                new_size[s.index] = Some(data.len() as u64);
                let len = data.len() as u64;
                (Source::Owned(data), len)
            }
            None if s.has_file_data() => (Source::Input(s.sh_offset), s.sh_size),
            None => (Source::Input(s.sh_offset), 0),
        };
        pieces.push(Piece { dst, len, src });
        cursor = dst + len;
    }

    // New section headers.
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
            None => map_offset(&plan.copies, s.sh_offset).unwrap_or(cursor),
        };
        if let Some(size) = new_size[s.index] {
            n.sh_size = size;
        }
        shdrs.push(n);
    }
    shdrs.extend(pads);
    let shnum = shdrs.len() as u64;
    let extended_shnum = shnum >= u64::from(SHN_LORESERVE);
    let extended_strndx = shstrndx as u64 >= u64::from(SHN_LORESERVE);
    if extended_shnum {
        shdrs[0].sh_size = shnum;
    }
    if extended_strndx {
        shdrs[0].sh_link = shstrndx as u32;
    }
    let shoff = align_up(cursor, class.word());
    let table: Vec<u8> = shdrs.iter().flat_map(|s| class.encode_shdr(s)).collect();
    pieces.push(Piece { dst: shoff, len: table.len() as u64, src: Source::Owned(table) });

    // Program headers: patched in place when the count is unchanged, else written whole.
    let phdr_bytes: Vec<u8> = plan.phdrs.iter().flat_map(|p| class.encode_phdr(p)).collect();
    match plan.phdr_table {
        Some((off, _)) => pieces.push(Piece { dst: off, len: phdr_bytes.len() as u64, src: Source::Owned(phdr_bytes) }),
        None => {
            if plan.phdrs.len() != elf.phdrs.len() {
                return Err(Error::new(Reason::Internal, "program header count changed without a relocated table"));
            }
            patch_changed(&mut patches, elf, elf.ehdr.e_phoff, &phdr_bytes, class.word());
        }
    }

    // ELF header.
    let f = class.ehdr_fields();
    let mut ehdr = elf.data[..class.ehdr_size() as usize].to_vec();
    let put_word = |e: &mut Vec<u8>, at: u64, v: u64| {
        let b = class.word_bytes(v);
        e[at as usize..at as usize + b.len()].copy_from_slice(&b);
    };
    put_word(&mut ehdr, f.entry, plan.map.map(elf.ehdr.e_entry));
    put_word(&mut ehdr, f.shoff, shoff);
    if let Some((off, _)) = plan.phdr_table {
        put_word(&mut ehdr, f.phoff, off);
    }
    let phnum = plan.phdrs.len() as u64;
    if phnum >= u64::from(PN_XNUM) {
        return Err(Error::new(Reason::UnsupportedLayout, "too many program headers"));
    }
    ehdr[f.phnum as usize..f.phnum as usize + 2].copy_from_slice(&(phnum as u16).to_le_bytes());
    let shnum_field = if extended_shnum { 0 } else { shnum as u16 };
    ehdr[f.shnum as usize..f.shnum as usize + 2].copy_from_slice(&shnum_field.to_le_bytes());
    let strndx_field = if extended_strndx { SHN_XINDEX } else { shstrndx as u16 };
    ehdr[f.shstrndx as usize..f.shstrndx as usize + 2].copy_from_slice(&strndx_field.to_le_bytes());
    patch_changed(&mut patches, elf, 0, &ehdr, 2);

    Output::new(pieces, patches.into_sorted()?, plan.map)
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
    use crate::testelf::{run, Arrangement, Dso};
    use crate::ModeChoice;

    const HP: u64 = 2 << 20;

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
