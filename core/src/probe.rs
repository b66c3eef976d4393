//! What every layer needs to know about a file, read from its headers without
//! planning: cheap enough to run on every file of a build root, and the only place
//! the Python layers and the runtime learn a file's architecture, kind, symbol
//! table, build-id and huge-page windows from. A file is probed once: its windows for
//! any huge-page size come from the loads it read ([`Probe::windows`]).

use crate::arch::ArchName;
use crate::elf::consts::*;
use crate::elf::{notes, Elf, Phdr};
use crate::error::{Error, Reason};
use crate::glibc_thp::{glibc_thp, GlibcThp};
use crate::layout::{file_kind, FileKind};
use crate::windows::{huge_windows, WindowRun};

/// How much of the code is on whole huge-page windows as the file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HugeState {
    /// Every file byte of the executable loads lies in whole windows: hugify's
    /// output, or a file linked that way.
    Whole,
    /// Some whole windows: usable as is, a rewrite could cover more.
    Partial,
    /// No whole window at a congruent offset.
    None,
}

impl HugeState {
    /// Short name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            HugeState::Whole => "whole",
            HugeState::Partial => "partial",
            HugeState::None => "none",
        }
    }
}

/// The header facts of an ELF executable or shared object.
#[derive(Clone, Debug)]
pub struct Probe {
    /// The architecture, if hugify has a name for it.
    pub arch: Option<&'static ArchName>,
    /// Whether the file is ELFCLASS64.
    pub is64: bool,
    /// PIE, static-pie, shared object or executable; None if the file is too damaged to tell.
    pub kind: Option<FileKind>,
    /// Whether a `.symtab` exists; None if the section table could not be read.
    pub has_symtab: Option<bool>,
    /// The GNU build-id.
    pub build_id: Option<Vec<u8>>,
    /// The PT_LOAD headers, in table order (empty if the program headers could not be read).
    pub loads: Vec<Phdr>,
    /// Whether the loader puts the loads at their link-time addresses (ET_EXEC).
    pub fixed: bool,
    /// Why the rest could not be read (the file is damaged or in a format the
    /// rewriter does not read, e.g. big-endian).
    pub problem: Option<Error>,
}

/// A probed file's huge-page facts for one huge-page size ([`Probe::windows`]).
#[derive(Clone, Debug)]
pub struct Windows {
    /// The huge-page size the windows are for.
    pub huge_page: u64,
    /// The whole huge-page windows at congruent offsets ([`huge_windows`]).
    pub runs: Vec<WindowRun>,
    /// File bytes of the executable loads.
    pub code_size: u64,
    /// What glibc's loader does with them by itself under `glibc.elf.thp=1`.
    pub glibc_thp: GlibcThp,
}

impl Probe {
    /// The first executable PT_LOAD.
    pub fn exec_load(&self) -> Option<&Phdr> {
        exec_loads(&self.loads).next()
    }

    /// File bytes of the executable loads.
    pub fn code_size(&self) -> u64 {
        code_size(&self.loads)
    }

    /// The file's windows and what follows from them for huge-page size `hp`,
    /// from the loads the probe read: any number of page sizes, one read of the file.
    pub fn windows(&self, hp: u64) -> Windows {
        Windows::of(&self.loads, self.fixed, hp)
    }
}

fn exec_loads(loads: &[Phdr]) -> impl Iterator<Item = &Phdr> {
    loads.iter().filter(|l| l.is_exec())
}

fn code_size(loads: &[Phdr]) -> u64 {
    exec_loads(loads).map(|l| l.p_filesz).sum()
}

impl Windows {
    /// The windows of a probe's `loads` ([`Probe::loads`], [`Probe::fixed`]) for
    /// huge-page size `hp`; for a caller that keeps the loads but not the probe.
    pub fn of(loads: &[Phdr], fixed: bool, hp: u64) -> Windows {
        let runs = huge_windows(loads, fixed, hp);
        let glibc_thp = glibc_thp(loads, &runs, hp);
        Windows { huge_page: hp, runs, code_size: code_size(loads), glibc_thp }
    }

    /// Bytes of code the windows hold.
    pub fn huge_bytes(&self) -> u64 {
        self.runs.iter().map(|w| w.len).sum()
    }

