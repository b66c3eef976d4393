//! Layout analysis: which architecture, what kind of file, how its segments and
//! sections are arranged, and where the split point lies.
//!
//! The split point S is the first allocated section after the loader metadata (ELF
//! and program headers, .interp, notes, hash tables, dynamic symbols and strings,
//! version tables, dynamic relocations). Code may hold pc-relative references to
//! anything from S on, so everything from S moves together.

use crate::arch::Arch;
use crate::elf::consts::*;
use crate::elf::names::{COMMENT, GOLD_VERSION_NOTE, INTERP};
use crate::elf::{Elf, Phdr, Shdr};
use crate::error::{Error, Reason, Result};

/// What kind of object the file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// ET_DYN with an interpreter: a position-independent executable.
    Pie,
    /// ET_DYN without an interpreter, flagged DF_1_PIE: a static-pie.
    StaticPie,
    /// ET_DYN library.
    SharedObject,
    /// ET_EXEC: fixed addresses, only alignment can change.
    Executable,
}

impl FileKind {
    /// Short name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            FileKind::Pie => "pie",
            FileKind::StaticPie => "static-pie",
            FileKind::SharedObject => "shared-object",
            FileKind::Executable => "executable",
        }
    }

    /// Whether the loader places the file's segments at their link-time addresses (an
    /// ET_EXEC): their huge-page windows line up whatever `p_align` asks for, and no
    /// address of the file may change, so only alignment can.
    pub fn fixed_addresses(self) -> bool {
        self == FileKind::Executable
    }
}

/// How the linker arranged the segments (names from the layout survey).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutClass {
    /// `R | RX | R | RW`: metadata alone in the first segment (GNU ld `-z separate-code`).
    SeparateCode,
    /// `RX | RW`: metadata, code and read-only data share the first segment
    /// (GNU ld `-z noseparate-code`, gold, aarch64, lld `--no-rosegment`).
    TextInFirst,
    /// `R | RX | RW…` with read-only data before the code (lld's default).
    RodataFirst,
    /// Anything else with one executable segment.
    Other,
}

impl LayoutClass {
    /// Short name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            LayoutClass::SeparateCode => "separate-code",
            LayoutClass::TextInFirst => "text-in-first",
            LayoutClass::RodataFirst => "rodata-first",
            LayoutClass::Other => "other",
        }
    }
}

/// Where a PT_LOAD lies relative to the split point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadPlace {
    /// Entirely before the split point: stays.
    Stays,
    /// Holds metadata before the split point and moved content after it.
    Split,
    /// Entirely at or after the split point: moves.
    Moves,
}

/// Everything the planner needs to know about the input.
pub struct Analysis {
    /// The target architecture.
    pub arch: Arch,
    /// The page size the layout keeps loads congruent modulo and exposure is measured
    /// in ([`crate::exposure`]): the largest power of two up to `page_limit` modulo
    /// which every load of the file is congruent (a file linked for 4 KiB pages runs
    /// on no kernel with larger ones), at least the architecture's smallest page.
    pub page: u64,
    /// The largest page size the file is to run with: the policy's, or the largest its
    /// architecture's distribution kernels use ([`Arch::max_page`]).
    pub page_limit: u64,
    /// PIE, static-pie, DSO or executable.
    pub kind: FileKind,
    /// The layout class.
    pub layout: LayoutClass,
    /// The linker, when the file says (from `.comment` or gold's note).
    pub linker: Option<String>,
    /// PT_LOAD headers sorted by address.
    pub loads: Vec<Phdr>,
    /// Where each load lies relative to the split point.
    pub places: Vec<LoadPlace>,
    /// Index (in `loads`) of the executable segment.
    pub exec: usize,
    /// The split point S (first non-metadata section address).
    pub split: u64,
    /// Name of the section at S.
    pub split_section: String,
    /// First address that moves: S, or the start of the segment holding S when
    /// nothing of that segment lies before S.
    pub move_start: u64,
    /// One past the highest loaded address (the inclusive upper bound of what moves).
    pub image_end: u64,
    /// Bytes of executable sections.
    pub code_bytes: u64,
    /// Whether each section (by index) moves with the code.
    pub section_moves: Vec<bool>,
}

impl Analysis {
    /// The executable PT_LOAD.
    pub fn exec_load(&self) -> &Phdr {
        &self.loads[self.exec]
    }

    /// The code sections ([`Shdr::is_code`]).
    pub fn exec_sections<'e>(&self, elf: &'e Elf) -> impl Iterator<Item = &'e Shdr> {
        elf.shdrs.iter().filter(|s| s.is_code())
    }
}

