//! The frame of a unit in the sections walked without gimli (`.debug_aranges`
//! sets, `.debug_addr` contributions): an initial length, then header fields that
//! are read from the unit's own bytes only, never from the next unit's.

use crate::elf::{read_u32, read_u64};
use crate::error::{Error, Reason, Result};

pub(crate) struct Unit<'a> {
    data: &'a [u8],
    section: &'static str,
    /// What the section calls its units, for messages.
    what: &'static str,
    /// Where the unit (its length field) starts.
    pub start: u64,
    /// Where its header fields start, after the initial length.
    pub fields: u64,
    /// One past its last byte.
    pub end: u64,
    /// 4 in 32-bit DWARF, 8 in 64-bit.
    pub offset_size: u64,
}

impl<'a> Unit<'a> {
    /// The unit at `start` of `data`, which must end inside it.
    pub fn at(data: &'a [u8], start: u64, section: &'static str, what: &'static str) -> Result<Self> {
        let bad = |detail: &str| Error::new(Reason::BadDwarf, format!("{section} at {start:#x}: {detail}"));
        let truncated = |_| bad("truncated initial length");
        let (length, fields, offset_size) = match read_u32(data, start).map_err(truncated)? {
            0xffff_ffff => (read_u64(data, start + 4).map_err(truncated)?, start + 12, 8),
            length => (u64::from(length), start + 4, 4),
        };
        let end = fields
            .checked_add(length)
            .filter(|&end| end <= data.len() as u64)
            .ok_or_else(|| bad(&format!("{what} runs past the section end")))?;
        Ok(Unit { data, section, what, start, fields, end, offset_size })
    }

    /// The `len` header bytes `at` bytes into the header fields; an error when the
    /// unit ends before them, as the unit is then malformed.
    pub fn header(&self, at: u64, len: u64) -> Result<&'a [u8]> {
        let from = self.fields + at;
        if from + len > self.end {
            return Err(Error::new(
                Reason::BadDwarf,
                format!(
                    "{} at {:#x}: header longer than the {} ({} bytes)",
                    self.section,
                    self.start,
                    self.what,
                    self.end - self.fields
                ),
            ));
        }
        Ok(&self.data[from as usize..(from + len) as usize])
    }

    /// Checks the 2-byte version that starts every header: the one version of the
    /// section's units this walker reads, any other unsupported.
    pub fn require_version(&self, supported: u16) -> Result<()> {
        let b = self.header(0, 2)?;
        let version = u16::from_le_bytes([b[0], b[1]]);
        if version != supported {
            return Err(Error::new(
                Reason::UnsupportedDwarf,
                format!("{} at {:#x}: version {version}", self.section, self.start),
            ));
        }
        Ok(())
    }
}