    /// Whether the code is on huge pages as the file is.
    pub fn state(&self) -> HugeState {
        match self.huge_bytes() {
            0 => HugeState::None,
            n if n == self.code_size => HugeState::Whole,
            _ => HugeState::Partial,
        }
    }

    /// The manifest's (offset, size): the file range from the first window to the
    /// end of the last (docs/manifest.md); None without windows.
    pub fn manifest_span(&self) -> Option<(u64, u64)> {
        let (first, last) = (self.runs.first()?, self.runs.last()?);
        Some((first.offset, last.offset + last.len - first.offset))
    }
}

/// Probes `data`. None if it is not an ELF executable or
/// shared object; a file with the ELF magic that is too damaged to tell its type
/// is probed with its `problem` set, so that callers report it rather than pass
/// over it.
pub fn probe(data: &[u8]) -> Option<Probe> {
    if data.len() < 4 || &data[..4] != b"\x7fELF" {
        return None;
    }
    let mut p = Probe {
        arch: None,
        is64: data.get(4) == Some(&ELFCLASS64),
        kind: None,
        has_symtab: None,
        build_id: None,
        loads: Vec::new(),
        fixed: false,
        problem: None,
    };
    let Some(head) = data.get(16..20) else {
        p.problem = Some(Error::new(Reason::Truncated, "file ends inside the ELF header"));
        return Some(p);
    };
    let little = data[5] != 2; // ELFDATA2MSB
    let half = |b: &[u8]| if little { u16::from_le_bytes([b[0], b[1]]) } else { u16::from_be_bytes([b[0], b[1]]) };
    let (e_type, machine) = (half(&head[..2]), half(&head[2..]));
    if e_type != ET_EXEC && e_type != ET_DYN {
        return None;
    }
    p.arch = ArchName::of_header(machine, p.is64, little);
    if let Err(e) = read(&mut p, data) {
        p.problem = Some(e);
    }
    Some(p)
}

/// The build-id of a separate debug file (objcopy --only-keep-debug, eu-strip -f),
/// read from its note sections: the program headers of such a file describe the
/// stripped file it goes with, not itself. None without a build-id note; an error
/// for a file whose ELF or section headers are damaged.
pub fn debug_file_build_id(data: &[u8]) -> Result<Option<Vec<u8>>, Error> {
    let elf = Elf::parse_sections(data)?;
    Ok(notes::build_id(&elf)?.map(|(_, id)| id.to_vec()))
}

