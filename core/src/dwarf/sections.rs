//! The debug sections of a file, decompressed where needed (SHF_COMPRESSED with zlib
//! or zstd, and legacy `.zdebug_*`), and recompressed with the same algorithm after
//! editing.

use super::{Changes, Edits, Replacement, Slice};
use crate::addr_map::AddrMap;
use crate::elf::consts::SHF_COMPRESSED;
use crate::elf::{read_u32, read_u64, Elf};
use crate::error::{Error, Reason, Result};
use crate::patch::{sort_if_needed, Patch, Patches, Sorted};
use std::borrow::Cow;
use std::io::{Read, Write};

/// Debug sections that hold no addresses but that reading the others needs.
const NEEDED_FOR_READING: &[&str] = &[".debug_abbrev", ".debug_str_offsets"];

/// Debug sections that hold no addresses (only offsets, strings, names, macros).
const NO_ADDRESSES: &[&str] = &[
    ".debug_abbrev",
    ".debug_str",
    ".debug_line_str",
    ".debug_str_offsets",
    ".debug_names",
    ".debug_pubnames",
    ".debug_pubtypes",
    ".debug_gnu_pubnames",
    ".debug_gnu_pubtypes",
    ".debug_macro",
    ".debug_macinfo",
    ".debug_sup",
];

/// Sections this module rewrites.
const WITH_ADDRESSES: &[&str] = &[
    ".debug_info",
    ".debug_types",
    ".debug_addr",
    ".debug_line",
    ".debug_aranges",
    ".debug_ranges",
    ".debug_rnglists",
    ".debug_loc",
    ".debug_loclists",
    ".debug_frame",
    ".gdb_index",
];

/// Whether a section name belongs to the debug info this module owns.
pub fn is_debug_section(name: &str) -> bool {
    name.starts_with(".debug_") || name.starts_with(".zdebug_") || name == ".gdb_index"
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compression {
    None,
    /// SHF_COMPRESSED with the given ch_type and header size.
    Elf {
        ch_type: u32,
        header: usize,
    },
    /// `.zdebug_*`: "ZLIB", 8-byte big-endian size, zlib stream.
    Legacy,
}

const ELFCOMPRESS_ZLIB: u32 = 1;
const ELFCOMPRESS_ZSTD: u32 = 2;

/// Index of a section in `Sections`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SecId(pub usize);

struct Section<'a> {
    index: usize,
    file_offset: u64,
    name: String,
    raw: &'a [u8],
    data: Cow<'a, [u8]>,
    compression: Compression,
}

/// The debug sections of one file.
pub struct Sections<'a> {
    list: Vec<Section<'a>>,
}

fn bad(name: &str, what: impl std::fmt::Display) -> Error {
    Error::new(Reason::BadDwarf, format!("{name}: {what}"))
}