/// Whether an allocated section is loader metadata that stays at its address.
pub fn is_loader_metadata(s: &Shdr) -> bool {
    matches!(
        s.sh_type,
        SHT_NOTE
            | SHT_HASH
            | SHT_GNU_HASH
            | SHT_DYNSYM
            | SHT_STRTAB
            | SHT_GNU_VERDEF
            | SHT_GNU_VERNEED
            | SHT_GNU_VERSYM
            | SHT_REL
            | SHT_RELA
            | SHT_RELR
            | SHT_GNU_LIBLIST
    ) || s.name == INTERP
}

fn refused(reason: Reason, detail: impl Into<String>) -> Error {
    Error::new(reason, detail)
}

/// The largest power of two from `min` up to `limit` modulo which every load's file
/// offset is congruent to its address (what a kernel with pages of that size can
/// map); `min` where none is.
pub fn congruent_page(loads: &[Phdr], min: u64, limit: u64) -> u64 {
    let mut page = min;
    while page < limit && loads.iter().all(|l| l.p_offset % (page * 2) == l.p_vaddr % (page * 2)) {
        page *= 2;
    }
    page
}

/// Analyses a parsed file for the architecture's largest page size.
pub fn analyse(elf: &Elf) -> Result<Analysis> {
    analyse_for(elf, 0)
}

/// Analyses a parsed file to run with pages of up to `page_size` bytes (0: the
/// largest its architecture's distribution kernels use). Fails for files the
/// rewriter does not handle at all.
pub fn analyse_for(elf: &Elf, page_size: u64) -> Result<Analysis> {
    let arch = Arch::for_file(elf)?;
    let kind = file_kind(elf)?;
    if elf.shdrs.is_empty() {
        return Err(refused(Reason::NoSectionHeaders, "the file has no section headers"));
    }
    let loads = sorted_loads(elf)?;
    let execs: Vec<usize> = (0..loads.len()).filter(|&i| loads[i].is_exec()).collect();
    let exec = match execs.as_slice() {
        [] => return Err(refused(Reason::NoExecSegment, "no PT_LOAD segment is executable")),
        [one] => *one,
        _ => {
            return Err(refused(
                Reason::MultipleExecSegments,
                format!("{} PT_LOAD segments are executable", execs.len()),
            ))
        }
    };
    check_sections_in_loads(elf, &loads)?;
    check_headers_in_loads(elf, &loads)?;

    let mut alloc: Vec<&Shdr> =
        elf.shdrs.iter().filter(|s| s.is_alloc() && s.sh_size > 0 && !detached_tls_bss(elf, &loads, s)).collect();
    alloc.sort_by_key(|s| (s.sh_addr, s.index));
    let first = alloc
        .iter()
        .find(|s| !is_loader_metadata(s))
        .ok_or_else(|| refused(Reason::UnsupportedLayout, "every allocated section is loader metadata"))?;
    let split = first.sh_addr;

    let mut places = Vec::with_capacity(loads.len());
    for l in &loads {
        places.push(if l.vend() <= split {
            LoadPlace::Stays
        } else if l.p_vaddr >= split {
            LoadPlace::Moves
        } else {
            // The segment holds S. It must split only if something it carries lies
            // before S: a section, or the ELF/program headers at its file start.
            let holds_headers = l.p_offset == 0 || (elf.ehdr.e_phoff >= l.p_offset && elf.ehdr.e_phoff < l.fend());
            let holds_sections = alloc.iter().any(|s| s.sh_addr < split && s.sh_addr >= l.p_vaddr);
            if holds_headers || holds_sections {
                LoadPlace::Split
            } else {
                LoadPlace::Moves
            }
        });
    }
    let move_start = match places.iter().position(|p| *p != LoadPlace::Stays) {
        Some(i) if places[i] == LoadPlace::Moves => loads[i].p_vaddr.min(split),
        _ => split,
    };
    let image_end = loads.iter().map(Phdr::vend).max().unwrap_or(0);

    let section_moves = elf
        .shdrs
        .iter()
        .map(|s| {
            s.is_alloc()
                && (s.sh_addr > move_start || (s.sh_addr == move_start && (s.sh_size > 0 || !is_loader_metadata(s))))
        })
        .collect();
    let code_bytes = elf.shdrs.iter().filter(|s| s.is_code()).map(|s| s.sh_size).sum();
    let layout = classify(&loads, exec, &alloc, split);
    let page_limit = if page_size == 0 { arch.max_page } else { page_size.max(arch.min_page) };
    Ok(Analysis {
        arch,
        page: congruent_page(&loads, arch.min_page, page_limit),
        page_limit,
        kind,
        layout,
        linker: linker_name(elf),
        loads,
        places,
        exec,
        split,
        split_section: first.name.clone(),
        move_start,
        image_end,
        code_bytes,
        section_moves,
    })
}

