//! In-place edits keyed by *input* file offset. Repair modules add them; the output
//! writer applies them wherever those input bytes land. Two kinds:
//!
//! * a [`Patch`] writes given bytes;
//! * a [`Move`] says "this address-sized field holds an address that moves": the
//!   writer reads the input value and writes its image under the address map. DWARF
//!   repairs of large files make millions of these, at eight bytes each.
//!
//! Two edits of the same byte are a bug (two modules claiming one field), so they are
//! refused instead of silently letting the later one win.

use crate::addr_map::AddrMap;
use crate::elf::Class;
use crate::error::{Error, Reason, Result};

const OFF_BITS: u64 = (1 << 56) - 1;

/// One edit of up to eight given bytes (sixteen bytes in memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Patch {
    /// Input file offset (low 56 bits) and length (high 8 bits).
    off_len: u64,
    /// The new bytes (first `len` are used).
    bytes: [u8; 8],
}

impl Patch {
    /// An edit of `data` (1 to 8 bytes) at input offset `off`.
    pub fn new(off: u64, data: &[u8]) -> Patch {
        debug_assert!(!data.is_empty() && data.len() <= 8 && off <= OFF_BITS);
        let mut bytes = [0u8; 8];
        bytes[..data.len()].copy_from_slice(data);
        Patch { off_len: off | (data.len() as u64) << 56, bytes }
    }
    /// Input file offset of the first byte.
    pub fn off(&self) -> u64 {
        self.off_len & OFF_BITS
    }
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.off() + (self.off_len >> 56)
    }
    /// The new bytes.
    pub fn data(&self) -> &[u8] {
        &self.bytes[..(self.off_len >> 56) as usize]
    }
}

/// A little-endian address field of 4 or 8 bytes whose value moves under the map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Move(u64);

impl Move {
    /// The field of `size` bytes at input offset `off`.
    pub fn new(off: u64, size: u8) -> Move {
        debug_assert!(off <= OFF_BITS && (size == 4 || size == 8));
        Move(off | u64::from(size) << 56)
    }
    /// Input file offset.
    pub fn off(self) -> u64 {
        self.0 & OFF_BITS
    }
    /// Field size.
    pub fn size(self) -> usize {
        (self.0 >> 56) as usize
    }
    /// One past the last byte.
    pub fn end(self) -> u64 {
        self.off() + (self.0 >> 56)
    }
    /// The same field at another offset.
    pub fn rebased(self, delta: u64) -> Move {
        Move::new(self.off() + delta, self.size() as u8)
    }
    /// Rewrites the field in `buf` (which holds the input bytes from `buf_start`).
    pub fn apply(self, buf: &mut [u8], buf_start: u64, map: &AddrMap) {
        let at = (self.off() - buf_start) as usize;
        let field = &mut buf[at..at + self.size()];
        let mut v = [0u8; 8];
        v[..field.len()].copy_from_slice(field);
        let new = map.map(u64::from_le_bytes(v));
        field.copy_from_slice(&new.to_le_bytes()[..self.size()]);
    }
}

/// Edits collected from the repair modules.
#[derive(Default)]
pub struct Patches {
    items: Vec<Patch>,
    moves: Vec<Move>,
}

/// All edits, each kind sorted by offset, none overlapping another.
#[derive(Clone, Debug, Default)]
pub struct Sorted {
    /// Byte edits.
    pub patches: Vec<Patch>,
    /// Address moves.
    pub moves: Vec<Move>,
}

impl Patches {
    /// Replaces `data.len()` (at most 8) bytes at input offset `off`.
    pub fn put(&mut self, off: u64, data: &[u8]) {
        self.items.push(Patch::new(off, data));
    }

    /// Writes an address-sized word.
    pub fn put_word(&mut self, class: Class, off: u64, value: u64) {
        self.put(off, &class.word_bytes(value));
    }

    /// Number of edits.
    pub(crate) fn len(&self) -> usize {
        self.items.len() + self.moves.len()
    }

    /// A set holding these edits.
    pub fn from_parts(items: Vec<Patch>, moves: Vec<Move>) -> Patches {
        Patches { items, moves }
    }

    /// Moves all edits of `other` into this set (append the smaller set to the
    /// larger: the larger vectors are then not copied).
    pub fn append(&mut self, other: Patches) {
        let (mut items, mut moves) = (other.items, other.moves);
        self.items.append(&mut items);
        self.moves.append(&mut moves);
    }

    /// The edits sorted by offset; fails if two of them touch the same byte.
    pub fn into_sorted(mut self) -> Result<Sorted> {
        sort_if_needed(&mut self.items, Patch::off);
        sort_if_needed(&mut self.moves, |m| *m);
        let clash =
            |at: u64| Error::new(Reason::Internal, format!("two repairs edit the bytes at input offset {at:#x}"));
        if let Some(w) = self.items.windows(2).find(|w| w[0].end() > w[1].off()) {
            return Err(clash(w[1].off()));
        }
        if let Some(w) = self.moves.windows(2).find(|w| w[0].end() > w[1].off()) {
            return Err(clash(w[1].off()));
        }
        let mut j = 0;
        for p in &self.items {
            while self.moves.get(j).is_some_and(|m| m.end() <= p.off()) {
                j += 1;
            }
            if self.moves.get(j).is_some_and(|m| m.off() < p.end()) {
                return Err(clash(p.off()));
            }
        }
        Ok(Sorted { patches: self.items, moves: self.moves })
    }
}

/// Sorts edits, which arrive as a few long sorted runs (per section, per thread):
/// the stable sort finds and merges runs, which is close to linear here.
pub fn sort_if_needed<T, K: Ord>(v: &mut [T], key: impl Fn(&T) -> K) {
    if !v.is_sorted_by_key(&key) {
        v.sort_by_key(key);
    }
}

impl Sorted {
    /// (offset, end) of every edit in offset order.
    pub fn spans(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let mut a = self.patches.iter().map(|p| (p.off(), p.end())).peekable();
        let mut b = self.moves.iter().map(|m| (m.off(), m.end())).peekable();
        std::iter::from_fn(move || match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x.0 <= y.0 => a.next(),
            (Some(_), Some(_)) | (None, Some(_)) => b.next(),
            (Some(_), None) => a.next(),
            (None, None) => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_edits_of_either_kind_are_refused() {
        let mut p = Patches::default();
        p.put(8, &[1, 2, 3, 4]);
        p.moves.push(Move::new(16, 8));
        assert!(p.into_sorted().is_ok());
        let mut p = Patches::default();
        p.put(8, &[1, 2, 3, 4]);
        p.moves.push(Move::new(4, 8));
        assert_eq!(p.into_sorted().unwrap_err().reason, Reason::Internal);
    }

    #[test]
    fn a_move_rewrites_its_field_under_the_map() {
        let map = AddrMap::shift(0x1000, 0x2000, 0x10_0000);
        let mut buf = [0u8; 16];
        buf[4..12].copy_from_slice(&0x1800u64.to_le_bytes());
        Move::new(0x104, 8).apply(&mut buf, 0x100, &map);
        assert_eq!(u64::from_le_bytes(buf[4..12].try_into().unwrap()), 0x10_1800);
    }
}
