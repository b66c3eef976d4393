//! Per-architecture facts, one row each in [`ARCH_NAMES`]: the names, and for the
//! architectures the rewriter supports the trap instruction used for padding, the
//! smallest page size and the default huge-page size (which the policy's defaults
//! come from, through the extension); and which dynamic relocation types carry
//! link-time addresses.

use crate::elf::consts::*;
use crate::elf::Elf;
use crate::error::{Error, Reason, Result};

/// How a dynamic relocation type relates to link-time addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelocClass {
    /// B + A: the addend (and, where written, the word in place) is a link-time address.
    Relative,
    /// Like Relative, but the address is an IFUNC resolver; the word in place is a PLT address.
    IRelative,
    /// Lazy-binding slot: the word in place is a PLT address the loader adjusts by the base.
    JumpSlot,
    /// Symbolic, TLS, COPY or NONE: nothing here holds a link-time address of this object.
    NoAddress,
}

/// The names one architecture goes by. The canonical name is the kernel's and rpm's
/// (`uname -m`, `%_arch`); Debian's and the others are aliases that policies, build
/// systems and `--arch` may use.
#[derive(Clone, Copy, Debug)]
pub struct ArchName {
    /// The ELF machine number (`e_machine`).
    pub machine: u16,
    /// Whether its files are ELFCLASS64.
    pub is64: bool,
    /// Whether its files are little-endian.
    pub little: bool,
    /// The canonical name.
    pub name: &'static str,
    /// Other spellings: Debian's first, then rpm's sub-architectures.
    pub aliases: &'static [&'static str],
    /// What the rewriter needs to know of it; None where it does not rewrite its files.
    pub rewriting: Option<Rewriting>,
}

/// The facts the rewriter and the policy's defaults need of an architecture it supports.
#[derive(Clone, Copy, Debug)]
pub struct Rewriting {
    /// The trap instruction that fills padding, repeated as needed.
    pub trap: &'static [u8],
    /// The smallest page size the architecture's kernels use.
    pub min_page: u64,
    /// The largest page size its distributions' kernels use: what a policy measures
    /// exposure in and keeps loads congruent modulo unless it sets another
    /// ([`crate::Options::page_size`]).
    pub max_page: u64,
    /// The huge-page size a policy uses unless it sets one: a PMD with 4 KiB pages.
    pub default_huge_page: u64,
}

/// x86-64 and i386: `int3`; 4 KiB pages only.
const X86: Rewriting = Rewriting { trap: &[0xcc], min_page: 4096, max_page: 4096, default_huge_page: 2 << 20 };
/// `brk #0` (0xd4200000), little-endian; a PMD of the 4 KiB granule. RHEL's
/// `kernel-64k` and Ubuntu's `-64k` kernels map 64 KiB pages.
const AARCH64: Rewriting =
    Rewriting { trap: &[0x00, 0x00, 0x20, 0xd4], min_page: 4096, max_page: 0x10000, default_huge_page: 2 << 20 };

/// The huge-page size where no architecture is known yet (x86-64's, the one every
/// supported architecture shares with 4 KiB pages).
pub const DEFAULT_HUGE_PAGE: u64 = X86.default_huge_page;

/// Every architecture hugify can name, whether or not the rewriter supports it (a
/// policy may set a huge-page size for it, and a build root may hold its files).
pub const ARCH_NAMES: &[ArchName] = &[
    ArchName {
        machine: EM_X86_64,
        is64: true,
        little: true,
        name: "x86_64",
        aliases: &["amd64"],
        rewriting: Some(X86),
    },
    ArchName {
        machine: EM_AARCH64,
        is64: true,
        little: true,
        name: "aarch64",
        aliases: &["arm64"],
        rewriting: Some(AARCH64),
    },
    ArchName {
        machine: EM_386,
        is64: false,
        little: true,
        name: "i386",
        aliases: &["i486", "i586", "i686"],
        rewriting: Some(X86),
    },
    ArchName { machine: EM_PPC64, is64: true, little: true, name: "ppc64le", aliases: &["ppc64el"], rewriting: None },
    ArchName { machine: EM_RISCV, is64: true, little: true, name: "riscv64", aliases: &[], rewriting: None },
    ArchName { machine: EM_S390, is64: true, little: false, name: "s390x", aliases: &[], rewriting: None },
    ArchName { machine: EM_LOONGARCH, is64: true, little: true, name: "loongarch64", aliases: &[], rewriting: None },
];

impl ArchName {
    /// The architecture of an ELF header's (e_machine, class, byte order).
    pub fn of_header(machine: u16, is64: bool, little: bool) -> Option<&'static ArchName> {
        ARCH_NAMES.iter().find(|a| (a.machine, a.is64, a.little) == (machine, is64, little))
    }

    /// The canonical name for any spelling of an architecture.
    pub fn canonical(name: &str) -> Option<&'static str> {
        ARCH_NAMES.iter().find(|a| a.name == name || a.aliases.contains(&name)).map(|a| a.name)
    }
}

