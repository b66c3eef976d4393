//! A set of small in-place edits, keyed by *input* file offset. Repair modules add
//! edits; the output builder applies them wherever those input bytes land.
//! Two edits of the same byte are a bug (two modules claiming one field), so they
//! are refused instead of silently letting the later one win.

use crate::elf::Class;
use crate::error::{Error, Reason, Result};

/// One edit of up to eight bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Patch {
    /// Input file offset of the first byte.
    pub off: u64,
    /// Number of bytes (1..=8).
    pub len: u8,
    /// The new bytes (first `len` are used).
    pub bytes: [u8; 8],
}

impl Patch {
    /// The new bytes.
    pub fn data(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

/// Edits collected from the repair modules.
#[derive(Default)]
pub struct Patches {
    items: Vec<Patch>,
}

impl Patches {
    /// Replaces `data.len()` (at most 8) bytes at input offset `off`.
    pub fn put(&mut self, off: u64, data: &[u8]) {
        debug_assert!(!data.is_empty() && data.len() <= 8);
        let mut bytes = [0u8; 8];
        bytes[..data.len()].copy_from_slice(data);
        self.items.push(Patch { off, len: data.len() as u8, bytes });
    }

    /// Writes an address-sized word.
    pub fn put_word(&mut self, class: Class, off: u64, value: u64) {
        self.put(off, &class.word_bytes(value));
    }

    /// The edits sorted by offset; fails if two of them touch the same byte.
    pub fn into_sorted(mut self) -> Result<Vec<Patch>> {
        self.items.sort_unstable_by_key(|p| p.off);
        for w in self.items.windows(2) {
            if w[0].off + u64::from(w[0].len) > w[1].off {
                return Err(Error::new(
                    Reason::Internal,
                    format!("two repairs edit the bytes at input offset {:#x}", w[1].off),
                ));
            }
        }
        Ok(self.items)
    }
}