pub(crate) fn file_kind(elf: &Elf) -> Result<FileKind> {
    let has_interp = elf.phdrs.iter().any(|p| p.p_type == PT_INTERP);
    match elf.ehdr.e_type {
        ET_EXEC => Ok(FileKind::Executable),
        ET_DYN if has_interp => Ok(FileKind::Pie),
        ET_DYN => {
            let pie_flag = elf.dynamic()?.iter().any(|(_, d)| d.tag == DT_FLAGS_1 && d.val & DF_1_PIE != 0);
            Ok(if pie_flag { FileKind::StaticPie } else { FileKind::SharedObject })
        }
        ET_REL => Err(refused(Reason::UnsupportedType, "relocatable object files (ET_REL) are not linked yet")),
        ET_CORE => Err(refused(Reason::UnsupportedType, "core dumps (ET_CORE) are not programs")),
        t => Err(refused(Reason::UnsupportedType, format!("ELF type {t} is not an executable or shared object"))),
    }
}

fn sorted_loads(elf: &Elf) -> Result<Vec<Phdr>> {
    let loads: Vec<Phdr> = elf.loads().copied().collect();
    if loads.is_empty() {
        return Err(refused(Reason::NoExecSegment, "the file has no PT_LOAD segments"));
    }
    // Beyond what any user address space holds, a segment is corrupt (and its end
    // could overflow the arithmetic of the plans).
    let limit = if elf.class.is64 { 1u64 << 56 } else { 1u64 << 32 };
    for p in &loads {
        let end = p.p_vaddr.checked_add(p.p_memsz).filter(|&e| e <= limit);
        if end.is_none() || p.p_align > limit {
            return Err(Error::new(
                Reason::BadSegments,
                format!("PT_LOAD at {:#x} of {:#x} bytes lies beyond the address space", p.p_vaddr, p.p_memsz),
            ));
        }
    }
    for w in loads.windows(2) {
        if w[1].p_vaddr < w[0].vend() {
            return Err(refused(
                Reason::UnsupportedLayout,
                format!(
                    "PT_LOAD segments at {:#x} and {:#x} are out of address order or overlap",
                    w[0].p_vaddr, w[1].p_vaddr
                ),
            ));
        }
        if w[1].p_filesz > 0 && w[0].p_filesz > 0 && w[1].p_offset < w[0].fend() {
            return Err(refused(
                Reason::UnsupportedLayout,
                format!(
                    "PT_LOAD segments at file offsets {:#x} and {:#x} are out of file order or overlap",
                    w[0].p_offset, w[1].p_offset
                ),
            ));
        }
    }
    Ok(loads)
}

/// A .tbss that only a PT_TLS without an initial image describes, outside every
/// load: Go's internal linker puts it at address 0. Nothing maps or moves it.
fn detached_tls_bss(elf: &Elf, loads: &[Phdr], s: &Shdr) -> bool {
    s.is_tls_bss()
        && elf.phdrs.iter().any(|p| p.p_type == PT_TLS && p.p_filesz == 0 && s.sh_addr == p.p_vaddr)
        && !loads.iter().any(|l| s.sh_addr >= l.p_vaddr && s.sh_addr <= l.vend())
}

/// Every allocated section must lie inside one PT_LOAD, at the file offset that
/// segment maps it from; otherwise moving segments would tear sections apart.
fn check_sections_in_loads(elf: &Elf, loads: &[Phdr]) -> Result<()> {
    for s in elf.shdrs.iter().filter(|s| s.is_alloc() && s.sh_size > 0) {
        // .tbss occupies no address space of its own: only its start must be inside.
        if detached_tls_bss(elf, loads, s) {
            continue;
        }
        let tls_bss = s.is_tls_bss();
        let inside =
            |l: &&Phdr| s.sh_addr >= l.p_vaddr && if tls_bss { s.sh_addr <= l.vend() } else { s.vend() <= l.vend() };
        let Some(l) = loads.iter().find(inside) else {
            return Err(refused(
                Reason::UnsupportedLayout,
                format!("allocated section {} ({}) at {:#x} is not inside any PT_LOAD", s.index, s.name, s.sh_addr),
            ));
        };
        if s.has_file_data() && s.sh_offset.wrapping_sub(l.p_offset) != s.sh_addr - l.p_vaddr {
            return Err(Error::new(
                Reason::BadSections,
                format!(
                    "section {} ({}) is at file offset {:#x}, but its segment maps it from {:#x}",
                    s.index,
                    s.name,
                    s.sh_offset,
                    s.sh_addr - l.p_vaddr + l.p_offset
                ),
            ));
        }
        if s.has_file_data() && s.sh_addr + s.sh_size > l.p_vaddr + l.p_filesz {
            return Err(Error::new(
                Reason::BadSections,
                format!("section {} ({}) has file data beyond its segment's p_filesz", s.index, s.name),
            ));
        }
    }
    Ok(())
}

