//! Entry points for the fuzz targets under `fuzz/` and their regression tests
//! (`core/tests/fuzz_regressions.rs`). Not an API.

use crate::elf::Elf;
use crate::plan::AddrMap;

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
        let _ = crate::dwarf::repair(&elf, &AddrMap { start: 0x1000, end: 1 << 40, dv: 2 << 20 });
    }
}

/// An ELF64 x86-64 shared object with a 4 KiB `.text` at 0x1000 and the given
/// non-allocated sections (no program headers: the DWARF repair reads sections only).
fn elf_with(sections: &[(&str, &[u8])]) -> Vec<u8> {
    let text = [0xccu8; 0x1000];
    // (name, sh_type, sh_flags, sh_addr, contents)
    let mut all: Vec<(&str, u32, u64, u64, &[u8])> = vec![(".text", 1, 0x6, 0x1000, &text)];
    all.extend(sections.iter().map(|&(name, bytes)| (name, 1, 0, 0, bytes)));
    let mut shstrtab = vec![0u8];
    let mut names = Vec::new();
    for name in all.iter().map(|s| s.0).chain([".shstrtab"]) {
        names.push(shstrtab.len() as u32);
        shstrtab.extend_from_slice(name.as_bytes());
        shstrtab.push(0);
    }
    all.push((".shstrtab", 3, 0, 0, &shstrtab));

    let mut out = vec![0u8; 64];
    let mut offsets = Vec::new();
    for s in &all {
        offsets.push(out.len() as u64);
        out.extend_from_slice(s.4);
    }
    out.resize(out.len().next_multiple_of(8), 0);
    let shoff = out.len() as u64;
    out.extend_from_slice(&[0u8; 64]); // the null section
    for ((s, name), offset) in all.iter().zip(&names).zip(&offsets) {
        out.extend_from_slice(&name.to_le_bytes());
        out.extend_from_slice(&s.1.to_le_bytes());
        for v in [s.2, s.3, *offset, s.4.len() as u64] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&[0u8; 8]); // sh_link, sh_info
        out.extend_from_slice(&1u64.to_le_bytes()); // sh_addralign
        out.extend_from_slice(&0u64.to_le_bytes()); // sh_entsize
    }
    let count = all.len() as u16 + 1;
    out[..8].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]); // ELF64, little-endian, v1
    out[16..18].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN
    out[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    out[20..24].copy_from_slice(&1u32.to_le_bytes());
    out[40..48].copy_from_slice(&shoff.to_le_bytes());
    out[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
    out[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
    out[58..60].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
    out[60..62].copy_from_slice(&count.to_le_bytes());
    out[62..64].copy_from_slice(&(count - 1).to_le_bytes()); // .shstrtab is last
    out
}
