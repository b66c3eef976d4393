//! Field layouts of ELF records for both classes, and their encoders. Offsets are
//! the ones in the System V gABI; every read is bounds-checked.

use super::consts::*;
use super::{read_u16, read_u32, read_u64, slice, Class, Ehdr, Phdr, Shdr};
use crate::error::{Error, Reason, Result};

pub(super) fn read_ehdr(d: &[u8], c: Class) -> Result<Ehdr> {
    let (entry, phoff, shoff, rest) = if c.is64 {
        (read_u64(d, 24)?, read_u64(d, 32)?, read_u64(d, 40)?, 52)
    } else {
        (u64::from(read_u32(d, 24)?), u64::from(read_u32(d, 28)?), u64::from(read_u32(d, 32)?), 40)
    };
    Ok(Ehdr {
        e_type: read_u16(d, 16)?,
        e_machine: read_u16(d, 18)?,
        e_entry: entry,
        e_phoff: phoff,
        e_shoff: shoff,
        e_phentsize: read_u16(d, rest + 2)?,
        phnum: u64::from(read_u16(d, rest + 4)?),
        e_shentsize: read_u16(d, rest + 6)?,
        shnum: u64::from(read_u16(d, rest + 8)?),
        shstrndx: u64::from(read_u16(d, rest + 10)?),
    })
}

/// File offsets of the ELF header fields the rewriter patches.
#[allow(missing_docs)] // fields named as in the ELF specification (gABI)
pub struct EhdrFields {
    pub entry: u64,
    pub phoff: u64,
    pub shoff: u64,
    pub phnum: u64,
    pub shnum: u64,
    pub shstrndx: u64,
}

impl Class {
    /// Where the patched ELF header fields live.
    pub fn ehdr_fields(self) -> EhdrFields {
        if self.is64 {
            EhdrFields { entry: 24, phoff: 32, shoff: 40, phnum: 56, shnum: 60, shstrndx: 62 }
        } else {
            EhdrFields { entry: 24, phoff: 28, shoff: 32, phnum: 44, shnum: 48, shstrndx: 50 }
        }
    }

    /// Encodes a program header.
    pub fn encode_phdr(self, p: &Phdr) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.phdr_size() as usize);
        v.extend_from_slice(&p.p_type.to_le_bytes());
        if self.is64 {
            v.extend_from_slice(&p.p_flags.to_le_bytes());
            for x in [p.p_offset, p.p_vaddr, p.p_paddr, p.p_filesz, p.p_memsz, p.p_align] {
                v.extend_from_slice(&x.to_le_bytes());
            }
        } else {
            for x in [p.p_offset, p.p_vaddr, p.p_paddr, p.p_filesz, p.p_memsz] {
                v.extend_from_slice(&(x as u32).to_le_bytes());
            }
            v.extend_from_slice(&p.p_flags.to_le_bytes());
            v.extend_from_slice(&(p.p_align as u32).to_le_bytes());
        }
        v
    }

    /// Encodes a section header.
    pub fn encode_shdr(self, s: &Shdr) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.shdr_size() as usize);
        v.extend_from_slice(&s.sh_name.to_le_bytes());
        v.extend_from_slice(&s.sh_type.to_le_bytes());
        let words = [s.sh_flags, s.sh_addr, s.sh_offset, s.sh_size];
        for x in words {
            v.extend_from_slice(&self.word_bytes(x));
        }
        v.extend_from_slice(&s.sh_link.to_le_bytes());
        v.extend_from_slice(&s.sh_info.to_le_bytes());
        v.extend_from_slice(&self.word_bytes(s.sh_addralign));
        v.extend_from_slice(&self.word_bytes(s.sh_entsize));
        v
    }

    /// Offset of st_value inside a symbol, and the size of a symbol.
    pub fn sym_value_field(self) -> (u64, u64) {
        if self.is64 {
            (8, 24)
        } else {
            (4, 16)
        }
    }
}

pub(super) fn read_phdr(d: &[u8], c: Class, off: u64) -> Result<Phdr> {
    Ok(if c.is64 {
        Phdr {
            p_type: read_u32(d, off)?,
            p_flags: read_u32(d, off + 4)?,
            p_offset: read_u64(d, off + 8)?,
            p_vaddr: read_u64(d, off + 16)?,
            p_paddr: read_u64(d, off + 24)?,
            p_filesz: read_u64(d, off + 32)?,
            p_memsz: read_u64(d, off + 40)?,
            p_align: read_u64(d, off + 48)?,
        }
    } else {
        let w = |o: u64| read_u32(d, off + o).map(u64::from);
        Phdr {
            p_type: read_u32(d, off)?,
            p_offset: w(4)?,
            p_vaddr: w(8)?,
            p_paddr: w(12)?,
            p_filesz: w(16)?,
            p_memsz: w(20)?,
            p_flags: read_u32(d, off + 24)?,
            p_align: w(28)?,
        }
    })
}

