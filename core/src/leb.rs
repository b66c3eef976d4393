//! LEB128 decoding, returning the value and the number of bytes read.

/// Decodes an unsigned LEB128 at `pos`; `None` if truncated or over 64 bits.
pub fn read_uleb(data: &[u8], pos: usize) -> Option<(u64, usize)> {
    let mut value = 0u64;
    let mut shift = 0u32;
    for (i, &b) in data.get(pos..)?.iter().enumerate() {
        if shift >= 64 && b & 0x7f != 0 {
            return None;
        }
        if shift < 64 {
            value |= u64::from(b & 0x7f) << shift;
        }
        shift += 7;
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// Decodes a signed LEB128 at `pos`; `None` if truncated.
pub fn read_sleb(data: &[u8], pos: usize) -> Option<(i64, usize)> {
    let mut value = 0i64;
    let mut shift = 0u32;
    for (i, &b) in data.get(pos..)?.iter().enumerate() {
        if shift < 64 {
            value |= i64::from(b & 0x7f) << shift;
        }
        shift += 7;
        if b & 0x80 == 0 {
            if shift < 64 && b & 0x40 != 0 {
                value |= -1i64 << shift;
            }
            return Some((value, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_spec_examples() {
        // DWARF 5, section 7.6, tables 7.7 and 7.8.
        assert_eq!(read_uleb(&[2], 0), Some((2, 1)));
        assert_eq!(read_uleb(&[0x7f], 0), Some((127, 1)));
        assert_eq!(read_uleb(&[0x80, 1], 0), Some((128, 2)));
        assert_eq!(read_uleb(&[0xb9, 0x64], 0), Some((12857, 2)));
        assert_eq!(read_sleb(&[0x7e], 0), Some((-2, 1)));
        assert_eq!(read_sleb(&[0xff, 0], 0), Some((127, 2)));
        assert_eq!(read_sleb(&[0x80, 0x7f], 0), Some((-128, 2)));
        assert_eq!(read_uleb(&[0x80], 0), None);
    }
}
