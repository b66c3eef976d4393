//! Small ELF64 x86-64 files built in memory for the core's unit tests: program
//! headers only, each load filled with trap bytes, so tests run in milliseconds
//! without toolchains.

use crate::elf::consts::*;

/// One PT_LOAD to put in a test file.
#[derive(Clone, Copy)]
pub struct Seg {
    flags: u32,
    offset: u64,
    vaddr: u64,
    size: u64,
    align: u64,
}

impl Seg {
    /// An executable load of `size` file bytes, 4 KiB aligned.
    pub fn code(offset: u64, vaddr: u64, size: u64) -> Seg {
        Seg { flags: PF_R | PF_X, offset, vaddr, size, align: 0x1000 }
    }

    /// The same load with another `p_align`.
    pub fn align(self, align: u64) -> Seg {
        Seg { align, ..self }
    }
}

/// A test file under construction.
pub struct TestElf {
    e_type: u16,
    segs: Vec<Seg>,
}

impl TestElf {
    /// A shared object (ET_DYN without an interpreter).
    pub fn pie(segs: &[Seg]) -> TestElf {
        TestElf { e_type: ET_DYN, segs: segs.to_vec() }
    }

    /// A non-PIE executable (ET_EXEC).
    pub fn exec(segs: &[Seg]) -> TestElf {
        TestElf { e_type: ET_EXEC, segs: segs.to_vec() }
    }

    /// The file's bytes.
    pub fn build(&self) -> Vec<u8> {
        let end = self.segs.iter().map(|s| s.offset + s.size).max().unwrap_or(0);
        let phoff = 64u64;
        let mut out = vec![0u8; end.max(phoff + 56 * self.segs.len() as u64) as usize];
        for s in &self.segs {
            out[s.offset as usize..(s.offset + s.size) as usize].fill(0xcc);
        }
        out[..8].copy_from_slice(&[0x7f, b'E', b'L', b'F', ELFCLASS64, ELFDATA2LSB, EV_CURRENT, 0]);
        out[16..18].copy_from_slice(&self.e_type.to_le_bytes());
        out[18..20].copy_from_slice(&EM_X86_64.to_le_bytes());
        out[20..24].copy_from_slice(&1u32.to_le_bytes());
        out[32..40].copy_from_slice(&phoff.to_le_bytes());
        out[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
        out[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
        out[56..58].copy_from_slice(&(self.segs.len() as u16).to_le_bytes());
        out[58..60].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
        for (i, s) in self.segs.iter().enumerate() {
            let at = (phoff + 56 * i as u64) as usize;
            out[at..at + 4].copy_from_slice(&PT_LOAD.to_le_bytes());
            out[at + 4..at + 8].copy_from_slice(&s.flags.to_le_bytes());
            for (k, v) in [s.offset, s.vaddr, s.vaddr, s.size, s.size, s.align].iter().enumerate() {
                out[at + 8 + 8 * k..at + 16 + 8 * k].copy_from_slice(&v.to_le_bytes());
            }
        }
        out
    }
}
