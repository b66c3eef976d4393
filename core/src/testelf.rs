//! ELF64 x86-64 files built in memory, so that the core's unit tests and the DWARF
//! fuzz target run in milliseconds without toolchains: [`write`] lays out headers and
//! sections; for tests, [`TestElf`] makes files of program headers alone and [`Dso`]
//! complete, consistent shared objects that every mode can transform.
//!
//! `write` is compiled into every build because `fuzzing::dwarf` wraps its input
//! with it; the rest exists only under `cfg(test)`.

use crate::elf::consts::*;
use crate::elf::{align_up, Class, Phdr, Shdr};

const C64: Class = Class { is64: true };
const EHDR_SIZE: u64 = 64;
const PHDR_SIZE: u64 = 56;

/// One section to write.
pub(crate) struct Sec {
    pub name: &'static str,
    pub sh_type: u32,
    pub flags: u64,
    pub addr: u64,
    /// File offset; `None` places the section after everything before it.
    pub offset: Option<u64>,
    pub align: u64,
    pub link: u32,
    pub info: u32,
    pub entsize: u64,
    pub data: Vec<u8>,
}

impl Sec {
    /// A section at address 0, placed after what precedes it, byte-aligned.
    pub fn new(name: &'static str, sh_type: u32, flags: u64, data: Vec<u8>) -> Sec {
        Sec { name, sh_type, flags, addr: 0, offset: None, align: 1, link: 0, info: 0, entsize: 0, data }
    }
}

/// The bytes of a little-endian ELF64 x86-64 file: the ELF header, `phdrs` right
/// after it, the file padded to cover every segment, then `sections` (indices from
/// 1, in order), a `.shstrtab` and the section header table. Without sections the
/// file has no section headers at all.
pub(crate) fn write(e_type: u16, entry: u64, phdrs: &[Phdr], sections: Vec<Sec>) -> Vec<u8> {
    write_for(EM_X86_64, e_type, entry, phdrs, sections)
}

/// [`write`] for another machine (`e_machine`).
pub(crate) fn write_for(machine: u16, e_type: u16, entry: u64, phdrs: &[Phdr], mut sections: Vec<Sec>) -> Vec<u8> {
    let mut out = vec![0u8; (EHDR_SIZE + PHDR_SIZE * phdrs.len() as u64) as usize];
    for (i, p) in phdrs.iter().enumerate() {
        let at = (EHDR_SIZE + PHDR_SIZE * i as u64) as usize;
        out[at..at + PHDR_SIZE as usize].copy_from_slice(&C64.encode_phdr(p));
    }
    let end = phdrs.iter().map(Phdr::fend).fold(out.len() as u64, u64::max);
    out.resize(end as usize, 0);

    let (mut shoff, mut shnum) = (0u64, 0u16);
    if !sections.is_empty() {
        let mut names = vec![0u8];
        let mut name_offsets = Vec::new();
        for name in sections.iter().map(|s| s.name).chain([".shstrtab"]) {
            name_offsets.push(names.len() as u32);
            names.extend_from_slice(name.as_bytes());
            names.push(0);
        }
        sections.push(Sec::new(".shstrtab", SHT_STRTAB, 0, names));
        let null = Sec { align: 0, ..Sec::new("", SHT_NULL, 0, Vec::new()) };
        let mut table = C64.encode_shdr(&shdr(0, &null, 0, 0));
        for (i, s) in sections.iter().enumerate() {
            let off = s.offset.unwrap_or_else(|| align_up(out.len() as u64, s.align));
            if s.sh_type != SHT_NOBITS {
                let end = off as usize + s.data.len();
                out.resize(out.len().max(end), 0);
                out[off as usize..end].copy_from_slice(&s.data);
            }
            table.extend(C64.encode_shdr(&shdr(i + 1, s, name_offsets[i], off)));
        }
        shoff = align_up(out.len() as u64, 8);
        out.resize(shoff as usize, 0);
        out.extend(table);
        shnum = sections.len() as u16 + 1;
    }

    out[..8].copy_from_slice(&[0x7f, b'E', b'L', b'F', ELFCLASS64, ELFDATA2LSB, EV_CURRENT, 0]);
    out[16..18].copy_from_slice(&e_type.to_le_bytes());
    out[18..20].copy_from_slice(&machine.to_le_bytes());
    out[20..24].copy_from_slice(&1u32.to_le_bytes()); // e_version
    out[24..32].copy_from_slice(&entry.to_le_bytes());
    out[32..40].copy_from_slice(&(if phdrs.is_empty() { 0 } else { EHDR_SIZE }).to_le_bytes());
    out[40..48].copy_from_slice(&shoff.to_le_bytes());
    out[52..54].copy_from_slice(&(EHDR_SIZE as u16).to_le_bytes());
    out[54..56].copy_from_slice(&(PHDR_SIZE as u16).to_le_bytes());
    out[56..58].copy_from_slice(&(phdrs.len() as u16).to_le_bytes());
    out[58..60].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
    out[60..62].copy_from_slice(&shnum.to_le_bytes());
    out[62..64].copy_from_slice(&shnum.saturating_sub(1).to_le_bytes()); // .shstrtab is last
    out
}

