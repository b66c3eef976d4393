//! A read-only, validated view of a little-endian ELF32/ELF64 file: the ELF header,
//! program headers and section headers, plus class-aware reads at file offsets.
//!
//! Everything the rewriter later trusts (table bounds, entry sizes, section ranges)
//! is checked here once, so the repair modules can index without re-checking.

pub mod consts;
pub mod names;
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
    /// Whether the section is code: allocated, `SHF_EXECINSTR`, with bytes in the file.
    /// The one answer for the core (the layout's code bytes, the windows' coverage, the
    /// hazard scans, the self-check's comparison of moved code).
    pub fn is_code(&self) -> bool {
        self.is_alloc() && self.sh_flags & SHF_EXECINSTR != 0 && self.has_file_data()
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
        let mut elf = Elf::header(data)?;
        elf.read_sections()?;
        elf.read_segments()?;
        Ok(elf)
    }

    /// Parses the header and the section headers of a separate debug file, not its
    /// program headers: those are the stripped file's, whose loaded contents the
    /// debug file leaves out (eu-strip -f keeps them as they were, so they reach
    /// past its end). `phdrs` stays empty.
    pub fn parse_sections(data: &'a [u8]) -> Result<Elf<'a>> {
        let mut elf = Elf::header(data)?;
        elf.read_sections()?;
        Ok(elf)
    }

    /// The ELF header alone, checked; no program or section headers read yet.
    fn header(data: &'a [u8]) -> Result<Elf<'a>> {
        if data.len() < 4 || &data[..4] != b"\x7fELF" {
            return Err(invalid(Reason::NotElf, "no ELF magic"));
        }
        // The magic and then the end: an ELF file cut short (what the probe says too).
        if data.len() < 16 {
            return Err(invalid(Reason::Truncated, "file ends inside the ELF header"));
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
        Ok(Elf { data, class, ehdr, phdrs: Vec::new(), shdrs: Vec::new() })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testelf::{write, Sec};

    // Field offsets inside an ELF64 header and section header (gABI).
    const E_SHOFF: usize = 40;
    const E_SHENTSIZE: usize = 58;
    const E_SHNUM: usize = 60;
    const E_SHSTRNDX: usize = 62;
    const SH_NAME: u64 = 0;
    const SH_TYPE: u64 = 4;
    const SH_FLAGS: u64 = 8;
    const SH_ADDR: u64 = 16;
    const SH_OFFSET: u64 = 24;
    const SH_SIZE: u64 = 32;
    const SH_LINK: u64 = 40;
    const SH_ADDRALIGN: u64 = 48;
    // ELF64 program header fields.
    const P_OFFSET: u64 = 8;
    const P_FILESZ: u64 = 32;

    const TEXT: &[u8] = &[0x90, 0x90, 0xc3];
    // No program headers: .text follows the 64-byte ELF header, .shstrtab
    // ("\0.text\0.shstrtab\0", 17 bytes) follows .text, and the section header table
    // (null, .text, .shstrtab) starts at the next multiple of 8 after 67 + 17.
    const TEXT_OFF: u64 = 64;
    const NAMES_OFF: u64 = 67;
    const NAMES_LEN: u64 = 17;
    const SHOFF: u64 = 88;
    const TEXT_NAME: u32 = 1;
    const SHSTRTAB_NAME: u32 = 7;

    fn file() -> Vec<u8> {
        let mut text = Sec::new(".text", SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR, TEXT.to_vec());
        text.addr = 0x1000;
        write(ET_DYN, 0, &[], vec![text])
    }

    fn put(data: &mut [u8], at: usize, bytes: &[u8]) {
        data[at..at + bytes.len()].copy_from_slice(bytes);
    }

    /// Overwrites field `field` of section header `index` with the u64 `v`.
    fn put_shdr(data: &mut [u8], index: u64, field: u64, v: u64) {
        let at = (SHOFF + index * 64 + field) as usize;
        match field {
            SH_NAME | SH_TYPE | SH_LINK => put(data, at, &(v as u32).to_le_bytes()),
            _ => put(data, at, &v.to_le_bytes()),
        }
    }

    fn refused(data: &[u8]) -> Reason {
        match Elf::parse(data) {
            Ok(_) => panic!("parsed a file that must be refused"),
            Err(e) => e.reason,
        }
    }

    #[test]
    fn section_headers_and_names_are_read_where_the_layout_puts_them() {
        let data = file();
        assert_eq!(read_u64(&data, E_SHOFF as u64).unwrap(), SHOFF);
        let elf = Elf::parse(&data).unwrap();
        assert!(elf.class.is64);
        assert_eq!((elf.ehdr.shnum, elf.ehdr.shstrndx), (3, 2));
        let names: Vec<&str> = elf.shdrs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["", ".text", ".shstrtab"]);
        let text = elf.section(".text").unwrap();
        assert_eq!((text.index, text.sh_name, text.sh_type), (1, TEXT_NAME, SHT_PROGBITS));
        assert_eq!((text.sh_addr, text.sh_offset, text.sh_size), (0x1000, TEXT_OFF, TEXT.len() as u64));
        assert_eq!(text.sh_flags, SHF_ALLOC | SHF_EXECINSTR);
        assert_eq!(elf.section_data(text), TEXT);
        let names = elf.section(".shstrtab").unwrap();
        assert_eq!((names.sh_name, names.sh_offset, names.sh_size), (SHSTRTAB_NAME, NAMES_OFF, NAMES_LEN));
        assert_eq!(elf.section_data(names), b"\0.text\0.shstrtab\0");
        assert!(elf.phdrs.is_empty());
    }

    #[test]
    fn elf32_fields_are_read_at_their_own_offsets() {
        // ELF32 header (52 bytes), the name table, .data, then three 40-byte headers.
        let names = b"\0.data\0.shstrtab\0";
        let (names_off, data_off, shoff) = (52u32, 69u32, 76u32);
        let mut d = vec![0u8; shoff as usize];
        put(&mut d, 0, &[0x7f, b'E', b'L', b'F', ELFCLASS32, ELFDATA2LSB, EV_CURRENT]);
        put(&mut d, 16, &ET_DYN.to_le_bytes());
        put(&mut d, 18, &EM_386.to_le_bytes());
        put(&mut d, 32, &shoff.to_le_bytes()); // e_shoff
        put(&mut d, 40, &52u16.to_le_bytes()); // e_ehsize
        put(&mut d, 46, &40u16.to_le_bytes()); // e_shentsize
        put(&mut d, 48, &3u16.to_le_bytes()); // e_shnum
        put(&mut d, 50, &2u16.to_le_bytes()); // e_shstrndx
        put(&mut d, names_off as usize, names);
        put(&mut d, data_off as usize, &[1, 2, 3, 4]);
        // Every field distinct, so that two swapped fields cannot pass.
        #[allow(clippy::too_many_arguments)]
        let shdr = |name: u32,
                    kind: u32,
                    flags: u32,
                    addr: u32,
                    off: u32,
                    size: u32,
                    link: u32,
                    info: u32,
                    align: u32,
                    entsize: u32|
         -> Vec<u8> {
            [name, kind, flags, addr, off, size, link, info, align, entsize]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect()
        };
        let headers: Vec<Vec<u8>> = vec![
            vec![0; 40],
            shdr(1, SHT_PROGBITS, (SHF_ALLOC | SHF_WRITE) as u32, 0x2000, data_off, 4, 5, 6, 4, 2),
            shdr(7, SHT_STRTAB, 0, 0, names_off, names.len() as u32, 0, 0, 1, 0),
        ];
        d.extend(headers.concat());
        let elf = Elf::parse(&d).unwrap();
        assert!(!elf.class.is64);
        let s = elf.section(".data").unwrap();
        assert_eq!((s.sh_type, s.sh_flags, s.sh_addr), (SHT_PROGBITS, SHF_ALLOC | SHF_WRITE, 0x2000));
        assert_eq!((s.sh_offset, s.sh_size, s.sh_link, s.sh_info), (69, 4, 5, 6));
        assert_eq!((s.sh_addralign, s.sh_entsize), (4, 2));
        assert_eq!(elf.section_data(s), [1, 2, 3, 4]);
        // A table one byte short of its third header.
        assert_eq!(refused(&d[..d.len() - 1]), Reason::Truncated);
    }

    #[test]
    fn extended_numbering_takes_the_counts_from_section_zero() {
        let mut data = file();
        put(&mut data, E_SHNUM, &0u16.to_le_bytes());
        put(&mut data, E_SHSTRNDX, &SHN_XINDEX.to_le_bytes());
        put_shdr(&mut data, 0, SH_SIZE, 3);
        put_shdr(&mut data, 0, SH_LINK, 2);
        let elf = Elf::parse(&data).unwrap();
        assert_eq!((elf.ehdr.shnum, elf.ehdr.shstrndx), (3, 2));
        assert_eq!(elf.shdrs[1].name, ".text");
    }

    #[test]
    fn every_proper_prefix_is_refused_as_truncated_or_not_elf() {
        // Without the whole magic a prefix is no ELF file; with it, an ELF file cut
        // short, whichever entry point reads it: the parser and the probe agree.
        let data = file();
        for n in 0..data.len() {
            let want = if n < 4 { Reason::NotElf } else { Reason::Truncated };
            assert_eq!(refused(&data[..n]), want, "prefix of {n} bytes");
            let probed = crate::probe::probe(&data[..n]).and_then(|p| p.problem).map(|e| e.reason);
            assert_eq!(probed, (n >= 4).then_some(Reason::Truncated), "probe of a prefix of {n} bytes");
        }
    }

    #[test]
    fn sections_beyond_the_file_are_truncated_not_a_panic() {
        let len = file().len() as u64;
        // Ends one byte past the file; size wraps u64 arithmetic.
        for (off, size) in [(len - 2, 3), (TEXT_OFF, u64::MAX), (u64::MAX, 1)] {
            let mut data = file();
            put_shdr(&mut data, 1, SH_OFFSET, off);
            put_shdr(&mut data, 1, SH_SIZE, size);
            assert_eq!(refused(&data), Reason::Truncated, "{off:#x}+{size:#x}");
        }
        // The same section as NOBITS has no file bytes to check, and reads as empty.
        let mut data = file();
        put_shdr(&mut data, 1, SH_TYPE, u64::from(SHT_NOBITS));
        put_shdr(&mut data, 1, SH_OFFSET, len + 0x1000);
        let elf = Elf::parse(&data).unwrap();
        assert_eq!(elf.section_data(&elf.shdrs[1]), b"");
        assert_eq!(elf.shdrs[1].fend(), len + 0x1000);
    }

    #[test]
    fn a_section_table_beyond_the_file_is_truncated() {
        for (field, v) in [(E_SHNUM, 0xfffe_u64), (E_SHOFF, u64::MAX - 8), (E_SHOFF, SHOFF + 1)] {
            let mut data = file();
            if field == E_SHNUM {
                put(&mut data, field, &(v as u16).to_le_bytes());
            } else {
                put(&mut data, field, &v.to_le_bytes());
            }
            assert_eq!(refused(&data), Reason::Truncated, "field at {field} = {v:#x}");
        }
    }

    #[test]
    fn overlapping_sections_read_the_shared_bytes() {
        // Overlap is the layout's judgement (layout.rs refuses overlapping loads); the
        // reader hands out each section's own bytes.
        let mut data = file();
        put_shdr(&mut data, 1, SH_OFFSET, NAMES_OFF + 1);
        let elf = Elf::parse(&data).unwrap();
        assert_eq!(elf.section_data(&elf.shdrs[1]), b".te");
    }

    #[test]
    fn bad_name_tables_and_indices_are_bad_sections() {
        type Corruption = (&'static str, fn(&mut Vec<u8>));
        let cases: [Corruption; 6] = [
            ("e_shstrndx out of range", |d| put(d, E_SHSTRNDX, &3u16.to_le_bytes())),
            ("name table is PROGBITS", |d| put(d, E_SHSTRNDX, &1u16.to_le_bytes())),
            ("name past the table", |d| put_shdr(d, 1, SH_NAME, NAMES_LEN)),
            ("alignment not a power of two", |d| put_shdr(d, 1, SH_ADDRALIGN, 24)),
            ("alignment past 4 GiB", |d| put_shdr(d, 1, SH_ADDRALIGN, 1 << 33)),
            ("allocated section wraps", |d| put_shdr(d, 1, SH_ADDR, u64::MAX - 1)),
        ];
        for (what, corrupt) in cases {
            let mut data = file();
            corrupt(&mut data);
            assert_eq!(refused(&data), Reason::BadSections, "{what}");
        }
        // The same wrapping address on a section that is not allocated is no address.
        let mut data = file();
        put_shdr(&mut data, 1, SH_ADDR, u64::MAX - 1);
        put_shdr(&mut data, 1, SH_FLAGS, 0);
        assert!(Elf::parse(&data).is_ok());
        // The last NUL of the table names a section "" rather than failing.
        let mut data = file();
        put_shdr(&mut data, 1, SH_NAME, NAMES_LEN - 1);
        assert_eq!(Elf::parse(&data).unwrap().shdrs[1].name, "");
    }

    #[test]
    fn bad_identification_and_entry_sizes_have_their_own_reasons() {
        let mut data = file();
        put(&mut data, E_SHENTSIZE, &40u16.to_le_bytes());
        assert_eq!(refused(&data), Reason::BadHeader);
        let mut data = file();
        data[4] = 3; // no such class
        assert_eq!(refused(&data), Reason::BadHeader);
        let mut data = file();
        data[5] = 2; // ELFDATA2MSB
        assert_eq!(refused(&data), Reason::UnsupportedFormat);
        let mut data = file();
        data[0] = b'E';
        assert_eq!(refused(&data), Reason::NotElf);
    }

    fn load(offset: u64, vaddr: u64, filesz: u64, memsz: u64, align: u64) -> Phdr {
        let (p_type, p_flags, p_paddr) = (PT_LOAD, PF_R | PF_X, vaddr);
        Phdr {
            p_type,
            p_flags,
            p_offset: offset,
            p_vaddr: vaddr,
            p_paddr,
            p_filesz: filesz,
            p_memsz: memsz,
            p_align: align,
        }
    }

    #[test]
    fn segments_map_addresses_and_bad_ones_are_refused() {
        let data = write(ET_DYN, 0, &[load(0, 0x1000, 0x200, 0x300, 0x1000)], vec![]);
        let elf = Elf::parse(&data).unwrap();
        assert_eq!(elf.loads().count(), 1);
        assert_eq!(elf.vaddr_to_offset(0x1080), Some(0x80));
        // Past p_filesz the bytes are zero-fill, not the file's; before p_vaddr nothing.
        assert_eq!((elf.vaddr_to_offset(0x1200), elf.vaddr_to_offset(0xfff)), (None, None));
        let bad = [
            (load(0, 0x1000, 0x300, 0x200, 0x1000), Reason::BadSegments), // filesz > memsz
            (load(0x10, 0x1020, 0x10, 0x10, 0x1000), Reason::BadSegments), // not congruent
            (load(0, 0x1000, 0x10, 0x10, 0x3000), Reason::BadSegments),   // align
            (load(0, u64::MAX - 0xf, 0x10, 0x20, 0), Reason::BadSegments), // wraps
        ];
        for (p, reason) in bad {
            assert_eq!(refused(&write(ET_DYN, 0, &[p], vec![])), reason, "{p:?}");
        }
        let mut data = write(ET_DYN, 0, &[load(0, 0, 0x100, 0x100, 0)], vec![]);
        put(&mut data, (64 + P_FILESZ) as usize, &0x10_0000u64.to_le_bytes());
        assert_eq!(refused(&data), Reason::Truncated);
        put(&mut data, (64 + P_OFFSET) as usize, &u64::MAX.to_le_bytes());
        assert_eq!(refused(&data), Reason::Truncated);
    }

    fn with_section(kind: u32, entsize: u64, data: Vec<u8>) -> Vec<u8> {
        let mut s = Sec::new(".table", kind, SHF_ALLOC, data);
        s.entsize = entsize;
        write(ET_DYN, 0, &[], vec![s])
    }

    #[test]
    fn dynamic_entries_end_at_dt_null_and_a_missing_one_is_an_error() {
        let entry = |tag: i64, val: u64| [tag.to_le_bytes(), val.to_le_bytes()].concat();
        let data = with_section(SHT_DYNAMIC, 16, [entry(DT_SONAME, 5), entry(DT_NULL, 0), entry(DT_INIT, 9)].concat());
        let elf = Elf::parse(&data).unwrap();
        let dynamic = elf.dynamic().unwrap();
        assert_eq!(dynamic.len(), 1);
        assert_eq!((dynamic[0].0, dynamic[0].1.tag, dynamic[0].1.val), (TEXT_OFF, DT_SONAME, 5));
        let data = with_section(SHT_DYNAMIC, 16, entry(DT_SONAME, 5));
        assert_eq!(Elf::parse(&data).unwrap().dynamic().err().unwrap().reason, Reason::BadDynamic);
    }

    #[test]
    fn symbols_and_relocations_are_whole_entries() {
        // Elf64_Sym: st_name, st_info, st_other, st_shndx, st_value, st_size.
        let sym = [
            &7u32.to_le_bytes()[..],
            &[STT_FUNC, 0],
            &1u16.to_le_bytes(),
            &0x1234u64.to_le_bytes(),
            &16u64.to_le_bytes(),
        ]
        .concat();
        let data = with_section(SHT_SYMTAB, 24, sym.clone());
        let elf = Elf::parse(&data).unwrap();
        let syms = elf.symbols(&elf.shdrs[1]).unwrap();
        let (off, s) = syms[0];
        assert_eq!((off, s.name, s.kind(), s.shndx, s.value, s.size), (TEXT_OFF, 7, STT_FUNC, 1, 0x1234, 16));
        let data = with_section(SHT_SYMTAB, 24, [sym, vec![0]].concat());
        let elf = Elf::parse(&data).unwrap();
        assert_eq!(elf.symbols(&elf.shdrs[1]).err().unwrap().reason, Reason::BadSymbols);
        // Elf64_Rela: r_offset, r_info (symbol << 32 | type), r_addend.
        let (symbol, kind) = (3u64, 5u64);
        let rela = [0x2000u64.to_le_bytes(), (symbol << 32 | kind).to_le_bytes(), (-4i64).to_le_bytes()].concat();
        let data = with_section(SHT_RELA, 24, rela.clone());
        let elf = Elf::parse(&data).unwrap();
        let (off, r) = elf.relocations(&elf.shdrs[1]).unwrap()[0];
        assert_eq!((off, r.offset, r.sym, r.kind, r.addend), (TEXT_OFF, 0x2000, 3, 5, Some(-4)));
        // The same 24 bytes as REL are one and a half entries.
        let data = with_section(SHT_REL, 16, rela);
        let elf = Elf::parse(&data).unwrap();
        assert_eq!(elf.relocations(&elf.shdrs[1]).err().unwrap().reason, Reason::BadRelocations);
    }

    #[test]
    fn notes_give_the_build_id_and_a_truncated_note_is_bad_notes() {
        // Elf_Nhdr: namesz, descsz, type; "GNU\0"; the descriptor padded to 4.
        let note = |descsz: u32| {
            [
                &4u32.to_le_bytes()[..],
                &descsz.to_le_bytes(),
                &NT_GNU_BUILD_ID.to_le_bytes(),
                b"GNU\0",
                &[0xab, 0xcd, 0xef, 0],
            ]
            .concat()
        };
        let mut s = Sec::new(".note.gnu.build-id", SHT_NOTE, SHF_ALLOC, note(3));
        s.align = 4;
        let data = write(ET_DYN, 0, &[], vec![s]);
        let elf = Elf::parse(&data).unwrap();
        assert_eq!(notes::build_id(&elf).unwrap(), Some((TEXT_OFF + 16, &[0xab, 0xcd, 0xef][..])));
        let mut s = Sec::new(".note.gnu.build-id", SHT_NOTE, SHF_ALLOC, note(5));
        s.align = 4;
        let data = write(ET_DYN, 0, &[], vec![s]);
        assert_eq!(notes::build_id(&Elf::parse(&data).unwrap()).err().unwrap().reason, Reason::BadNotes);
    }

    #[test]
    fn c_strings_need_their_terminator() {
        assert_eq!(c_string(b"ab\0cd", 0), Some("ab"));
        assert_eq!(c_string(b"ab\0cd", 3), None);
        assert_eq!(c_string(b"ab\0cd", 9), None);
        assert_eq!(c_string(b"\xff\0", 0), Some("?"));
    }
}