fn read(p: &mut Probe, data: &[u8]) -> Result<(), Error> {
    let elf = Elf::parse(data)?;
    p.has_symtab = Some(elf.shdrs.iter().any(|s| s.sh_type == SHT_SYMTAB));
    let kind = file_kind(&elf);
    p.loads = elf.loads().copied().collect();
    p.fixed = kind.as_ref().is_ok_and(|k| k.fixed_addresses());
    p.build_id = notes::build_id(&elf)?.map(|(_, id)| id.to_vec());
    p.kind = Some(kind?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testelf::{Seg, TestElf};

    const HP: u64 = 2 << 20;

    #[test]
    fn a_debug_file_whose_segments_reach_past_its_end_has_its_build_id() {
        // A debug file keeps the stripped file's program headers, whose contents it
        // leaves out: the probe finds them past its end, its build-id is still read.
        use crate::testelf::{load, note, write, Sec};
        let id = [7u8; 20];
        let build_id = Sec::new(".note.gnu.build-id", SHT_NOTE, SHF_ALLOC, note(b"GNU\0", NT_GNU_BUILD_ID, &id));
        let mut file = write(ET_DYN, 0, &[], vec![build_id]);
        assert_eq!(debug_file_build_id(&file).unwrap(), Some(id.to_vec()));
        // Give it the stripped file's load, 2 MiB of code it does not hold (its
        // program header table appended at the end).
        let code = load(PF_R | PF_X, 0, 0, 2 << 20, 2 << 20, 0x1000);
        let phoff = file.len() as u64;
        file.extend(crate::elf::Class { is64: true }.encode_phdr(&code));
        file[0x20..0x28].copy_from_slice(&phoff.to_le_bytes()); // e_phoff
        file[0x36..0x38].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
        file[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
        assert!(probe(&file).and_then(|p| p.problem).is_some(), "the probe reads the segments");
        assert_eq!(debug_file_build_id(&file).unwrap(), Some(id.to_vec()));
        assert!(debug_file_build_id(&file[..40]).is_err());
    }

    #[test]
    fn not_elf_and_not_a_program_are_none() {
        assert!(probe(b"#!/bin/sh\n").is_none());
        assert!(probe(b"").is_none());
        let mut rel = TestElf::pie(&[Seg::code(0x1000, 0x1000, 0x1000)]).build();
        rel[16] = 1; // ET_REL
        assert!(probe(&rel).is_none());
    }

    #[test]
    fn damaged_elf_is_reported_not_skipped() {
        let p = probe(b"\x7fELF\x02\x01\x01").expect("a candidate");
        assert_eq!(p.problem.map(|e| e.reason), Some(Reason::Truncated));
        let mut f = TestElf::pie(&[Seg::code(0x1000, 0x1000, 0x1000)]).build();
        f.truncate(70);
        let p = probe(&f).expect("a candidate");
        assert_eq!(p.arch.map(|a| a.name), Some("x86_64"));
        assert!(p.problem.is_some() && p.has_symtab.is_none());
    }

    #[test]
    fn big_endian_gets_its_name_and_a_problem() {
        let mut f = TestElf::pie(&[Seg::code(0x1000, 0x1000, 0x1000)]).build();
        f[5] = 2;
        f[16..20].copy_from_slice(&[0, 3, 0, 22]); // ET_DYN, EM_S390, big-endian
        let p = probe(&f).expect("a candidate");
        assert_eq!(p.arch.map(|a| a.name), Some("s390x"));
        assert_eq!(p.problem.map(|e| e.reason), Some(Reason::UnsupportedFormat));
    }

    #[test]
    fn windows_state_and_manifest_span() {
        let aligned = TestElf::pie(&[Seg::code(HP, HP, 2 * HP).align(HP)]).build();
        let p = probe(&aligned).unwrap();
        assert!(p.problem.is_none(), "{:?}", p.problem);
        assert_eq!((p.kind, p.has_symtab), (Some(FileKind::SharedObject), Some(false)));
        assert_eq!(p.windows(HP).state(), HugeState::Whole);
        assert_eq!(p.windows(HP).manifest_span(), Some((HP, 2 * HP)));

        // A non-PIE executable with congruent code: its inner windows, as is.
        let exec = TestElf::exec(&[Seg::code(0x1000, 0x401000, 3 * HP)]).build();
        let p = probe(&exec).unwrap();
        assert_eq!(p.kind, Some(FileKind::Executable));
        assert_eq!(p.windows(HP).state(), HugeState::Partial);
        assert_eq!(p.windows(HP).manifest_span(), Some((HP, 2 * HP)));

        // The same code in a PIE with 4 KiB alignment: the base could be anywhere.
        let pie = TestElf::pie(&[Seg::code(0x1000, 0x1000, 3 * HP)]).build();
        let p = probe(&pie).unwrap();
        assert_eq!(p.windows(HP).state(), HugeState::None);
        assert_eq!(p.windows(HP).manifest_span(), None);
    }

    #[test]
    fn one_probe_gives_the_windows_of_every_page_size() {
        let aligned = TestElf::pie(&[Seg::code(HP, HP, 2 * HP).align(HP)]).build();
        let p = probe(&aligned).unwrap();
        assert_eq!((p.code_size(), p.exec_load().map(|l| l.p_align)), (2 * HP, Some(HP)));
        let two = p.windows(HP);
        assert_eq!((two.huge_page, two.state(), two.manifest_span()), (HP, HugeState::Whole, Some((HP, 2 * HP))));
        // Aligned to 2 MiB only: at 4 MiB the loader may put it anywhere 2 MiB-aligned.
        let four = p.windows(2 * HP);
        assert_eq!((four.huge_page, four.state(), four.manifest_span()), (2 * HP, HugeState::None, None));
        assert_eq!(four.code_size, 2 * HP);
    }
}
