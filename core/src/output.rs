//! The output file as a list of pieces: ranges copied from the input, trap-filled
//! padding, and new bytes, plus edits of input bytes applied while writing. Holes
//! between pieces are zero. Keeping copies as input ranges lets the I/O layer move
//! most bytes with `copy_file_range`, and applying edits block by block while
//! writing means the output is never held in memory as a whole.

use crate::addr_map::AddrMap;
use crate::error::{Error, Reason, Result};
use crate::patch::Sorted;
use std::io::{self, Seek, SeekFrom, Write};

/// Where a piece's bytes come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The input bytes starting at this offset.
    Input(u64),
    /// The architecture's trap instruction, repeated (aligned to the output offset).
    Trap(&'static [u8]),
    /// New bytes.
    Owned(Vec<u8>),
}

/// One contiguous range of the output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Output offset.
    pub dst: u64,
    /// Length in bytes.
    pub len: u64,
    /// Contents.
    pub src: Source,
}

/// The whole output file.
#[derive(Clone, Debug)]
pub struct Output {
    /// Non-overlapping pieces sorted by output offset.
    pub pieces: Vec<Piece>,
    /// Edits of input bytes; applied while writing.
    pub edits: Sorted,
    /// The address map moves apply.
    pub map: AddrMap,
    /// Total file size.
    pub size: u64,
}

/// A unit of output writing: a range to copy from the input, or bytes to write.
pub enum Chunk<'a> {
    /// Copy `len` input bytes at `src` to output offset `dst`.
    Copy {
        /// Input offset.
        src: u64,
        /// Output offset.
        dst: u64,
        /// Length.
        len: u64,
    },
    /// Write `data` at output offset `dst`.
    Bytes {
        /// Output offset.
        dst: u64,
        /// The bytes.
        data: &'a [u8],
    },
}

const BLOCK: u64 = 64 * 1024;

impl Output {
    /// Builds the output from layout pieces and input-offset edits. Every edit must
    /// land inside exactly one input-sourced piece.
    pub fn new(mut pieces: Vec<Piece>, edits: Sorted, map: AddrMap) -> Result<Output> {
        pieces.retain(|p| p.len > 0);
        pieces.sort_by_key(|p| p.dst);
        for w in pieces.windows(2) {
            if w[0].dst + w[0].len > w[1].dst {
                return Err(Error::new(Reason::Internal, format!("output pieces overlap at {:#x}", w[1].dst)));
            }
        }
        let mut inputs: Vec<(u64, u64)> = pieces
            .iter()
            .filter_map(|p| if let Source::Input(s) = p.src { Some((s, s + p.len)) } else { None })
            .collect();
        inputs.sort_unstable();
        for w in inputs.windows(2) {
            if w[0].1 > w[1].0 {
                return Err(Error::new(Reason::Internal, format!("input bytes at {:#x} are copied twice", w[1].0)));
            }
        }
        // Both lists are sorted: one linear pass checks every edit.
        let mut i = 0;
        for (off, end) in edits.spans() {
            while inputs.get(i).is_some_and(|r| r.1 <= off) {
                i += 1;
            }
            if inputs.get(i).is_none_or(|r| off < r.0 || end > r.1) {
                return Err(Error::new(Reason::Internal, format!("an edit at input offset {off:#x} lands nowhere")));
            }
        }
        let size = pieces.last().map_or(0, |p| p.dst + p.len);
        Ok(Output { pieces, edits, map, size })
    }

