//! What every layer needs to know about a file, read from its headers without
//! planning: cheap enough to run on every file of a build root, and the only place
//! the Python layers and the runtime learn a file's architecture, kind, symbol
//! table, build-id and huge-page windows from.

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
    /// The first executable PT_LOAD.
    pub exec_load: Option<Phdr>,
    /// File bytes of the executable loads.
    pub code_size: u64,
    /// The huge-page size the windows are for.
    pub huge_page: u64,
    /// The whole huge-page windows at congruent offsets ([`huge_windows`]).
    pub windows: Vec<WindowRun>,
    /// What glibc's loader does with them by itself under `glibc.elf.thp=1`.
    pub glibc_thp: GlibcThp,
    /// Why the rest could not be read (the file is damaged or in a format the
    /// rewriter does not read, e.g. big-endian).
    pub problem: Option<Error>,
}

impl Probe {
    /// Bytes of code the windows hold.
    pub fn huge_bytes(&self) -> u64 {
        self.windows.iter().map(|w| w.len).sum()
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
        let (first, last) = (self.windows.first()?, self.windows.last()?);
        Some((first.offset, last.offset + last.len - first.offset))
    }
}

/// Probes `data` for huge-page size `hp`. None if it is not an ELF executable or
/// shared object; a file with the ELF magic that is too damaged to tell its type
/// is probed with its `problem` set, so that callers report it rather than pass
/// over it.
pub fn probe(data: &[u8], hp: u64) -> Option<Probe> {
    if data.len() < 4 || &data[..4] != b"\x7fELF" {
        return None;
    }
    let mut p = Probe {
        arch: None,
        is64: data.get(4) == Some(&ELFCLASS64),
        kind: None,
        has_symtab: None,
        build_id: None,
        exec_load: None,
        code_size: 0,
        huge_page: hp,
        windows: Vec::new(),
        glibc_thp: GlibcThp { advised: 0, header: 0, read_ahead_limit: None },
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

fn read(p: &mut Probe, data: &[u8]) -> Result<(), Error> {
    let elf = Elf::parse(data)?;
    p.has_symtab = Some(elf.shdrs.iter().any(|s| s.sh_type == SHT_SYMTAB));
    let exec = || elf.loads().filter(|l| l.is_exec());
    p.exec_load = exec().next().copied();
    p.code_size = exec().map(|l| l.p_filesz).sum();
    p.windows = huge_windows(&elf.phdrs, elf.ehdr.e_type == ET_EXEC, p.huge_page);
    p.glibc_thp = glibc_thp(&elf.phdrs, &p.windows, p.huge_page);
    p.build_id = notes::build_id(&elf)?.map(|(_, id)| id.to_vec());
    p.kind = Some(file_kind(&elf)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testelf::{Seg, TestElf};

    const HP: u64 = 2 << 20;

    #[test]
    fn not_elf_and_not_a_program_are_none() {
        assert!(probe(b"#!/bin/sh\n", HP).is_none());
        assert!(probe(b"", HP).is_none());
        let mut rel = TestElf::pie(&[Seg::code(0x1000, 0x1000, 0x1000)]).build();
        rel[16] = 1; // ET_REL
        assert!(probe(&rel, HP).is_none());
    }

    #[test]
    fn damaged_elf_is_reported_not_skipped() {
        let p = probe(b"\x7fELF\x02\x01\x01", HP).expect("a candidate");
        assert_eq!(p.problem.map(|e| e.reason), Some(Reason::Truncated));
        let mut f = TestElf::pie(&[Seg::code(0x1000, 0x1000, 0x1000)]).build();
        f.truncate(70);
        let p = probe(&f, HP).expect("a candidate");
        assert_eq!(p.arch.map(|a| a.name), Some("x86_64"));
        assert!(p.problem.is_some() && p.has_symtab.is_none());
    }

    #[test]
    fn big_endian_gets_its_name_and_a_problem() {
        let mut f = TestElf::pie(&[Seg::code(0x1000, 0x1000, 0x1000)]).build();
        f[5] = 2;
        f[16..20].copy_from_slice(&[0, 3, 0, 22]); // ET_DYN, EM_S390, big-endian
        let p = probe(&f, HP).expect("a candidate");
        assert_eq!(p.arch.map(|a| a.name), Some("s390x"));
        assert_eq!(p.problem.map(|e| e.reason), Some(Reason::UnsupportedFormat));
    }

    #[test]
    fn windows_state_and_manifest_span() {
        let aligned = TestElf::pie(&[Seg::code(HP, HP, 2 * HP).align(HP)]).build();
        let p = probe(&aligned, HP).unwrap();
        assert!(p.problem.is_none(), "{:?}", p.problem);
        assert_eq!((p.kind, p.has_symtab), (Some(FileKind::SharedObject), Some(false)));
        assert_eq!(p.state(), HugeState::Whole);
        assert_eq!(p.manifest_span(), Some((HP, 2 * HP)));

        // A non-PIE executable with congruent code: its inner windows, as is.
        let exec = TestElf::exec(&[Seg::code(0x1000, 0x401000, 3 * HP)]).build();
        let p = probe(&exec, HP).unwrap();
        assert_eq!(p.kind, Some(FileKind::Executable));
        assert_eq!(p.state(), HugeState::Partial);
        assert_eq!(p.manifest_span(), Some((HP, 2 * HP)));

        // The same code in a PIE with 4 KiB alignment: the base could be anywhere.
        let pie = TestElf::pie(&[Seg::code(0x1000, 0x1000, 3 * HP)]).build();
        let p = probe(&pie, HP).unwrap();
        assert_eq!(p.state(), HugeState::None);
        assert_eq!(p.manifest_span(), None);
    }
}
