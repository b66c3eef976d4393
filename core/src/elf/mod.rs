//! A read-only, validated view of a little-endian ELF32/ELF64 file: the ELF header,
//! program headers and section headers, plus class-aware reads at file offsets.
//!
//! Everything the rewriter later trusts (table bounds, entry sizes, section ranges)
//! is checked here once, so the repair modules can index without re-checking.

pub mod consts;
pub mod notes;
mod records;

use crate::error::{Error, Reason, Result};
use consts::*;
pub use records::{Dyn, Rel, Sym};

/// The file's class (ELF32 or ELF64). Only little-endian files are accepted, so the
/// class alone decides every record layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Class {
    /// true for ELFCLASS64.
    pub is64: bool,
}

impl Class {
    /// Size in bytes of an address-sized word.
    pub fn word(self) -> u64 {
        if self.is64 {
            8
        } else {
            4
        }
    }
    /// Size of the ELF header.
    pub fn ehdr_size(self) -> u64 {
        if self.is64 {
            64
        } else {
            52
        }
    }
    /// Size of one program header.
    pub fn phdr_size(self) -> u64 {
        if self.is64 {
            56
        } else {
            32
        }
    }
    /// Size of one section header.
    pub fn shdr_size(self) -> u64 {
        if self.is64 {
            64
        } else {
            40
        }
    }
    /// Reads an address-sized word.
    pub fn read_word(self, data: &[u8], off: u64) -> Result<u64> {
        if self.is64 {
            read_u64(data, off)
        } else {
            read_u32(data, off).map(u64::from)
        }
    }
    /// Encodes an address-sized word.
    pub fn word_bytes(self, v: u64) -> Vec<u8> {
        if self.is64 {
            v.to_le_bytes().to_vec()
        } else {
            (v as u32).to_le_bytes().to_vec()
        }
    }
}

/// The `len` bytes at `off`, or an error saying they lie beyond the end of the file.
pub(crate) fn slice(data: &[u8], off: u64, len: u64) -> Result<&[u8]> {
    let end = off.checked_add(len).filter(|&e| e <= data.len() as u64);
    match end {
        Some(end) => Ok(&data[off as usize..end as usize]),
        None => {
            Err(Error::new(Reason::Truncated, format!("{len} bytes at offset {off:#x} lie beyond the end of the file")))
        }
    }
}

/// Reads a little-endian u16.
pub fn read_u16(data: &[u8], off: u64) -> Result<u16> {
    Ok(u16::from_le_bytes(slice(data, off, 2)?.try_into().unwrap()))
}
/// Reads a little-endian u32.
pub fn read_u32(data: &[u8], off: u64) -> Result<u32> {
    Ok(u32::from_le_bytes(slice(data, off, 4)?.try_into().unwrap()))
}
/// Reads a little-endian u64.
pub fn read_u64(data: &[u8], off: u64) -> Result<u64> {
    Ok(u64::from_le_bytes(slice(data, off, 8)?.try_into().unwrap()))
}

/// The ELF header fields the rewriter uses, with extended numbering resolved.
#[derive(Clone, Debug)]
#[allow(missing_docs)] // fields named as in the ELF specification (gABI)
pub struct Ehdr {
    pub e_type: u16,
    pub e_machine: u16,
    pub e_entry: u64,
    pub e_phoff: u64,
    pub e_shoff: u64,
    pub e_phentsize: u16,
    /// Real number of program headers.
    pub phnum: u64,
    pub e_shentsize: u16,
    /// Real number of section headers.
    pub shnum: u64,
    /// Real index of the section-name string table.
    pub shstrndx: u64,
}

/// One program header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // fields named as in the ELF specification (gABI)
pub struct Phdr {
    pub p_type: u32,
    pub p_flags: u32,
    pub p_offset: u64,
    pub p_vaddr: u64,
    pub p_paddr: u64,
    pub p_filesz: u64,
    pub p_memsz: u64,
    pub p_align: u64,
}