fn shdr(index: usize, s: &Sec, sh_name: u32, sh_offset: u64) -> Shdr {
    Shdr {
        index,
        name: String::new(),
        sh_name,
        sh_type: s.sh_type,
        sh_flags: s.flags,
        sh_addr: s.addr,
        sh_offset,
        sh_size: s.data.len() as u64,
        sh_link: s.link,
        sh_info: s.info,
        sh_addralign: s.align,
        sh_entsize: s.entsize,
    }
}

#[cfg(test)]
pub(crate) use for_tests::*;

#[cfg(test)]
mod for_tests {
    use super::*;
    use crate::{transform_to_vec, ModeChoice, Options, Transformed};
    use std::io::Write;

    /// One PT_LOAD to put in a [`TestElf`].
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

        /// A read-only load of `size` file bytes, 4 KiB aligned.
        pub fn data(offset: u64, vaddr: u64, size: u64) -> Seg {
            Seg { flags: PF_R, ..Seg::code(offset, vaddr, size) }
        }
    }

    /// A file of program headers alone, each load filled with trap bytes.
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
            let phdrs: Vec<Phdr> =
                self.segs.iter().map(|s| load(s.flags, s.offset, s.vaddr, s.size, s.size, s.align)).collect();
            let mut out = write(self.e_type, 0, &phdrs, Vec::new());
            let headers = EHDR_SIZE + PHDR_SIZE * phdrs.len() as u64;
            for s in &self.segs {
                out[s.offset.max(headers) as usize..(s.offset + s.size) as usize].fill(0xcc);
            }
            out
        }
    }

    /// A PT_LOAD header.
    pub fn load(flags: u32, offset: u64, vaddr: u64, filesz: u64, memsz: u64, align: u64) -> Phdr {
        Phdr {
            p_type: PT_LOAD,
            p_flags: flags,
            p_offset: offset,
            p_vaddr: vaddr,
            p_paddr: vaddr,
            p_filesz: filesz,
            p_memsz: memsz,
            p_align: align,
        }
    }

    /// How a [`Dso`]'s loads are arranged: the layout classes `layout::analyse` names.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Arrangement {
        /// `R | RX | R | RW` (GNU ld `-z separate-code`): metadata alone in the first load.
        SeparateCode,
        /// `RX | RW`: headers, metadata, code and read-only data in the first load.
        TextInFirst,
        /// `R | RX | RW` with .rodata before the code, later loads one page above their
        /// offsets (lld).
        RodataFirst,
    }

    /// Debug information a [`Dso`] carries.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Debug {
        /// None.
        None,
        /// .debug_abbrev, .debug_info (DWARF 4) and .debug_aranges.
        Plain,
        /// The same, SHF_COMPRESSED with zlib.
        Zlib,
    }

    /// A shared object with what the repairs read: a build-id note, .dynsym and
    /// .dynstr, .rela.dyn with R_X86_64_RELATIVE entries, .text, .rodata,
    /// .eh_frame_hdr and .eh_frame, .dynamic, .got, .data, .symtab and .strtab, a
    /// stapsdt probe note and annobin notes. Some values deliberately point at what
    /// stays (below the split point), so tests see both sides of it.
    pub struct Dso {
        /// How the loads are arranged.
        pub arrangement: Arrangement,
        /// Size of .text; it starts with `code`, the rest is trap bytes.
        pub text_size: u64,
        /// The first bytes of .text.
        pub code: Vec<u8>,
        /// Alignment of .rodata (the largest alignment among what moves).
        pub rodata_align: u64,
        /// Size of .rodata (a constant table: byte i holds i mod 256).
        pub rodata_size: u64,
        /// lld's file layout (`-z noseparate-code`): each load after the first starts
        /// in the file right after the one before it, at an address on the next page
        /// congruent to that offset, so a load's first and last file pages hold bytes of
        /// its neighbours. Otherwise every load starts on a page of its own.
        pub contiguous: bool,
        /// Whether .eh_frame and .eh_frame_hdr (and PT_GNU_EH_FRAME) exist.
        pub eh_frame: bool,
        /// The debug sections.
        pub debug: Debug,
        /// More global .symtab symbols: (name, section whose address is its value).
        pub symbols: Vec<(&'static str, &'static str)>,
        /// More non-allocated sections: (name, contents).
        pub extra: Vec<(&'static str, Vec<u8>)>,
        /// `e_machine`: EM_X86_64 or EM_AARCH64 (its RELATIVE relocation type).
        pub machine: u16,
        /// The page the linker lays loads out for (its max-page-size): 4 KiB, or 64 KiB
        /// as GNU ld and lld do for aarch64.
        pub page: u64,
    }

    /// Where the builder put a section.
    #[derive(Clone, Copy, Debug)]
    pub struct Placed {
        /// Its name.
        pub name: &'static str,
        /// Its address.
        pub addr: u64,
        /// Its file offset.
        pub offset: u64,
        /// Its size.
        pub size: u64,
    }

    /// A built file and where its allocated sections lie.
    pub struct Built {
        /// The file.
        pub data: Vec<u8>,
        /// Allocated sections in address order.
        pub placed: Vec<Placed>,
    }

    impl Built {
        /// The allocated section `name`.
        pub fn sec(&self, name: &str) -> Placed {
            *self.placed.iter().find(|p| p.name == name).unwrap_or_else(|| panic!("no section {name}"))
        }
        /// The address of allocated section `name`.
        pub fn addr(&self, name: &str) -> u64 {
            self.sec(name).addr
        }
    }

    /// The build-id note's section.
    pub const NOTE: &str = ".note.gnu.build-id";
    /// The build-id the builder writes.
    pub const BUILD_ID: [u8; 20] =
        [0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf, 1, 2, 3, 4];
    const DYNSTR: &[u8] = b"\0func\0object\0undef\0libtest.so\0";
    const SONAME_AT: u64 = 19;
    const PAGE: u64 = 0x1000;
    const STT_FUNC_GLOBAL: u8 = 0x12;
    const STT_OBJECT_GLOBAL: u8 = 0x11;

    /// Offsets into .text that values of the file name.
    pub mod at {
        /// .dynsym's and .symtab's `func`.
        pub const FUNC: u64 = 0x10;
        /// The target of the first RELATIVE relocation (a GNU ld style copy in place).
        pub const RELATIVE_TARGET: u64 = 0x20;
        /// The stapsdt probe's pc.
        pub const PROBE: u64 = 0x30;
        /// The value of the local absolute symbol `abs_marker`.
        pub const ABS: u64 = 0x40;
    }

    impl Dso {
        /// A file of `arrangement` with `text_size` bytes of code, .eh_frame and no debug info.
        pub fn new(arrangement: Arrangement, text_size: u64) -> Dso {
            Dso {
                arrangement,
                text_size,
                code: Vec::new(),
                rodata_align: 16,
                rodata_size: 0x40,
                contiguous: false,
                eh_frame: true,
                debug: Debug::None,
                symbols: Vec::new(),
                extra: Vec::new(),
                machine: EM_X86_64,
                page: PAGE,
            }
        }

        /// The file's bytes.
        pub fn build(&self) -> Built {
            use Arrangement::*;
            // (name, type, flags, alignment, size) of every allocated section, per load.
            let meta = [
                (NOTE, SHT_NOTE, SHF_ALLOC, 4, 36),
                (".dynsym", SHT_DYNSYM, SHF_ALLOC, 8, 4 * 24),
                (".dynstr", SHT_STRTAB, SHF_ALLOC, 1, DYNSTR.len() as u64),
                (".rela.dyn", SHT_RELA, SHF_ALLOC, 8, 3 * 24),
            ];
            let text = [(".text", SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR, 16, self.text_size)];
            let mut ro = vec![(".rodata", SHT_PROGBITS, SHF_ALLOC, self.rodata_align, self.rodata_size)];
            if self.eh_frame {
                ro.push((".eh_frame_hdr", SHT_PROGBITS, SHF_ALLOC, 4, 28));
                ro.push((".eh_frame", SHT_PROGBITS, SHF_ALLOC, 8, 76));
            }
            let rw = [
                (".dynamic", SHT_DYNAMIC, SHF_ALLOC | SHF_WRITE, 8, 11 * 16),
                (".got", SHT_PROGBITS, SHF_ALLOC | SHF_WRITE, 8, 24),
                (".data", SHT_PROGBITS, SHF_ALLOC | SHF_WRITE, 8, 32),
            ];
            let (r, rx, rw_) = (PF_R, PF_R | PF_X, PF_R | PF_W);
            let loads: Vec<(u32, Vec<_>)> = match self.arrangement {
                SeparateCode => vec![(r, meta.to_vec()), (rx, text.to_vec()), (r, ro), (rw_, rw.to_vec())],
                TextInFirst => vec![(rx, [&meta[..], &text[..], &ro[..]].concat()), (rw_, rw.to_vec())],
                RodataFirst => vec![(r, [&meta[..], &ro[..]].concat()), (rx, text.to_vec()), (rw_, rw.to_vec())],
            };
            let page = self.page;
            let skew = if self.arrangement == RodataFirst { page } else { 0 };
            let phnum = loads.len() as u64 + 3 + u64::from(self.eh_frame);

            let mut placed = Vec::new();
            let mut phdrs = Vec::new();
            let mut cursor = EHDR_SIZE + PHDR_SIZE * phnum;
            let mut types = Vec::new();
            for (i, (flags, secs)) in loads.iter().enumerate() {
                // Linkers start and align a load by its most aligned section.
                let align = secs.iter().map(|s| s.3).fold(page, u64::max);
                let (start, skew) = match (i, self.contiguous) {
                    (0, _) => (0, 0),
                    (_, false) => (align_up(cursor, align), skew),
                    (_, true) => {
                        let start = align_up(cursor, secs.iter().map(|s| s.3).fold(1, u64::max));
                        let vend = phdrs.last().map_or(0, Phdr::vend);
                        (start, align_up(vend, page) + start % page - start)
                    }
                };
                cursor = cursor.max(start);
                for &(name, sh_type, sh_flags, align, size) in secs {
                    cursor = align_up(cursor, align);
                    placed.push(Placed { name, addr: cursor + skew, offset: cursor, size });
                    types.push((sh_type, sh_flags, align));
                    cursor += size;
                }
                phdrs.push(load(*flags, start, start + skew, cursor - start, cursor - start, align));
            }
            let b = Built { data: Vec::new(), placed };
            let a = |name| b.addr(name);
            let (text, text_end) = (a(".text"), a(".text") + self.text_size);
            let segment = |p_type, flags, name: &str, align| {
                let s = b.sec(name);
                Phdr {
                    p_type,
                    p_flags: flags,
                    p_offset: s.offset,
                    p_vaddr: s.addr,
                    p_paddr: s.addr,
                    p_filesz: s.size,
                    p_memsz: s.size,
                    p_align: align,
                }
            };
            phdrs.push(segment(PT_DYNAMIC, rw_, ".dynamic", 8));
            phdrs.push(segment(PT_NOTE, r, NOTE, 4));
            if self.eh_frame {
                phdrs.push(segment(PT_GNU_EH_FRAME, r, ".eh_frame_hdr", 4));
            }
            phdrs.push(Phdr { p_type: PT_GNU_STACK, p_flags: rw_, ..load(0, 0, 0, 0, 0, 16) });

            // Section indices: allocated sections in address order, then the others.
            let mut names: Vec<&'static str> = b.placed.iter().map(|p| p.name).collect();
            names.extend([".symtab", ".strtab", ".gnu.build.attributes", ".note.stapsdt"]);
            let debug = self.debug_sections(text, text_end, a(".dynstr"));
            names.extend(debug.iter().map(|s| s.0));
            names.extend(self.extra.iter().map(|s| s.0));
            let index = |name: &str| names.iter().position(|n| *n == name).expect("a section") as u16 + 1;

            let mut contents = vec![Vec::new(); b.placed.len()];
            let mut put = |name: &str, bytes: Vec<u8>| {
                let i = b.placed.iter().position(|p| p.name == name).expect("a section");
                assert_eq!(bytes.len() as u64, b.placed[i].size, "{name}");
                contents[i] = bytes;
            };
            let mut note = [4u32.to_le_bytes(), 20u32.to_le_bytes(), NT_GNU_BUILD_ID.to_le_bytes()].concat();
            note.extend(b"GNU\0");
            note.extend(BUILD_ID);
            put(NOTE, note);
            put(
                ".dynsym",
                [
                    sym(0, 0, 0, 0),
                    sym(1, STT_FUNC_GLOBAL, index(".text"), text + at::FUNC),
                    sym(6, STT_OBJECT_GLOBAL, index(".data"), a(".data")),
                    sym(13, STT_FUNC_GLOBAL, SHN_UNDEF, 0),
                ]
                .concat(),
            );
            put(".dynstr", DYNSTR.to_vec());
            let data = a(".data");
            let relative = |place: u64, addend: u64| {
                let kind = if self.machine == EM_AARCH64 { R_AARCH64_RELATIVE } else { R_X86_64_RELATIVE };
                [place.to_le_bytes(), u64::from(kind).to_le_bytes(), addend.to_le_bytes()].concat()
            };
            put(
                ".rela.dyn",
                [
                    relative(data, text + at::RELATIVE_TARGET),
                    relative(data + 8, a(".rodata") + 8),
                    relative(data + 16, a(".dynstr")),
                ]
                .concat(),
            );
            let mut code = self.code.clone();
            code.resize(self.text_size as usize, 0xcc);
            put(".text", code);
            put(".rodata", (0..self.rodata_size).map(|i| i as u8).collect());
            if self.eh_frame {
                let (hdr, frame) = (a(".eh_frame_hdr"), a(".eh_frame"));
                put(".eh_frame", eh_frame(frame, text, a(".dynstr")));
                put(".eh_frame_hdr", eh_frame_hdr(hdr, frame, text, a(".dynstr")));
            }
            let dynamic: Vec<(i64, u64)> = vec![
                (DT_SONAME, SONAME_AT),
                (DT_INIT, text),
                (DT_STRTAB, a(".dynstr")),
                (DT_SYMTAB, a(".dynsym")),
                (DT_STRSZ, DYNSTR.len() as u64),
                (DT_SYMENT, 24),
                (DT_RELA, a(".rela.dyn")),
                (DT_RELASZ, 3 * 24),
                (DT_RELAENT, 24),
                (DT_PLTGOT, a(".got")),
                (DT_NULL, 0),
            ];
            put(".dynamic", dynamic.iter().flat_map(|&(t, v)| [t.to_le_bytes(), v.to_le_bytes()].concat()).collect());
            put(".got", words(&[a(".dynamic"), 0, 0]));
            // The fourth word holds a moved address without a relocation: nothing may change it.
            put(".data", words(&[text + at::RELATIVE_TARGET, 0, a(".dynstr"), text + at::RELATIVE_TARGET]));

            let mut secs = Vec::new();
            for (p, (bytes, &(sh_type, flags, align))) in b.placed.iter().zip(contents.into_iter().zip(&types)) {
                let mut s =
                    Sec { addr: p.addr, offset: Some(p.offset), align, ..Sec::new(p.name, sh_type, flags, bytes) };
                match p.name {
                    ".dynsym" => (s.link, s.info, s.entsize) = (index(".dynstr").into(), 1, 24),
                    ".rela.dyn" => (s.link, s.entsize) = (index(".dynsym").into(), 24),
                    ".dynamic" => (s.link, s.entsize) = (index(".dynstr").into(), 16),
                    _ => {}
                }
                secs.push(s);
            }
            let (symtab, strtab, globals) = self.symtab(&b, &index);
            secs.push(Sec {
                link: index(".strtab").into(),
                info: globals,
                entsize: 24,
                align: 8,
                ..Sec::new(".symtab", SHT_SYMTAB, 0, symtab)
            });
            secs.push(Sec::new(".strtab", SHT_STRTAB, 0, strtab));
            let attributes = [
                annobin(text, text_end),
                // A range that ends at the split point lies before it and stays.
                annobin(a(".dynsym"), b.placed.iter().find(|p| !is_meta(p.name)).expect("moved").addr),
            ]
            .concat();
            secs.push(Sec { align: 4, ..Sec::new(".gnu.build.attributes", SHT_NOTE, 0, attributes) });
            secs.push(Sec {
                align: 4,
                ..Sec::new(".note.stapsdt", SHT_NOTE, 0, stapsdt(text + at::PROBE, a(".rodata")))
            });
            for (name, flags, data) in debug {
                secs.push(Sec::new(name, SHT_PROGBITS, flags, data));
            }
            for (name, data) in &self.extra {
                secs.push(Sec::new(name, SHT_PROGBITS, 0, data.clone()));
            }
            Built { data: write_for(self.machine, ET_DYN, text, &phdrs, secs), placed: b.placed }
        }

        /// .symtab (locals first) and .strtab, and the index of the first global.
        fn symtab(&self, b: &Built, index: &dyn Fn(&str) -> u16) -> (Vec<u8>, Vec<u8>, u32) {
            let mut strtab = vec![0u8];
            let mut name = |n: &str| {
                let at = strtab.len() as u32;
                strtab.extend(n.as_bytes());
                strtab.push(0);
                at
            };
            let text = b.addr(".text");
            let mut syms = vec![
                sym(0, 0, 0, 0),
                sym(name("t.c"), STT_FILE, SHN_ABS, 0),
                sym(0, STT_SECTION, index(NOTE), b.addr(NOTE)),
                // An absolute value that looks like a moved address: not an address of this image.
                sym(name("abs_marker"), 0, SHN_ABS, text + at::ABS),
                sym(name("_DYNAMIC"), 1, index(".dynamic"), b.addr(".dynamic")),
            ];
            let globals = syms.len() as u32;
            syms.push(sym(name("func"), STT_FUNC_GLOBAL, index(".text"), text + at::FUNC));
            syms.push(sym(name("rodata_obj"), STT_OBJECT_GLOBAL, index(".rodata"), b.addr(".rodata")));
            syms.push(sym(name("data_obj"), STT_OBJECT_GLOBAL, index(".data"), b.addr(".data")));
            for &(n, section) in &self.symbols {
                syms.push(sym(name(n), 0x10, index(section), b.addr(section)));
            }
            (syms.concat(), strtab, globals)
        }

        /// The DWARF sections: one compile unit for the code, and an address range
        /// table with that code and a range that stays (`.dynstr`'s first bytes).
        fn debug_sections(&self, text: u64, text_end: u64, stays: u64) -> Vec<(&'static str, u64, Vec<u8>)> {
            if self.debug == Debug::None {
                return Vec::new();
            }
            // DW_TAG_compile_unit, no children, DW_AT_low_pc DW_FORM_addr, DW_AT_high_pc DW_FORM_data8.
            let abbrev = vec![1, 0x11, 0, 0x11, 0x01, 0x12, 0x07, 0, 0, 0];
            let mut info = [24u32.to_le_bytes().as_slice(), &4u16.to_le_bytes(), &0u32.to_le_bytes(), &[8, 1]].concat();
            info.extend(words(&[text, text_end - text]));
            let mut aranges =
                [60u32.to_le_bytes().as_slice(), &2u16.to_le_bytes(), &0u32.to_le_bytes(), &[8, 0]].concat();
            aranges.resize(16, 0);
            aranges.extend(words(&[text, text_end - text, stays, 8, 0, 0]));
            let mut out = vec![(".debug_abbrev", 0, abbrev), (".debug_info", 0, info), (".debug_aranges", 0, aranges)];
            if self.debug == Debug::Zlib {
                for (_, flags, data) in &mut out {
                    *flags = SHF_COMPRESSED;
                    *data = zlib(data);
                }
            }
            out
        }
    }

    fn is_meta(name: &str) -> bool {
        matches!(name, NOTE | ".dynsym" | ".dynstr" | ".rela.dyn")
    }

    /// An Elf64_Sym.
    fn sym(name: u32, info: u8, shndx: u16, value: u64) -> Vec<u8> {
        let mut v = name.to_le_bytes().to_vec();
        v.extend([info, 0]);
        v.extend(shndx.to_le_bytes());
        v.extend(value.to_le_bytes());
        v.extend(0u64.to_le_bytes()); // st_size
        v
    }

    /// Little-endian 8-byte words.
    pub fn words(ws: &[u64]) -> Vec<u8> {
        ws.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// A note padded to 4 bytes, as note sections are.
    pub fn note(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
        let mut v = [(name.len() as u32).to_le_bytes(), (desc.len() as u32).to_le_bytes(), kind.to_le_bytes()].concat();
        v.extend(name);
        v.resize(v.len().next_multiple_of(4), 0);
        v.extend(desc);
        v.resize(v.len().next_multiple_of(4), 0);
        v
    }

    /// An annobin NT_GNU_BUILD_ATTRIBUTE_OPEN note for [start, end).
    fn annobin(start: u64, end: u64) -> Vec<u8> {
        note(b"GA$\x013p3\0", 0x100, &words(&[start, end]))
    }

    /// A SystemTap probe note: pc, base, semaphore (none), provider, name, arguments.
    fn stapsdt(pc: u64, base: u64) -> Vec<u8> {
        let mut desc = words(&[pc, base, 0]);
        desc.extend(b"p\0n\0\0");
        note(b"stapsdt\0", 3, &desc)
    }

    /// One CIE ("zR", FDE pointers pcrel|sdata4) and two FDEs: for the code, and
    /// for an address that stays (a pointer that crosses the split point).
    fn eh_frame(at: u64, code: u64, stays: u64) -> Vec<u8> {
        let mut v = [20u32.to_le_bytes(), 0u32.to_le_bytes()].concat();
        v.extend([1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x1b, 0x0c, 7, 8, 0x90, 1, 0, 0]);
        for (i, target) in [code, stays].into_iter().enumerate() {
            let fde = v.len() as u64;
            assert_eq!(fde, 24 * (i as u64 + 1));
            v.extend(20u32.to_le_bytes());
            v.extend(((fde + 4) as u32).to_le_bytes()); // back to the CIE at 0
            v.extend((target.wrapping_sub(at + fde + 8) as u32).to_le_bytes());
            v.extend(0x10u32.to_le_bytes());
            v.extend([0; 8]); // no augmentation data, nops
        }
        v.extend(0u32.to_le_bytes());
        v
    }

    /// The header: .eh_frame pointer (pcrel|sdata4), count (udata4), and the table
    /// (datarel|sdata4) sorted by address.
    fn eh_frame_hdr(at: u64, frame: u64, code: u64, stays: u64) -> Vec<u8> {
        let rel = |x: u64| (x.wrapping_sub(at) as u32).to_le_bytes();
        let mut v = vec![1, 0x1b, 0x03, 0x3b];
        v.extend((frame.wrapping_sub(at + 4) as u32).to_le_bytes());
        v.extend(2u32.to_le_bytes());
        for (loc, fde) in [(stays, frame + 48), (code, frame + 24)] {
            v.extend(rel(loc));
            v.extend(rel(fde));
        }
        v
    }

    /// `data` as an SHF_COMPRESSED section: Elf64_Chdr (zlib) and the stream.
    fn zlib(data: &[u8]) -> Vec<u8> {
        let mut v = [1u32.to_le_bytes(), 0u32.to_le_bytes()].concat();
        v.extend(words(&[data.len() as u64, 1]));
        let mut z = flate2::write::ZlibEncoder::new(v, flate2::Compression::default());
        z.write_all(data).unwrap();
        z.finish().unwrap()
    }

    /// Options with no threshold.
    pub fn opts(mode: ModeChoice, huge_page: u64) -> Options {
        Options { huge_page, threshold: 0, mode, exposure_limit: 0, page_size: 0 }
    }

    /// Builds, transforms (and self-checks) a file.
    pub fn run(dso: &Dso, mode: ModeChoice, huge_page: u64) -> (Built, Transformed, Vec<u8>) {
        let built = dso.build();
        let (t, out) = transform_to_vec(&built.data, &opts(mode, huge_page)).expect("transforms");
        (built, t, out)
    }

    /// A shift of `arrangement` with 12 KiB of code to 2 MiB pages: the input, the
    /// displacement and the output.
    pub fn shifted(arrangement: Arrangement) -> (Built, u64, Vec<u8>) {
        let (built, t, out) = run(&Dso::new(arrangement, 0x3000), ModeChoice::Shift, 2 << 20);
        (built, t.summary().dv, out)
    }

    /// The contents of section `name` of `elf`.
    pub fn contents<'a>(elf: &crate::elf::Elf<'a>, name: &str) -> &'a [u8] {
        elf.section_data(elf.section(name).unwrap_or_else(|| panic!("no section {name}")))
    }

    /// The 8-byte word at `off`.
    pub fn word(data: &[u8], off: u64) -> u64 {
        crate::elf::read_u64(data, off).unwrap()
    }
}