/// Program headers that describe loaded memory must lie inside a PT_LOAD, at the
/// offset that load maps them from. (A TLS template's .tbss part needs no space; lld
/// rounds PT_GNU_RELRO's memory size up to a page, past the end of its load.)
fn check_headers_in_loads(elf: &Elf, loads: &[Phdr]) -> Result<()> {
    for p in &elf.phdrs {
        let size = match p.p_type {
            PT_TLS | PT_GNU_RELRO => p.p_filesz,
            PT_DYNAMIC | PT_GNU_EH_FRAME | PT_PHDR | PT_INTERP | PT_NOTE => p.p_memsz,
            _ => continue,
        };
        if size == 0 {
            continue;
        }
        let end = p.p_vaddr.checked_add(size);
        let inside = loads.iter().find(|l| p.p_vaddr >= l.p_vaddr && end.is_some_and(|e| e <= l.vend()));
        let consistent =
            inside.is_some_and(|l| p.p_filesz == 0 || p.p_offset.wrapping_sub(l.p_offset) == p.p_vaddr - l.p_vaddr);
        if !consistent {
            return Err(Error::new(
                Reason::BadSegments,
                format!(
                    "segment of type {:#x} at {:#x} is not inside a PT_LOAD at a consistent offset",
                    p.p_type, p.p_vaddr
                ),
            ));
        }
    }
    Ok(())
}

fn classify(loads: &[Phdr], exec: usize, alloc: &[&Shdr], split: u64) -> LayoutClass {
    if exec == 0 {
        return LayoutClass::TextInFirst;
    }
    let x = &loads[exec];
    let before_code_non_meta = alloc.iter().any(|s| s.sh_addr < x.p_vaddr && s.sh_addr >= split);
    if before_code_non_meta {
        LayoutClass::RodataFirst
    } else if exec == 1 && loads[0].vend() <= split {
        LayoutClass::SeparateCode
    } else {
        LayoutClass::Other
    }
}

