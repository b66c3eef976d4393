//! `.debug_addr`: every entry is an address, except the ones DW_OP_constx names
//! (TLS offsets and other constants). DWARF 5 splits the section into contributions
//! with headers; the GNU split-DWARF extension of DWARF 4 has no headers at all.

use super::info::UnitInfo;
use super::unit::Unit;
use super::{Edits, Refs, Sections};
use crate::addr_map::AddrMap;
use crate::error::{Error, Reason, Result};

pub(crate) fn repair(
    units: &[UnitInfo],
    secs: &Sections,
    map: &AddrMap,
    refs: &Refs,
    tls_size: u64,
    ed: &mut Edits,
) -> Result<()> {
    let Some(sec) = secs.id(".debug_addr") else { return Ok(()) };
    // Split DWARF keeps the DW_OP_constx users in .dwo files we do not read; their
    // constants are TLS offsets, which only collide with addresses in a TLS block at
    // least as large as the unmoved part of the image.
    if refs.split_units && tls_size > map.start {
        return Err(Error::new(
            Reason::UnsupportedDwarf,
            ".debug_addr of split DWARF cannot be classified: the TLS block overlaps the moved address range",
        ));
    }
    let data = secs.data(sec);
    let mut constants = refs.addr_constants.clone();
    constants.sort_unstable();
    // DWARF 5 contributions have headers; the GNU split-DWARF extension of DWARF 4
    // (the only other user of .debug_addr) has none.
    let v5 = units.iter().any(|u| u.encoding.version >= 5);
    if v5 && refs.split_units && units.iter().any(|u| u.encoding.version < 5) {
        return Err(Error::new(Reason::UnsupportedDwarf, ".debug_addr is used by both DWARF 5 and GNU DWARF 4 units"));
    }
    let asz = units.first().map_or(8, |u| u.encoding.address_size);
    let mut entries = |from: u64, to: u64, asz: u8| -> Result<()> {
        if !matches!(asz, 4 | 8) {
            return Err(Error::new(Reason::BadDwarf, format!(".debug_addr at {from:#x}: address size {asz}")));
        }
        let mut at = from;
        while at + u64::from(asz) <= to {
            if constants.binary_search(&at).is_err() {
                let mut v = [0u8; 8];
                v[..asz as usize].copy_from_slice(&data[at as usize..(at + u64::from(asz)) as usize]);
                ed.address(map, sec, at, u64::from_le_bytes(v), asz)?;
            }
            at += u64::from(asz);
        }
        Ok(())
    };
    if !v5 {
        return entries(0, data.len() as u64, asz);
    }
    let mut at = 0u64;
    while at < data.len() as u64 {
        let unit = Unit::at(data, at, ".debug_addr", "contribution")?;
        unit.require_version(5)?;
        // The version, address_size, segment_selector_size.
        let sizes = unit.header(2, 2)?;
        let (asz, segment_selector_size) = (sizes[0], sizes[1]);
        if segment_selector_size != 0 {
            return Err(Error::new(
                Reason::UnsupportedDwarf,
                format!(".debug_addr at {at:#x}: segment selector size {segment_selector_size}"),
            ));
        }
        entries(unit.fields + 4, unit.end, asz)?;
        at = unit.end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dwarf::testbytes::{assert_refused, encoding, patched, repaired, Bytes, DV, MAP};

    fn unit(version: u16, address_size: u8) -> UnitInfo {
        UnitInfo { encoding: encoding(version, address_size), low_pc: 0, addr_base: 8 }
    }

    fn walk(data: &[u8], units: &[UnitInfo], refs: &Refs, tls_size: u64) -> Result<Vec<u8>> {
        repaired(".debug_addr", data, |secs, ed| repair(units, secs, &MAP, refs, tls_size, ed))
    }

    /// A DWARF 5 contribution of `entries` of `size` bytes; returns their offsets.
    fn contribution(b: &mut Bytes, size: u8, entries: &[u64]) -> Vec<u64> {
        let len = b.length();
        b.u16(5);
        b.u8(size);
        b.u8(0);
        let at = entries.iter().map(|&e| b.word(e, size)).collect();
        b.end_length(len);
        at
    }

    #[test]
    fn v5_contributions_move_addresses_but_not_constants() {
        let mut b = Bytes::new();
        let wide = contribution(&mut b, 8, &[0x1000, 0x800, 0x1500]);
        let narrow = contribution(&mut b, 4, &[0x8fff, 0x9000]);
        let refs = Refs { addr_constants: vec![wide[2]], ..Refs::default() };
        let out = walk(&b.0, &[unit(5, 8)], &refs, 0).unwrap();
        assert_eq!(out, patched(&b.0, &[(wide[0], 0x1000 + DV, 8), (narrow[0], 0x8fff + DV, 4)]));
    }

    #[test]
    fn gnu_split_dwarf_4_has_no_headers() {
        let mut b = Bytes::new();
        let (a, _, c) = (b.u64(0x1000), b.u64(0x800), b.u64(0x2000));
        let refs = Refs { split_units: true, addr_constants: vec![c], ..Refs::default() };
        let out = walk(&b.0, &[unit(4, 8)], &refs, 0).unwrap();
        assert_eq!(out, patched(&b.0, &[(a, 0x1000 + DV, 8)]));
        // Constants in .dwo files cannot be told apart once TLS reaches the moved range.
        let e = walk(&b.0, &[unit(4, 8)], &refs, MAP.start + 1).unwrap_err();
        assert_eq!(e.reason, Reason::UnsupportedDwarf);
        let e = walk(&b.0, &[unit(4, 8), unit(5, 8)], &refs, 0).unwrap_err();
        assert_eq!(e.reason, Reason::UnsupportedDwarf);
    }

    #[test]
    fn bad_headers_are_errors() {
        let mut version_4 = Bytes::new();
        contribution(&mut version_4, 8, &[0x1000]);
        version_4.0[4] = 4;
        let mut overrun = Bytes::new();
        contribution(&mut overrun, 8, &[0x1000]);
        overrun.0[0] += 1;
        let cases =
            [(version_4.0, Reason::UnsupportedDwarf), (overrun.0, Reason::BadDwarf), (vec![1, 0], Reason::BadDwarf)];
        assert_refused(&cases, |data| walk(data, &[unit(5, 8)], &Refs::default(), 0));
    }

    #[test]
    fn a_contribution_too_short_for_its_header_is_refused_not_read_from_the_next() {
        // Lengths of 0 (no version) and 2 (a version, no sizes), 32-bit and 64-bit,
        // each followed by a well-formed contribution whose bytes must not be borrowed.
        let short = |initial: &[u8], fields: &[u8]| {
            let mut b = Bytes::new();
            b.raw(initial);
            b.raw(fields);
            contribution(&mut b, 8, &[0x1000]);
            b.0
        };
        let dwarf64 = |length: u64| [&[0xff; 4][..], &length.to_le_bytes()].concat();
        let cases = [
            short(&0u32.to_le_bytes(), &[]),
            short(&2u32.to_le_bytes(), &[5, 0]),
            short(&3u32.to_le_bytes(), &[5, 0, 8]),
            short(&dwarf64(2), &[5, 0]),
        ];
        for (i, data) in cases.iter().enumerate() {
            let e = walk(data, &[unit(5, 8)], &Refs::default(), 0).unwrap_err();
            assert_eq!(e.reason, Reason::BadDwarf, "case {i}: {}", e.detail);
            assert!(e.detail.contains("header longer than the contribution"), "case {i}: {}", e.detail);
        }
    }
}