impl<'a> Sections<'a> {
    /// Loads (and decompresses) every non-allocated debug section.
    pub fn load(elf: &Elf<'a>) -> Result<Sections<'a>> {
        let mut list = Vec::new();
        for s in elf.shdrs.iter().filter(|s| !s.is_alloc() && is_debug_section(&s.name)) {
            let legacy = s.name.starts_with(".zdebug_");
            let name = if legacy { format!(".{}", &s.name[2..]) } else { s.name.clone() };
            if !WITH_ADDRESSES.contains(&name.as_str()) && !NO_ADDRESSES.contains(&name.as_str()) {
                return Err(Error::new(
                    Reason::UnsupportedDwarf,
                    format!("section {} is not one hugify knows to be free of addresses", s.name),
                ));
            }
            if list.iter().any(|x: &Section| x.name == name) {
                return Err(bad(&s.name, "appears twice"));
            }
            if !WITH_ADDRESSES.contains(&name.as_str()) && !NEEDED_FOR_READING.contains(&name.as_str()) {
                continue;
            }
            let raw = elf.section_data(s);
            let (data, compression) = if s.sh_flags & SHF_COMPRESSED != 0 {
                decompress_elf(elf, &s.name, raw)?
            } else if legacy {
                (Cow::Owned(decompress_legacy(&s.name, raw)?), Compression::Legacy)
            } else {
                (Cow::Borrowed(raw), Compression::None)
            };
            list.push(Section { index: s.index, file_offset: s.sh_offset, name, raw, data, compression });
        }
        Ok(Sections { list })
    }

    /// Uncompressed sections given by name and contents, as a file would hold them.
    #[cfg(test)]
    pub fn for_tests(named: &[(&str, &'a [u8])]) -> Sections<'a> {
        let section = |(i, &(name, data)): (usize, &(&str, &'a [u8]))| Section {
            index: i + 1,
            file_offset: 0,
            name: name.to_owned(),
            raw: data,
            data: Cow::Borrowed(data),
            compression: Compression::None,
        };
        Sections { list: named.iter().enumerate().map(section).collect() }
    }

    /// Number of sections.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// The section with this (canonical, `.debug_*`) name.
    pub fn id(&self, name: &str) -> Option<SecId> {
        self.list.iter().position(|s| s.name == name).map(SecId)
    }

    /// Uncompressed contents.
    pub fn data(&self, id: SecId) -> &[u8] {
        &self.list[id.0].data
    }

    /// gimli's view of the sections (missing ones are empty).
    pub fn gimli(&self) -> gimli::Dwarf<Slice<'_>> {
        let load = |id: gimli::SectionId| -> std::result::Result<Slice<'_>, ()> {
            let data = self.id(id.name()).map_or(&[][..], |s| self.data(s));
            Ok(gimli::EndianSlice::new(data, gimli::LittleEndian))
        };
        gimli::Dwarf::load(load).expect("loading never fails")
    }

    /// Turns the edits into file-offset edits for uncompressed sections, and into
    /// new (recompressed) contents for compressed ones.
    pub fn finish(&self, ed: Edits, map: &AddrMap) -> Result<Changes> {
        let mut out = Changes::default();
        let mut parts = Vec::new();
        for ((s, puts), moves) in self.list.iter().zip(ed.puts).zip(ed.moves) {
            if puts.is_empty() && moves.is_empty() {
                continue;
            }
            // Lists may share entries (GCC reuses the tail of a range list): the same
            // field reached twice must get the same edit; anything else is a conflict.
            let (mut puts, mut moves) = (puts, moves);
            sort_if_needed(&mut puts, Patch::off);
            puts.dedup();
            sort_if_needed(&mut moves, |m| *m);
            moves.dedup();
            let sorted = Patches::from_parts(puts, moves).into_sorted().map_err(|e| {
                Error::new(
                    Reason::UnsupportedDwarf,
                    format!("{}: a field would be edited in two ways ({})", s.name, e.detail),
                )
            })?;
            if s.compression == Compression::None {
                let Sorted { mut patches, mut moves } = sorted;
                for p in patches.iter_mut() {
                    *p = Patch::new(s.file_offset + p.off(), p.data());
                }
                for m in moves.iter_mut() {
                    *m = m.rebased(s.file_offset);
                }
                parts.push(Patches::from_parts(patches, moves));
                continue;
            }
            let mut data = s.data.to_vec();
            for p in &sorted.patches {
                data[p.off() as usize..p.end() as usize].copy_from_slice(p.data());
            }
            for m in &sorted.moves {
                m.apply(&mut data, 0, map);
            }
            let data = match s.compression {
                Compression::Elf { ch_type, header } => {
                    let mut v = s.raw[..header].to_vec();
                    v.extend(compress(ch_type, &data, &s.name)?);
                    v
                }
                _ => {
                    let mut v = b"ZLIB".to_vec();
                    v.extend_from_slice(&(data.len() as u64).to_be_bytes());
                    v.extend(compress(ELFCOMPRESS_ZLIB, &data, &s.name)?);
                    v
                }
            };
            out.replacements.push(Replacement { index: s.index, data });
        }
        // Millions of edits: grow the largest set rather than copy it (sorting the
        // concatenated runs afterwards is a merge).
        parts.sort_by_key(|p| std::cmp::Reverse(p.len()));
        let mut parts = parts.into_iter();
        out.patches = parts.next().unwrap_or_default();
        for p in parts {
            out.patches.append(p);
        }
        Ok(out)
    }
}

fn decompress_elf<'a>(elf: &Elf, name: &str, raw: &[u8]) -> Result<(Cow<'a, [u8]>, Compression)> {
    let (ch_type, size, header) = if elf.class.is64 {
        (read_u32(raw, 0).map_err(|_| bad(name, "truncated compression header"))?, read_u64(raw, 8)?, 24)
    } else {
        (read_u32(raw, 0).map_err(|_| bad(name, "truncated compression header"))?, u64::from(read_u32(raw, 4)?), 12)
    };
    let body = raw.get(header..).ok_or_else(|| bad(name, "truncated compression header"))?;
    let data = match ch_type {
        ELFCOMPRESS_ZLIB => inflate(name, body, size)?,
        // zstd's expansion has no useful bound to reserve by.
        ELFCOMPRESS_ZSTD => decompress_claimed(name, size, 0, "zstd", zstd::stream::read::Decoder::new(body))?,
        t => {
            return Err(Error::new(Reason::UnsupportedDwarf, format!("{name}: compression type {t} is not supported")))
        }
    };
    Ok((Cow::Owned(data), Compression::Elf { ch_type, header }))
}

fn decompress_legacy(name: &str, raw: &[u8]) -> Result<Vec<u8>> {
    if raw.len() < 12 || &raw[..4] != b"ZLIB" {
        return Err(bad(name, "missing ZLIB header"));
    }
    let size = u64::from_be_bytes(raw[4..12].try_into().unwrap());
    inflate(name, &raw[12..], size)
}

fn inflate(name: &str, body: &[u8], size: u64) -> Result<Vec<u8>> {
    // zlib expands at most 1032:1.
    let most = (body.len() as u64).saturating_mul(1032);
    decompress_claimed(name, size, most, "zlib", Ok(flate2::read::ZlibDecoder::new(body)))
}

/// The `size` bytes a compression header claims, read from `decoder` and no more (a
/// small stream can expand to terabytes). The claim is only a hint for the buffer:
/// at most `most` bytes are reserved up front.
fn decompress_claimed(
    name: &str,
    size: u64,
    most: u64,
    what: &str,
    decoder: std::io::Result<impl Read>,
) -> Result<Vec<u8>> {
    if size > 1 << 34 {
        return Err(bad(name, format!("claims {size} bytes uncompressed")));
    }
    let mut v = Vec::with_capacity(size.min(most) as usize);
    decoder.and_then(|d| d.take(size + 1).read_to_end(&mut v)).map_err(|e| bad(name, format!("{what}: {e}")))?;
    if v.len() as u64 != size {
        return Err(bad(name, "decompressed size differs from the compression header"));
    }
    Ok(v)
}

fn compress(ch_type: u32, data: &[u8], name: &str) -> Result<Vec<u8>> {
    let err = |e: std::io::Error| Error::new(Reason::Internal, format!("{name}: recompression failed: {e}"));
    match ch_type {
        ELFCOMPRESS_ZLIB => {
            let mut enc = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            enc.write_all(data).map_err(err)?;
            enc.finish().map_err(err)
        }
        _ => zstd::stream::encode_all(data, 3).map_err(err),
    }
}
