//! The output file as a list of pieces: ranges copied from the input, trap-filled
//! padding, and new bytes. Holes between pieces are zero. Keeping copies as input
//! ranges lets the I/O layer move most bytes with `copy_file_range` without ever
//! holding the whole file in memory; only 64 KiB blocks that carry edits are owned.

use crate::error::{Error, Reason, Result};
use crate::patch::Patch;
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
    /// Total file size.
    pub size: u64,
}

const BLOCK: u64 = 64 * 1024;

impl Output {
    /// Builds the output from layout pieces and input-offset edits. Every edit must
    /// land inside exactly one input-sourced piece.
    pub fn new(mut pieces: Vec<Piece>, patches: Vec<Patch>, input: &[u8]) -> Result<Output> {
        pieces.retain(|p| p.len > 0);
        pieces.sort_by_key(|p| p.dst);
        for w in pieces.windows(2) {
            if w[0].dst + w[0].len > w[1].dst {
                return Err(Error::new(Reason::Internal, format!("output pieces overlap at {:#x}", w[1].dst)));
            }
        }
        let size = pieces.last().map_or(0, |p| p.dst + p.len);
        let mut used = 0usize;
        let mut out = Vec::with_capacity(pieces.len() + patches.len().min(4096));
        for piece in pieces {
            let Source::Input(src) = piece.src else {
                out.push(piece);
                continue;
            };
            let end = src + piece.len;
            let first = patches.partition_point(|p| p.off < src);
            let last = patches.partition_point(|p| p.off < end);
            if first == last {
                out.push(piece);
                continue;
            }
            used += last - first;
            let mut cursor = src;
            let mut i = first;
            while i < last {
                let block_start = (src + (patches[i].off - src) / BLOCK * BLOCK).max(cursor);
                let mut block_end = (block_start + BLOCK).min(end);
                let mut j = i;
                while j < last && patches[j].off < block_end {
                    block_end = block_end.max(patches[j].off + u64::from(patches[j].len));
                    j += 1;
                }
                if block_end > end {
                    return Err(Error::new(
                        Reason::Internal,
                        format!("an edit at {:#x} crosses the end of its piece", patches[j - 1].off),
                    ));
                }
                let to_dst = |o: u64| piece.dst + (o - src);
                if block_start > cursor {
                    out.push(Piece { dst: to_dst(cursor), len: block_start - cursor, src: Source::Input(cursor) });
                }
                let mut bytes = input[block_start as usize..block_end as usize].to_vec();
                for p in &patches[i..j] {
                    let at = (p.off - block_start) as usize;
                    bytes[at..at + p.data().len()].copy_from_slice(p.data());
                }
                out.push(Piece { dst: to_dst(block_start), len: block_end - block_start, src: Source::Owned(bytes) });
                cursor = block_end;
                i = j;
            }
            if cursor < end {
                out.push(Piece { dst: piece.dst + (cursor - src), len: end - cursor, src: Source::Input(cursor) });
            }
        }
        if used != patches.len() {
            return Err(Error::new(
                Reason::Internal,
                format!("{} edits land outside the copied input", patches.len() - used),
            ));
        }
        Ok(Output { pieces: out, size })
    }

    /// Materialises the output in memory.
    pub fn to_vec(&self, input: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8; self.size as usize];
        for p in &self.pieces {
            let dst = &mut v[p.dst as usize..(p.dst + p.len) as usize];
            fill(dst, p, input);
        }
        v
    }

    /// Writes the output to a seekable writer (holes are left unwritten, so a new
    /// file stays sparse there). Input pieces are copied from `input`.
    pub fn write_to<W: Write + Seek>(&self, input: &[u8], w: &mut W) -> io::Result<()> {
        let mut buf = Vec::new();
        for p in &self.pieces {
            w.seek(SeekFrom::Start(p.dst))?;
            match &p.src {
                Source::Input(src) => w.write_all(&input[*src as usize..(*src + p.len) as usize])?,
                Source::Owned(b) => w.write_all(b)?,
                Source::Trap(_) => {
                    buf.resize(p.len as usize, 0);
                    fill(&mut buf, p, input);
                    w.write_all(&buf)?;
                }
            }
        }
        Ok(())
    }
}

/// Fills `dst` (exactly `p.len` bytes) with the piece's contents.
pub fn fill(dst: &mut [u8], p: &Piece, input: &[u8]) {
    match &p.src {
        Source::Input(src) => dst.copy_from_slice(&input[*src as usize..(*src + p.len) as usize]),
        Source::Owned(b) => dst.copy_from_slice(b),
        Source::Trap(t) => {
            for (i, b) in dst.iter_mut().enumerate() {
                *b = t[((p.dst + i as u64) % t.len() as u64) as usize];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_become_owned_blocks_and_holes_stay_zero() {
        let input: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let pieces = vec![
            Piece { dst: 0, len: 100, src: Source::Input(0) },
            Piece { dst: 4096, len: 150_000, src: Source::Input(1000) },
            Piece { dst: 200_000, len: 8, src: Source::Trap(&[0xcc]) },
        ];
        let patches = vec![
            Patch { off: 10, len: 1, bytes: [0xaa, 0, 0, 0, 0, 0, 0, 0] },
            Patch { off: 1000 + 70_000, len: 4, bytes: [1, 2, 3, 4, 0, 0, 0, 0] },
        ];
        let out = Output::new(pieces, patches, &input).unwrap();
        let v = out.to_vec(&input);
        assert_eq!(v.len(), 200_008);
        assert_eq!(v[10], 0xaa);
        assert_eq!(v[11], input[11]);
        assert!(v[100..4096].iter().all(|&b| b == 0));
        assert_eq!(&v[4096 + 70_000..4096 + 70_004], &[1, 2, 3, 4]);
        assert_eq!(v[4096 + 70_004], input[1000 + 70_004]);
        assert_eq!(v[4096 + 149_999], input[1000 + 149_999]);
        assert!(v[200_000..].iter().all(|&b| b == 0xcc));
        let mut cur = std::io::Cursor::new(Vec::new());
        out.write_to(&input, &mut cur).unwrap();
        let mut written = cur.into_inner();
        written.resize(out.size as usize, 0);
        assert_eq!(written, v);
    }

    #[test]
    fn an_edit_outside_the_copies_is_an_internal_error() {
        let input = vec![0u8; 64];
        let pieces = vec![Piece { dst: 0, len: 32, src: Source::Input(0) }];
        let patches = vec![Patch { off: 40, len: 1, bytes: [1, 0, 0, 0, 0, 0, 0, 0] }];
        assert_eq!(Output::new(pieces, patches, &input).unwrap_err().reason, Reason::Internal);
    }
}