/// An architecture the rewriter supports: its row's machine number and name with
/// its [`Rewriting`] facts.
#[derive(Clone, Copy, Debug)]
pub struct Arch {
    /// The ELF machine number (`e_machine`).
    pub machine: u16,
    /// The canonical name ([`ArchName::name`]).
    pub name: &'static str,
    /// The trap instruction that fills padding, repeated as needed.
    pub trap: &'static [u8],
    /// The smallest page size the architecture's kernels use.
    pub min_page: u64,
    /// The largest page size its distributions' kernels use ([`Rewriting::max_page`]).
    pub max_page: u64,
}

impl Arch {
    /// The architecture of `elf`, if the rewriter supports it (the ELF reader accepts
    /// little-endian files only).
    pub fn for_file(elf: &Elf) -> Result<Arch> {
        let (machine, is64) = (elf.ehdr.e_machine, elf.class.is64);
        match ArchName::of_header(machine, is64, true) {
            Some(&ArchName { machine, name, rewriting: Some(r), .. }) => {
                Ok(Arch { machine, name, trap: r.trap, min_page: r.min_page, max_page: r.max_page })
            }
            _ => Err(Error::new(
                Reason::UnsupportedFormat,
                format!("machine {machine} ({}) is not supported", if is64 { "ELF64" } else { "ELF32" }),
            )),
        }
    }

    /// Classifies a dynamic relocation type; `None` for a type hugify does not know.
    pub fn classify_reloc(&self, kind: u32) -> Option<RelocClass> {
        use RelocClass::*;
        match self.machine {
            EM_X86_64 => match kind {
                R_X86_64_RELATIVE => Some(Relative),
                R_X86_64_IRELATIVE => Some(IRelative),
                R_X86_64_JUMP_SLOT => Some(JumpSlot),
                0 | R_X86_64_64 | R_X86_64_COPY | R_X86_64_GLOB_DAT | R_X86_64_DTPMOD64 | R_X86_64_DTPOFF64
                | R_X86_64_TPOFF64 | R_X86_64_TLSDESC => Some(NoAddress),
                _ => None,
            },
            EM_AARCH64 => match kind {
                R_AARCH64_RELATIVE => Some(Relative),
                R_AARCH64_IRELATIVE => Some(IRelative),
                R_AARCH64_JUMP_SLOT => Some(JumpSlot),
                0
                | R_AARCH64_ABS64
                | R_AARCH64_COPY
                | R_AARCH64_GLOB_DAT
                | R_AARCH64_TLS_DTPMOD64
                | R_AARCH64_TLS_DTPREL64
                | R_AARCH64_TLS_TPREL64
                | R_AARCH64_TLSDESC => Some(NoAddress),
                _ => None,
            },
            // i386 keeps addends in place (REL). R_386_32 and PC32 add a symbol (or,
            // with symbol 0, nothing) to an offset: no address of this image.
            EM_386 => match kind {
                R_386_RELATIVE => Some(Relative),
                R_386_IRELATIVE => Some(IRelative),
                R_386_JMP_SLOT => Some(JumpSlot),
                0 | R_386_32 | R_386_PC32 | R_386_COPY | R_386_GLOB_DAT | R_386_TLS_TPOFF | R_386_TLS_DTPMOD32
                | R_386_TLS_DTPOFF32 | R_386_TLS_TPOFF32 | R_386_TLS_DESC => Some(NoAddress),
                _ => None,
            },
            _ => None,
        }
    }

    /// Machine-specific dynamic tags whose value is an address.
    pub fn is_machine_dt_ptr(&self, tag: i64) -> bool {
        self.machine == EM_X86_64 && tag == DT_X86_64_PLT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewritten_architectures_and_their_facts() {
        let rewritten: Vec<(&str, &[u8], u64, u64, u64)> = ARCH_NAMES
            .iter()
            .filter_map(|a| a.rewriting.map(|r| (a.name, r.trap, r.min_page, r.max_page, r.default_huge_page)))
            .collect();
        assert_eq!(
            rewritten,
            [
                ("x86_64", &[0xcc][..], 4096, 4096, 2 << 20),
                ("aarch64", &[0x00, 0x00, 0x20, 0xd4][..], 4096, 0x10000, 2 << 20),
                ("i386", &[0xcc][..], 4096, 4096, 2 << 20)
            ]
        );
        assert_eq!(DEFAULT_HUGE_PAGE, 2 << 20);
    }

    #[test]
    fn a_file_gets_its_rows_rewriting_facts() {
        let f = crate::testelf::TestElf::pie(&[crate::testelf::Seg::code(0x1000, 0x1000, 0x1000)]).build();
        let arch = Arch::for_file(&Elf::parse(&f).unwrap()).unwrap();
        assert_eq!((arch.machine, arch.name, arch.trap, arch.min_page), (EM_X86_64, "x86_64", &[0xcc][..], 4096));
        let mut ppc = f.clone();
        ppc[18..20].copy_from_slice(&EM_PPC64.to_le_bytes());
        let e = Arch::for_file(&Elf::parse(&ppc).unwrap()).unwrap_err();
        assert_eq!(e.reason, Reason::UnsupportedFormat);
    }
}
