//! `.gdb_index` (versions 7 and 8): its address area holds (low, high, CU index)
//! triples after a header of six 32-bit offsets.

use super::{Edits, Sections};
use crate::addr_map::AddrMap;
use crate::elf::{read_u32, read_u64};
use crate::error::{Error, Reason, Result};

pub(crate) fn repair(secs: &Sections, map: &AddrMap, ed: &mut Edits) -> Result<()> {
    let Some(sec) = secs.id(".gdb_index") else { return Ok(()) };
    let data = secs.data(sec);
    let bad = |what: &str| Error::new(Reason::BadDwarf, format!(".gdb_index: {what}"));
    let version = read_u32(data, 0).map_err(|_| bad("truncated header"))?;
    if !(7..=9).contains(&version) {
        return Err(Error::new(Reason::UnsupportedDwarf, format!(".gdb_index version {version}")));
    }
    // Six 32-bit fields; version 9 adds the shortcut table's offset before the
    // constant pool's.
    let header = if version >= 9 { 28 } else { 24 };
    if (data.len() as u64) < header {
        return Err(bad(&format!("header of {header} bytes longer than the section ({} bytes)", data.len())));
    }
    let area = u64::from(read_u32(data, 12)?);
    let symbols = u64::from(read_u32(data, 16)?);
    // An address area starting inside the header would have header fields
    // rewritten as addresses.
    if area < header {
        return Err(bad(&format!("address area at {area:#x} overlaps the header of {header} bytes")));
    }
    if area > symbols || symbols > data.len() as u64 || (symbols - area) % 20 != 0 {
        return Err(bad("address area is inconsistent with the header"));
    }
    let mut at = area;
    while at < symbols {
        for field in [at, at + 8] {
            ed.address(map, sec, field, read_u64(data, field)?, 8)?;
        }
        at += 20;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dwarf::testbytes::{assert_refused, patched, repaired, Bytes, DV, MAP};

    /// An index of `version` with one CU, no type units, the address area at
    /// `area` (where the caller's triples go), an empty symbol table and pool.
    fn index(version: u32, area: Option<u32>, triples: &[(u64, u64)]) -> (Vec<u8>, Vec<u64>) {
        let header = if version >= 9 { 28 } else { 24 };
        let area_at = area.unwrap_or(header + 16);
        let symbols = area_at + 20 * triples.len() as u32;
        let mut b = Bytes::new();
        b.u32(version);
        b.u32(header); // CU list
        b.u32(header + 16); // types CU list, empty
        b.u32(area_at);
        b.u32(symbols);
        if version >= 9 {
            b.u32(symbols); // shortcut table
        }
        b.u32(symbols); // constant pool
        b.u64(0); // the CU's offset and length
        b.u64(0x40);
        let mut fields = Vec::new();
        if area.is_none() {
            for &(low, high) in triples {
                fields.push(b.u64(low));
                b.u64(high);
                b.u32(0);
            }
        }
        (b.0, fields)
    }

    fn walk(data: &[u8]) -> Result<Vec<u8>> {
        repaired(".gdb_index", data, |secs, ed| repair(secs, &MAP, ed))
    }

    #[test]
    fn address_area_triples_move_in_versions_7_to_9() {
        for version in 7..=9 {
            let (data, at) = index(version, None, &[(0x1000, 0x1100), (0x9000, 0x9100)]);
            let want = [(at[0], 0x1000 + DV, 8), (at[0] + 8, 0x1100 + DV, 8)];
            assert_eq!(walk(&data).unwrap(), patched(&data, &want), "version {version}");
        }
    }

    #[test]
    fn a_header_cut_short_or_overlapped_by_the_address_area_is_refused() {
        let (whole, _) = index(8, None, &[]);
        let (v9, _) = index(9, None, &[]);
        // An address area over the header would rewrite header fields as addresses:
        // 20 bytes from 0 cover the version and four offsets.
        let (at_0, _) = index(8, Some(0), &[]);
        let mut over_header = at_0.clone();
        over_header[16..20].copy_from_slice(&20u32.to_le_bytes());
        // In version 9 the header is 28 bytes: an area at 24 starts inside it.
        let mut over_v9 = v9.clone();
        over_v9[12..16].copy_from_slice(&24u32.to_le_bytes());
        over_v9[16..20].copy_from_slice(&44u32.to_le_bytes());
        let cases = [
            (whole[..20].to_vec(), "longer than the section"),
            (v9[..24].to_vec(), "longer than the section"),
            (over_header, "overlaps the header"),
            (over_v9, "overlaps the header"),
        ];
        for (i, (data, what)) in cases.iter().enumerate() {
            let e = walk(data).unwrap_err();
            assert_eq!(e.reason, Reason::BadDwarf, "case {i}: {}", e.detail);
            assert!(e.detail.contains(what), "case {i}: {}", e.detail);
        }
        assert_refused(&[(vec![7, 0, 0], Reason::BadDwarf), (vec![10, 0, 0, 0], Reason::UnsupportedDwarf)], walk);
    }
}