fn linker_name(elf: &Elf) -> Option<String> {
    if elf.section(GOLD_VERSION_NOTE).is_some() {
        return Some("gold".into());
    }
    let comment = elf.section(COMMENT).filter(|s| !s.is_alloc())?;
    let text = String::from_utf8_lossy(elf.section_data(comment)).into_owned();
    text.split('\0').find(|t| t.starts_with("Linker: ")).map(|t| t["Linker: ".len()..].trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testelf::{Arrangement, Dso};

    fn moving(elf: &Elf, an: &Analysis) -> Vec<String> {
        elf.shdrs.iter().filter(|s| an.section_moves[s.index]).map(|s| s.name.clone()).collect()
    }

    #[test]
    fn separate_code_splits_at_the_code() {
        let built = Dso::new(Arrangement::SeparateCode, 0x3000).build();
        let elf = Elf::parse(&built.data).unwrap();
        let an = analyse(&elf).unwrap();
        assert_eq!((an.layout, an.kind), (LayoutClass::SeparateCode, FileKind::SharedObject));
        assert_eq!((an.split, an.split_section.as_str()), (built.addr(".text"), ".text"));
        use LoadPlace::*;
        assert_eq!((an.places.as_slice(), an.exec), ([Stays, Moves, Moves, Moves].as_slice(), 1));
        assert_eq!(an.move_start, built.addr(".text"));
        assert_eq!(an.code_bytes, 0x3000);
        let moved = [".text", ".rodata", ".eh_frame_hdr", ".eh_frame", ".dynamic", ".got", ".data"];
        assert_eq!(moving(&elf, &an), moved);
    }

    #[test]
    fn text_in_first_splits_its_first_load() {
        let built = Dso::new(Arrangement::TextInFirst, 0x3000).build();
        let elf = Elf::parse(&built.data).unwrap();
        let an = analyse(&elf).unwrap();
        assert_eq!(an.layout, LayoutClass::TextInFirst);
        assert_eq!((an.split, an.split_section.as_str()), (built.addr(".text"), ".text"));
        assert_eq!((an.places.as_slice(), an.exec), ([LoadPlace::Split, LoadPlace::Moves].as_slice(), 0));
        assert!(!moving(&elf, &an).contains(&".rela.dyn".to_owned()));
    }

    #[test]
    fn rodata_first_splits_before_the_code() {
        let built = Dso::new(Arrangement::RodataFirst, 0x3000).build();
        let elf = Elf::parse(&built.data).unwrap();
        let an = analyse(&elf).unwrap();
        assert_eq!(an.layout, LayoutClass::RodataFirst);
        assert_eq!((an.split, an.split_section.as_str()), (built.addr(".rodata"), ".rodata"));
        assert_eq!(an.places, [LoadPlace::Split, LoadPlace::Moves, LoadPlace::Moves]);
        assert_eq!(an.exec, 1);
    }

    #[test]
    fn the_executable_load_is_a_pt_load_with_pf_x() {
        use crate::testelf::load;
        assert!(load(PF_R | PF_X, 0x1000, 0x1000, 0x10, 0x10, 0x1000).is_exec());
        assert!(!load(PF_R | PF_W, 0x1000, 0x1000, 0x10, 0x10, 0x1000).is_exec());
        // PF_X on PT_GNU_STACK asks for an executable stack; it maps no code.
        let stack = Phdr { p_type: PT_GNU_STACK, ..load(PF_R | PF_W | PF_X, 0, 0, 0, 0, 16) };
        assert!(!stack.is_exec());
    }

    #[test]
    fn only_an_et_exec_has_fixed_addresses() {
        use crate::testelf::{Seg, TestElf};
        let code = [Seg::code(0x1000, 0x401000, 0x3000)];
        let kind = |data: &[u8]| file_kind(&Elf::parse(data).unwrap()).unwrap();
        assert!(kind(&TestElf::exec(&code).build()).fixed_addresses());
        assert!(!kind(&TestElf::pie(&code).build()).fixed_addresses());
        let dso = Dso::new(Arrangement::SeparateCode, 0x3000).build().data;
        assert!(!kind(&dso).fixed_addresses());
    }

    /// Sets the flags of program header `i`.
    fn set_flags(data: &mut [u8], i: usize, flags: u32) {
        let at = 64 + 56 * i + 4;
        data[at..at + 4].copy_from_slice(&flags.to_le_bytes());
    }

    #[test]
    fn files_it_cannot_handle_give_their_reason() {
        let base = Dso::new(Arrangement::SeparateCode, 0x3000).build().data;
        let reason = |data: &[u8]| analyse(&Elf::parse(data).unwrap()).err().expect("refused").reason;

        let mut two = base.clone();
        set_flags(&mut two, 2, PF_R | PF_X);
        assert_eq!(reason(&two), Reason::MultipleExecSegments);

        let mut none = base.clone();
        set_flags(&mut none, 1, PF_R);
        assert_eq!(reason(&none), Reason::NoExecSegment);

        let mut headerless = base.clone();
        headerless[40..48].fill(0); // e_shoff
        headerless[60..64].fill(0); // e_shnum, e_shstrndx
        assert_eq!(reason(&headerless), Reason::NoSectionHeaders);

        let mut exec = base.clone();
        exec[16] = ET_REL as u8;
        assert_eq!(reason(&exec), Reason::UnsupportedType);
    }

    #[test]
    fn a_section_off_its_segment_offset_is_bad() {
        let mut built = Dso::new(Arrangement::SeparateCode, 0x3000).build();
        let elf = Elf::parse(&built.data).unwrap();
        let rodata = elf.section(".rodata").unwrap().index as u64;
        let at = (elf.ehdr.e_shoff + 64 * rodata + 24) as usize; // sh_offset
        drop(elf);
        let off = u64::from_le_bytes(built.data[at..at + 8].try_into().unwrap());
        built.data[at..at + 8].copy_from_slice(&(off + 8).to_le_bytes());
        let e = analyse(&Elf::parse(&built.data).unwrap()).err().expect("refused");
        assert_eq!(e.reason, Reason::BadSections, "{e}");
        assert!(e.detail.contains(".rodata"), "{e}");
    }
}