// Ends saturate: parsing rejects what lies beyond the file or wraps the address
// space, and code that looks at a corrupt header before that must not overflow.
impl Phdr {
    /// One past the last virtual address.
    pub fn vend(&self) -> u64 {
        self.p_vaddr.saturating_add(self.p_memsz)
    }
    /// One past the last file byte.
    pub fn fend(&self) -> u64 {
        self.p_offset.saturating_add(self.p_filesz)
    }
    /// Whether this is an executable load: a PT_LOAD the loader maps with PROT_EXEC.
    /// (PF_X on other headers means something else: an executable stack on
    /// PT_GNU_STACK.)
    pub fn is_exec(&self) -> bool {
        self.p_type == PT_LOAD && self.p_flags & PF_X != 0
    }
    /// Whether `vaddr` lies in the file-backed part of this segment.
    pub fn file_contains(&self, vaddr: u64) -> bool {
        vaddr >= self.p_vaddr && vaddr - self.p_vaddr < self.p_filesz
    }
}

/// One section header, with its name resolved.
#[derive(Clone, Debug)]
#[allow(missing_docs)] // fields named as in the ELF specification (gABI)
pub struct Shdr {
    /// Index in the section header table.
    pub index: usize,
    /// Section name (lossy UTF-8).
    pub name: String,
    pub sh_name: u32,
    pub sh_type: u32,
    pub sh_flags: u64,
    pub sh_addr: u64,
    pub sh_offset: u64,
    pub sh_size: u64,
    pub sh_link: u32,
    pub sh_info: u32,
    pub sh_addralign: u64,
    pub sh_entsize: u64,
}

impl Shdr {
    /// Whether the section occupies memory at run time.
    pub fn is_alloc(&self) -> bool {
        self.sh_flags & SHF_ALLOC != 0
    }
    /// Whether the section has bytes in the file.
    pub fn has_file_data(&self) -> bool {
        self.sh_type != SHT_NOBITS && self.sh_type != SHT_NULL && self.sh_size > 0
    }
    /// One past the last virtual address.
    pub fn vend(&self) -> u64 {
        self.sh_addr.saturating_add(self.sh_size)
    }
    /// A thread-local .bss: it occupies no address space of its own.
    pub fn is_tls_bss(&self) -> bool {
        self.sh_flags & SHF_TLS != 0 && self.sh_type == SHT_NOBITS
    }
    /// One past the last file byte (its offset if it has no file data).
    pub fn fend(&self) -> u64 {
        if self.has_file_data() {
            self.sh_offset.saturating_add(self.sh_size)
        } else {
            self.sh_offset
        }
    }
}

/// A parsed ELF file borrowing its bytes.
pub struct Elf<'a> {
    /// The whole file.
    pub data: &'a [u8],
    /// ELF32 or ELF64.
    pub class: Class,
    /// The ELF header.
    pub ehdr: Ehdr,
    /// Program headers in table order.
    pub phdrs: Vec<Phdr>,
    /// Section headers in table order (index 0 is the null section).
    pub shdrs: Vec<Shdr>,
}

fn invalid(reason: Reason, detail: impl Into<String>) -> Error {
    Error::new(reason, detail)
}

