//! `.debug_aranges`: sets of (address, length) tuples after a header; the tuples
//! start at a multiple of their own size from the set's start.

use super::unit::Unit;
use super::{Edits, Sections};
use crate::addr_map::AddrMap;
use crate::elf::{align_up, read_u32, read_u64};
use crate::error::{Error, Reason, Result};

pub(crate) fn repair(secs: &Sections, map: &AddrMap, ed: &mut Edits) -> Result<()> {
    let Some(sec) = secs.id(".debug_aranges") else { return Ok(()) };
    let data = secs.data(sec);
    let mut set = 0u64;
    while set < data.len() as u64 {
        let unit = Unit::at(data, set, ".debug_aranges", "set")?;
        unit.require_version(2)?;
        // The version, debug_info_offset, address_size, segment_selector_size.
        let header = 2 + unit.offset_size + 2;
        let sizes = unit.header(header - 2, 2)?;
        let (asz, seg) = (sizes[0], sizes[1]);
        if seg != 0 || !matches!(asz, 4 | 8) {
            return Err(Error::new(
                Reason::UnsupportedDwarf,
                format!(".debug_aranges at {set:#x}: address size {asz}"),
            ));
        }
        let tuple = 2 * u64::from(asz);
        let mut at = set + align_up(unit.fields + header - set, tuple);
        while at + tuple <= unit.end {
            let addr = if asz == 8 { read_u64(data, at)? } else { u64::from(read_u32(data, at)?) };
            let size = if asz == 8 { read_u64(data, at + 8)? } else { u64::from(read_u32(data, at + 4)?) };
            if addr == 0 && size == 0 {
                break;
            }
            ed.address(map, sec, at, addr, asz)?;
            at += tuple;
        }
        set = unit.end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dwarf::testbytes::{assert_refused, patched, repaired, Bytes, DV, MAP};

    /// A set header (32-bit); the tuples start at the next multiple of their size.
    fn set(b: &mut Bytes, version: u16, address_size: u8, segment_size: u8) -> u64 {
        let len = b.length();
        b.u16(version);
        b.u32(0); // debug_info_offset
        b.u8(address_size);
        b.u8(segment_size);
        while b.at() % (2 * u64::from(address_size)) != 0 {
            b.u8(0);
        }
        len
    }

    fn walk(data: &[u8]) -> Result<Vec<u8>> {
        repaired(".debug_aranges", data, |secs, ed| repair(secs, &MAP, ed))
    }

    #[test]
    fn tuple_addresses_inside_the_range_move_lengths_stay() {
        let mut b = Bytes::new();
        let len = set(&mut b, 2, 8, 0);
        assert_eq!(b.at(), 16, "tuples of 16 bytes start at 16");
        let a1 = b.u64(0x1000);
        b.u64(0x100);
        b.u64(0x9000);
        b.u64(0x10);
        b.u64(0);
        b.u64(0);
        b.end_length(len);
        // A set of 4-byte addresses: its header ends at 12, its tuples start at 16.
        let start = b.at();
        let len = set(&mut b, 2, 4, 0);
        assert_eq!(b.at() - start, 16);
        let a2 = b.u32(0x2000);
        b.u32(0x20);
        b.u32(0);
        b.u32(0);
        b.end_length(len);
        assert_eq!(walk(&b.0).unwrap(), patched(&b.0, &[(a1, 0x1000 + DV, 8), (a2, 0x2000 + DV, 4)]));
    }

    #[test]
    fn unknown_versions_segments_and_overruns_are_errors() {
        let one = |version: u16, address_size: u8, segment_size: u8, extra: u32| {
            let mut b = Bytes::new();
            let len = set(&mut b, version, address_size, segment_size);
            b.u64(0);
            b.u64(0);
            b.end_length(len);
            let n = b.0[0] as u32 + extra;
            b.0[..4].copy_from_slice(&n.to_le_bytes());
            b.0
        };
        let cases = [
            (one(3, 8, 0, 0), Reason::UnsupportedDwarf),
            (one(2, 8, 1, 0), Reason::UnsupportedDwarf),
            (one(2, 2, 0, 0), Reason::UnsupportedDwarf),
            (one(2, 8, 0, 1), Reason::BadDwarf),
            (vec![0, 0], Reason::BadDwarf),
        ];
        assert_refused(&cases, walk);
    }

    #[test]
    fn a_set_too_short_for_its_header_is_refused_not_read_from_the_next() {
        // A well-formed set follows; a short set's header must not borrow its bytes.
        let next = |b: &mut Bytes| {
            let len = set(b, 2, 8, 0);
            b.u64(0x1000);
            b.u64(0x10);
            b.u64(0);
            b.u64(0);
            b.end_length(len);
        };
        // Lengths of 0 (no version), 2 (a version, no offset or sizes) and 7 (no
        // segment selector size), 32-bit and 64-bit.
        let short = |length: u32, fields: &[u8]| {
            let mut b = Bytes::new();
            b.u32(length);
            b.raw(fields);
            next(&mut b);
            b.0
        };
        let mut dwarf64 = Bytes::new();
        dwarf64.u32(0xffff_ffff);
        dwarf64.u64(2);
        dwarf64.u16(2);
        next(&mut dwarf64);
        let cases = [short(0, &[]), short(2, &[2, 0]), short(7, &[2, 0, 0, 0, 0, 0, 8]), dwarf64.0];
        for (i, data) in cases.iter().enumerate() {
            let e = walk(data).unwrap_err();
            assert_eq!(e.reason, Reason::BadDwarf, "case {i}: {}", e.detail);
            assert!(e.detail.contains("header longer than the set"), "case {i}: {}", e.detail);
        }
    }
}
