//! Entry points for the fuzz targets under `fuzz/` and their regression tests
//! (`core/tests/fuzz_regressions.rs`). Not an API.

use crate::addr_map::AddrMap;
use crate::elf::consts::{ET_DYN, SHF_ALLOC, SHF_EXECINSTR, SHT_PROGBITS};
use crate::elf::Elf;
use crate::testelf::{self, Sec};

/// Section names a DWARF fuzz input can hold.
pub const NAMES: &[&str] = &[
    ".debug_info",
    ".debug_abbrev",
    ".debug_line",
    ".debug_line_str",
    ".debug_str",
    ".debug_str_offsets",
    ".debug_addr",
    ".debug_aranges",
    ".debug_ranges",
    ".debug_rnglists",
    ".debug_loc",
    ".debug_loclists",
    ".debug_frame",
    ".debug_types",
    ".gdb_index",
];

/// Runs every DWARF walker over sections given as `[id: u8][length: u16 LE][bytes]…`
/// (id indexes [`NAMES`]), wrapped in a minimal ELF file whose code at 0x1000 moves by
/// 2 MiB. Errors are fine; panics are findings.
pub fn dwarf(data: &[u8]) {
    let mut sections = Vec::new();
    let mut rest = data;
    while rest.len() >= 3 {
        let name = NAMES[usize::from(rest[0]) % NAMES.len()];
        let len = usize::from(u16::from_le_bytes([rest[1], rest[2]])).min(rest.len() - 3);
        sections.push((name, &rest[3..3 + len]));
        rest = &rest[3 + len..];
    }
    let file = elf_with(&sections);
    if let Ok(elf) = Elf::parse(&file) {
        let _ = crate::dwarf::repair(&elf, &AddrMap::shift(0x1000, 1 << 40, 2 << 20));
    }
}

/// An ELF64 x86-64 shared object with a 4 KiB `.text` at 0x1000 and the given
/// non-allocated sections (no program headers: the DWARF repair reads sections only).
fn elf_with(sections: &[(&'static str, &[u8])]) -> Vec<u8> {
    let text = Sec { addr: 0x1000, ..Sec::new(".text", SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR, vec![0xcc; 0x1000]) };
    let rest = sections.iter().map(|&(name, bytes)| Sec::new(name, SHT_PROGBITS, 0, bytes.to_vec()));
    testelf::write(ET_DYN, 0, &[], [text].into_iter().chain(rest).collect())
}