impl<'a> Elf<'a> {
    /// Parses and validates the headers of `data`.
    pub fn parse(data: &'a [u8]) -> Result<Elf<'a>> {
        if data.len() < 16 || &data[..4] != b"\x7fELF" {
            return Err(invalid(Reason::NotElf, "no ELF magic"));
        }
        let class = match data[4] {
            ELFCLASS32 => Class { is64: false },
            ELFCLASS64 => Class { is64: true },
            c => return Err(invalid(Reason::BadHeader, format!("unknown ELF class {c}"))),
        };
        if data[5] != ELFDATA2LSB {
            return Err(Error::new(Reason::UnsupportedFormat, "big-endian ELF files are not supported"));
        }
        if data[6] != EV_CURRENT {
            return Err(invalid(Reason::BadHeader, format!("unknown ELF version {}", data[6])));
        }
        if (data.len() as u64) < class.ehdr_size() {
            return Err(invalid(Reason::Truncated, "file ends inside the ELF header"));
        }
        let ehdr = records::read_ehdr(data, class)?;
        let mut elf = Elf { data, class, ehdr, phdrs: Vec::new(), shdrs: Vec::new() };
        elf.read_sections()?;
        elf.read_segments()?;
        Ok(elf)
    }

    fn read_sections(&mut self) -> Result<()> {
        let (data, class) = (self.data, self.class);
        if self.ehdr.e_shoff == 0 {
            return Ok(());
        }
        if u64::from(self.ehdr.e_shentsize) != class.shdr_size() {
            return Err(invalid(
                Reason::BadHeader,
                format!("e_shentsize is {}, expected {}", self.ehdr.e_shentsize, class.shdr_size()),
            ));
        }
        // Extended numbering keeps the real counts in section header 0.
        let first = records::read_shdr(data, class, self.ehdr.e_shoff, 0)?;
        if self.ehdr.shnum == 0 {
            self.ehdr.shnum = first.sh_size;
        }
        if self.ehdr.shstrndx == u64::from(SHN_XINDEX) {
            self.ehdr.shstrndx = u64::from(first.sh_link);
        }
        if self.ehdr.phnum == u64::from(PN_XNUM) {
            self.ehdr.phnum = u64::from(first.sh_info);
        }
        let n = self.ehdr.shnum;
        let table = n.checked_mul(class.shdr_size());
        if table.and_then(|t| t.checked_add(self.ehdr.e_shoff)).is_none_or(|e| e > data.len() as u64) {
            return Err(invalid(
                Reason::Truncated,
                format!(
                    "section header table ({n} entries at {:#x}) lies beyond the end of the file",
                    self.ehdr.e_shoff
                ),
            ));
        }
        let mut shdrs = Vec::with_capacity(n as usize);
        for i in 0..n {
            shdrs.push(records::read_shdr(data, class, self.ehdr.e_shoff, i)?);
        }
        for s in shdrs.iter().skip(1) {
            if s.has_file_data() && s.sh_offset.checked_add(s.sh_size).is_none_or(|e| e > data.len() as u64) {
                return Err(invalid(
                    Reason::Truncated,
                    format!(
                        "section {} ({:#x} bytes at {:#x}) lies beyond the end of the file",
                        s.index, s.sh_size, s.sh_offset
                    ),
                ));
            }
            // Alignments past 4 GiB exist in no linker's output and would blow up the layout.
            if s.sh_addralign > 1 && (!s.sh_addralign.is_power_of_two() || s.sh_addralign > 1 << 32) {
                return Err(invalid(
                    Reason::BadSections,
                    format!("section {} has alignment {:#x}", s.index, s.sh_addralign),
                ));
            }
            if s.is_alloc() && s.sh_addr.checked_add(s.sh_size).is_none() {
                return Err(invalid(Reason::BadSections, format!("section {} wraps the address space", s.index)));
            }
        }
        if self.ehdr.shstrndx as usize >= shdrs.len() {
            return Err(invalid(Reason::BadSections, format!("e_shstrndx {} is out of range", self.ehdr.shstrndx)));
        }
        let strtab = &shdrs[self.ehdr.shstrndx as usize];
        if strtab.sh_type != SHT_STRTAB || !strtab.has_file_data() {
            return Err(invalid(Reason::BadSections, "the section name table is not a string table"));
        }
        // Index 0 may name the null header, which the loop above does not check.
        let names = slice(data, strtab.sh_offset, strtab.sh_size)?;
        for s in shdrs.iter_mut() {
            s.name = c_string(names, u64::from(s.sh_name))
                .ok_or_else(|| invalid(Reason::BadSections, format!("section {} has a bad name offset", s.index)))?
                .to_owned();
        }
        self.shdrs = shdrs;
        Ok(())
    }

    fn read_segments(&mut self) -> Result<()> {
        let (data, class) = (self.data, self.class);
        let n = self.ehdr.phnum;
        if n == 0 {
            return Ok(());
        }
        if u64::from(self.ehdr.e_phentsize) != class.phdr_size() {
            return Err(invalid(
                Reason::BadHeader,
                format!("e_phentsize is {}, expected {}", self.ehdr.e_phentsize, class.phdr_size()),
            ));
        }
        let end = n.checked_mul(class.phdr_size()).and_then(|t| t.checked_add(self.ehdr.e_phoff));
        if end.is_none_or(|e| e > data.len() as u64) {
            return Err(invalid(Reason::Truncated, "program header table lies beyond the end of the file"));
        }
        for i in 0..n {
            let p = records::read_phdr(data, class, self.ehdr.e_phoff + i * class.phdr_size())?;
            let beyond = p.p_offset.checked_add(p.p_filesz).is_none_or(|e| e > data.len() as u64);
            if p.p_filesz > 0 && beyond {
                return Err(invalid(
                    Reason::Truncated,
                    format!(
                        "segment {i} ({:#x} bytes at {:#x}) lies beyond the end of the file",
                        p.p_filesz, p.p_offset
                    ),
                ));
            }
            if p.p_type == PT_LOAD {
                if p.p_filesz > p.p_memsz {
                    return Err(invalid(Reason::BadSegments, format!("segment {i} has p_filesz > p_memsz")));
                }
                if p.p_vaddr.checked_add(p.p_memsz).is_none() {
                    return Err(invalid(Reason::BadSegments, format!("segment {i} wraps the address space")));
                }
                if p.p_align > 1 && !p.p_align.is_power_of_two() {
                    return Err(invalid(Reason::BadSegments, format!("segment {i} has p_align {:#x}", p.p_align)));
                }
                if p.p_align > 1 && p.p_offset % p.p_align != p.p_vaddr % p.p_align {
                    return Err(invalid(
                        Reason::BadSegments,
                        format!("segment {i} has p_offset not congruent to p_vaddr"),
                    ));
                }
            }
            self.phdrs.push(p);
        }
        Ok(())
    }

    /// The PT_LOAD segments in table order.
    pub fn loads(&self) -> impl Iterator<Item = &Phdr> {
        self.phdrs.iter().filter(|p| p.p_type == PT_LOAD)
    }

    /// The file bytes of a section (empty for NOBITS). Parsing checked every section
    /// but the null one, which a corrupt sh_link can still name: that reads as empty.
    pub fn section_data(&self, s: &Shdr) -> &'a [u8] {
        if s.has_file_data() {
            let end = s.sh_offset.saturating_add(s.sh_size);
            self.data.get(s.sh_offset as usize..end as usize).unwrap_or(&[])
        } else {
            &[]
        }
    }