    /// Produces the output in order as chunks; edited input ranges come out as
    /// blocks of at most 64 KiB with the edits applied, so memory stays bounded.
    pub fn for_each_chunk<E>(
        &self,
        input: &[u8],
        mut f: impl FnMut(Chunk<'_>) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let mut buf = Vec::new();
        for piece in &self.pieces {
            let src = match &piece.src {
                Source::Owned(b) => {
                    f(Chunk::Bytes { dst: piece.dst, data: b })?;
                    continue;
                }
                Source::Trap(trap) => {
                    buf.resize(piece.len as usize, 0);
                    fill_trap(&mut buf, piece.dst, trap);
                    f(Chunk::Bytes { dst: piece.dst, data: &buf })?;
                    continue;
                }
                Source::Input(s) => *s,
            };
            let end = src + piece.len;
            let to_dst = |o: u64| piece.dst + (o - src);
            let (patches, moves) = (&self.edits.patches, &self.edits.moves);
            let (mut i, pb) = (patches.partition_point(|p| p.off() < src), patches.partition_point(|p| p.off() < end));
            let (mut j, mb) = (moves.partition_point(|m| m.off() < src), moves.partition_point(|m| m.off() < end));
            let mut cursor = src;
            loop {
                let next = match (patches[i..pb].first(), moves[j..mb].first()) {
                    (Some(p), Some(m)) => p.off().min(m.off()),
                    (Some(p), None) => p.off(),
                    (None, Some(m)) => m.off(),
                    (None, None) => break,
                };
                let block_start = (src + (next - src) / BLOCK * BLOCK).max(cursor);
                let mut block_end = (block_start + BLOCK).min(end);
                let (i0, j0) = (i, j);
                loop {
                    if i < pb && patches[i].off() < block_end {
                        block_end = block_end.max(patches[i].end());
                        i += 1;
                    } else if j < mb && moves[j].off() < block_end {
                        block_end = block_end.max(moves[j].end());
                        j += 1;
                    } else {
                        break;
                    }
                }
                if block_start > cursor {
                    f(Chunk::Copy { src: cursor, dst: to_dst(cursor), len: block_start - cursor })?;
                }
                buf.clear();
                buf.extend_from_slice(&input[block_start as usize..block_end as usize]);
                for p in &patches[i0..i] {
                    let at = (p.off() - block_start) as usize;
                    buf[at..at + p.data().len()].copy_from_slice(p.data());
                }
                for m in &moves[j0..j] {
                    m.apply(&mut buf, block_start, &self.map);
                }
                f(Chunk::Bytes { dst: to_dst(block_start), data: &buf })?;
                cursor = block_end;
            }
            if cursor < end {
                f(Chunk::Copy { src: cursor, dst: to_dst(cursor), len: end - cursor })?;
            }
        }
        Ok(())
    }

    /// Materialises the output in memory.
    pub fn to_vec(&self, input: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8; self.size as usize];
        let _ = self.for_each_chunk(input, |c| -> std::result::Result<(), ()> {
            match c {
                Chunk::Copy { src, dst, len } => {
                    v[dst as usize..(dst + len) as usize].copy_from_slice(&input[src as usize..(src + len) as usize])
                }
                Chunk::Bytes { dst, data } => v[dst as usize..dst as usize + data.len()].copy_from_slice(data),
            }
            Ok(())
        });
        v
    }

    /// Writes the output to a seekable writer (holes are left unwritten, so a new
    /// file stays sparse there).
    pub fn write_to<W: Write + Seek>(&self, input: &[u8], w: &mut W) -> io::Result<()> {
        self.for_each_chunk(input, |c| {
            let (dst, data) = match c {
                Chunk::Copy { src, dst, len } => (dst, &input[src as usize..(src + len) as usize]),
                Chunk::Bytes { dst, data } => (dst, data),
            };
            w.seek(SeekFrom::Start(dst))?;
            w.write_all(data)
        })
    }
}

/// Fills `buf` with the trap instruction repeated as it falls from output offset
/// `dst` on, so that multi-byte traps stay aligned to the file (and the code).
fn fill_trap(buf: &mut [u8], dst: u64, trap: &[u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = trap[((dst + i as u64) % trap.len() as u64) as usize];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::patch::{Move, Patch};

    const NO_MAP: AddrMap = AddrMap::shift(0, 0, 0);

    #[test]
    fn edits_become_owned_blocks_and_holes_stay_zero() {
        let input: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let pieces = vec![
            Piece { dst: 0, len: 100, src: Source::Input(0) },
            Piece { dst: 4096, len: 150_000, src: Source::Input(1000) },
            Piece { dst: 200_000, len: 8, src: Source::Trap(&[0xcc]) },
        ];
        let patches = vec![Patch::new(10, &[0xaa]), Patch::new(1000 + 70_000, &[1, 2, 3, 4])];
        let map = AddrMap::shift(1, u64::MAX, 0x100);
        let moves = vec![Move::new(1000 + 140_000, 8)];
        let out = Output::new(pieces, Sorted { patches, moves }, map).unwrap();
        let v = out.to_vec(&input);
        assert_eq!(v.len(), 200_008);
        assert_eq!(v[10], 0xaa);
        assert_eq!(v[11], input[11]);
        assert!(v[100..4096].iter().all(|&b| b == 0));
        assert_eq!(&v[4096 + 70_000..4096 + 70_004], &[1, 2, 3, 4]);
        assert_eq!(v[4096 + 70_004], input[1000 + 70_004]);
        assert_eq!(v[4096 + 149_999], input[1000 + 149_999]);
        let old = u64::from_le_bytes(input[141_000..141_008].try_into().unwrap());
        assert_eq!(u64::from_le_bytes(v[4096 + 140_000..4096 + 140_008].try_into().unwrap()), old + 0x100);
        assert!(v[200_000..].iter().all(|&b| b == 0xcc));
        let mut cur = std::io::Cursor::new(Vec::new());
        out.write_to(&input, &mut cur).unwrap();
        let mut written = cur.into_inner();
        written.resize(out.size as usize, 0);
        assert_eq!(written, v);
    }

    #[test]
    fn an_edit_outside_the_copies_is_an_internal_error() {
        let pieces = vec![Piece { dst: 0, len: 32, src: Source::Input(0) }];
        let edits = Sorted { patches: vec![Patch::new(40, &[1])], moves: Vec::new() };
        assert_eq!(Output::new(pieces, edits, NO_MAP).unwrap_err().reason, Reason::Internal);
    }
}