pub(super) fn read_shdr(d: &[u8], c: Class, table: u64, index: u64) -> Result<Shdr> {
    // The entry as a slice of its own: field offsets below cannot overflow.
    let at = index.checked_mul(c.shdr_size()).and_then(|o| o.checked_add(table));
    let at = at.ok_or_else(|| Error::new(Reason::Truncated, "section header offset overflows"))?;
    let d = slice(d, at, c.shdr_size())?;
    let off = 0;
    let w = |o: u64| -> Result<u64> {
        if c.is64 {
            read_u64(d, off + o)
        } else {
            read_u32(d, off + o).map(u64::from)
        }
    };
    let (flags, addr, offset, size, link, info, align, entsize) = if c.is64 {
        (w(8)?, w(16)?, w(24)?, w(32)?, read_u32(d, off + 40)?, read_u32(d, off + 44)?, w(48)?, w(56)?)
    } else {
        (w(8)?, w(12)?, w(16)?, w(20)?, read_u32(d, off + 24)?, read_u32(d, off + 28)?, w(32)?, w(36)?)
    };
    Ok(Shdr {
        index: index as usize,
        name: String::new(),
        sh_name: read_u32(d, off)?,
        sh_type: read_u32(d, off + 4)?,
        sh_flags: flags,
        sh_addr: addr,
        sh_offset: offset,
        sh_size: size,
        sh_link: link,
        sh_info: info,
        sh_addralign: align,
        sh_entsize: entsize,
    })
}

/// One dynamic entry.
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)] // the gABI's fields without their prefix (d_tag, d_val)
pub struct Dyn {
    pub tag: i64,
    /// d_val / d_ptr.
    pub val: u64,
}

pub(super) fn read_dynamic(d: &[u8], c: Class, s: &Shdr) -> Result<Vec<(u64, Dyn)>> {
    let ent = 2 * c.word();
    let mut out = Vec::new();
    let mut off = s.sh_offset;
    // Parsing checked neither empty nor null sections against the file: reads past it fail.
    let end = s.sh_offset.saturating_add(s.sh_size);
    while off.checked_add(ent).is_some_and(|e| e <= end) {
        let tag = if c.is64 { read_u64(d, off)? as i64 } else { i64::from(read_u32(d, off)? as i32) };
        let val = c.read_word(d, off + c.word())?;
        if tag == DT_NULL {
            return Ok(out);
        }
        out.push((off, Dyn { tag, val }));
        off += ent;
    }
    Err(Error::new(Reason::BadDynamic, "the dynamic section has no DT_NULL terminator"))
}

/// One symbol.
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)] // the gABI's fields without their prefix (st_name, st_info, st_shndx, st_value, st_size)
pub struct Sym {
    pub name: u32,
    pub info: u8,
    pub shndx: u16,
    pub value: u64,
    pub size: u64,
}

impl Sym {
    /// The symbol type (STT_*).
    pub fn kind(&self) -> u8 {
        self.info & 0xf
    }
}

/// A table of `ent`-byte entries: whole entries, all inside the file.
fn check_table(d: &[u8], s: &Shdr, ent: u64, what: &str, reason: Reason) -> Result<()> {
    slice(d, s.sh_offset, s.sh_size)?;
    if s.sh_size % ent != 0 {
        return Err(Error::new(
            reason,
            format!("{what} section {} ({}) has size {:#x}, not a multiple of {ent}", s.index, s.name, s.sh_size),
        ));
    }
    Ok(())
}

pub(super) fn read_symbols(d: &[u8], c: Class, s: &Shdr) -> Result<Vec<(u64, Sym)>> {
    let (_, ent) = c.sym_value_field();
    check_table(d, s, ent, "symbol table", Reason::BadSymbols)?;
    let n = s.sh_size / ent;
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let off = s.sh_offset + i * ent;
        let sym = if c.is64 {
            Sym {
                name: read_u32(d, off)?,
                info: d[off as usize + 4],
                shndx: read_u16(d, off + 6)?,
                value: read_u64(d, off + 8)?,
                size: read_u64(d, off + 16)?,
            }
        } else {
            Sym {
                name: read_u32(d, off)?,
                value: u64::from(read_u32(d, off + 4)?),
                size: u64::from(read_u32(d, off + 8)?),
                info: d[off as usize + 12],
                shndx: read_u16(d, off + 14)?,
            }
        };
        out.push((off, sym));
    }
    Ok(out)
}

/// One REL or RELA relocation.
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)] // the gABI's fields without their prefix (r_offset, r_info, r_addend)
pub struct Rel {
    pub offset: u64,
    /// Relocation type.
    pub kind: u32,
    /// Symbol index.
    pub sym: u32,
    /// r_addend (RELA only).
    pub addend: Option<i64>,
}

pub(super) fn read_relocations(d: &[u8], c: Class, s: &Shdr) -> Result<Vec<(u64, Rel)>> {
    let rela = s.sh_type == SHT_RELA;
    let ent = c.word() * if rela { 3 } else { 2 };
    check_table(d, s, ent, "relocation", Reason::BadRelocations)?;
    let n = s.sh_size / ent;
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let off = s.sh_offset + i * ent;
        let offset = c.read_word(d, off)?;
        let info = c.read_word(d, off + c.word())?;
        let (sym, kind) =
            if c.is64 { ((info >> 32) as u32, info as u32) } else { ((info >> 8) as u32, (info & 0xff) as u32) };
        let addend = if rela {
            Some(if c.is64 { read_u64(d, off + 16)? as i64 } else { i64::from(read_u32(d, off + 8)? as i32) })
        } else {
            None
        };
        out.push((off, Rel { offset, kind, sym, addend }));
    }
    Ok(out)
}