    /// The first section with this name.
    pub fn section(&self, name: &str) -> Option<&Shdr> {
        self.shdrs.iter().find(|s| s.name == name)
    }

    /// The file offset holding the byte at `vaddr`, if a PT_LOAD maps it from the file.
    pub fn vaddr_to_offset(&self, vaddr: u64) -> Option<u64> {
        self.loads().find(|p| p.file_contains(vaddr)).map(|p| vaddr - p.p_vaddr + p.p_offset)
    }

    /// Reads an address-sized word at virtual address `vaddr`.
    pub fn read_word_at(&self, vaddr: u64) -> Result<u64> {
        let off = self
            .vaddr_to_offset(vaddr)
            .ok_or_else(|| invalid(Reason::BadSegments, format!("address {vaddr:#x} is not backed by the file")))?;
        self.class.read_word(self.data, off)
    }

    /// Iterates the entries of the dynamic section (up to DT_NULL).
    pub fn dynamic(&self) -> Result<Vec<(u64, Dyn)>> {
        let Some(s) = self.shdrs.iter().find(|s| s.sh_type == SHT_DYNAMIC) else {
            return Ok(Vec::new());
        };
        records::read_dynamic(self.data, self.class, s)
    }

    /// Symbols of a symbol table section, with the file offset of each entry.
    pub fn symbols(&self, s: &Shdr) -> Result<Vec<(u64, Sym)>> {
        records::read_symbols(self.data, self.class, s)
    }

    /// The name of a symbol of symbol table `table` (None when unnamed or out of range).
    pub fn symbol_name(&self, table: &Shdr, sym: &Sym) -> Option<&'a str> {
        if sym.name == 0 {
            return None;
        }
        let strtab = self.shdrs.get(table.sh_link as usize)?;
        c_string(self.section_data(strtab), u64::from(sym.name))
    }

    /// REL or RELA entries of a relocation section, with the file offset of each entry.
    pub fn relocations(&self, s: &Shdr) -> Result<Vec<(u64, Rel)>> {
        records::read_relocations(self.data, self.class, s)
    }
}

/// The NUL-terminated string at `off` in `table`.
pub fn c_string(table: &[u8], off: u64) -> Option<&str> {
    let rest = table.get(off as usize..)?;
    let end = rest.iter().position(|&b| b == 0)?;
    std::str::from_utf8(&rest[..end]).ok().or(Some("?"))
}

/// Rounds `v` up to a multiple of `align` (a power of two, or 0/1 for none).
pub fn align_up(v: u64, align: u64) -> u64 {
    if align <= 1 {
        v
    } else {
        (v + align - 1) & !(align - 1)
    }
}

/// Rounds `v` down to a multiple of `align` (a power of two, or 0/1 for none).
pub fn align_down(v: u64, align: u64) -> u64 {
    if align <= 1 {
        v
    } else {
        v & !(align - 1)
    }
}
