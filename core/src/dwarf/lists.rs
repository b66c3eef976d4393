//! Location and range lists: `.debug_loc` / `.debug_ranges` (DWARF 2-4) and
//! `.debug_loclists` / `.debug_rnglists` (DWARF 5).
//!
//! Lists are parsed only from the offsets DIEs name, never sequentially: GCC places
//! location-view arrays between the lists. Entries relative to a base transform as
//! `f(base + x) - f(base)`, which is `x` when base and target move together and
//! turns absolute values (base 0) into moved ones. Fixed-size fields are rewritten
//! in place; a LEB128 that would need more bytes is an error, never a re-encoding.

use super::expr::{self, Place};
use super::info::UnitInfo;
use super::{Edits, Refs, SecId, Sections, Slice};
use crate::addr_map::AddrMap;
use crate::error::{Error, Reason, Result};
use crate::leb::read_uleb;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Ranges,
    Locations,
}

struct Ctx<'r, 'a> {
    map: &'r AddrMap,
    sec: SecId,
    name: &'static str,
    data: &'a [u8],
    base_slice: Slice<'a>,
    addr: Option<&'a [u8]>,
}

pub(crate) fn repair(
    units: &[UnitInfo],
    secs: &Sections,
    map: &AddrMap,
    refs: &mut Refs,
    ed: &mut Edits,
) -> Result<()> {
    for kind in [Kind::Locations, Kind::Ranges] {
        let mut lists = std::mem::take(if kind == Kind::Locations { &mut refs.loclists } else { &mut refs.rnglists });
        // Every list once per unit that names it (several DIEs often share one).
        crate::patch::sort_if_needed(&mut lists, |l| *l);
        lists.dedup();
        let constants =
            super::in_parallel(&lists, |_| 1, |share, ed| walk_lists(kind, share, units, secs, map, ed), ed)?;
        for mut c in constants {
            refs.addr_constants.append(&mut c);
        }
    }
    Ok(())
}

fn walk_lists(
    kind: Kind,
    lists: &[(u64, u32)],
    units: &[UnitInfo],
    secs: &Sections,
    map: &AddrMap,
    ed: &mut Edits,
) -> Result<Vec<u64>> {
    let addr = secs.id(".debug_addr").map(|s| secs.data(s));
    let mut constants = Vec::new();
    for &(off, unit) in lists {
        let u = &units[unit as usize];
        let v5 = u.encoding.version >= 5;
        let name = match (kind, v5) {
            (Kind::Locations, false) => ".debug_loc",
            (Kind::Locations, true) => ".debug_loclists",
            (Kind::Ranges, false) => ".debug_ranges",
            (Kind::Ranges, true) => ".debug_rnglists",
        };
        let sec = secs.id(name).ok_or_else(|| {
            Error::new(Reason::BadDwarf, format!("a DIE refers to {name} at {off:#x}, but there is no such section"))
        })?;
        let data = secs.data(sec);
        let c = Ctx { map, sec, name, data, base_slice: gimli::EndianSlice::new(data, gimli::LittleEndian), addr };
        if v5 {
            list_v5(&c, kind, off, u, ed, &mut constants)?;
        } else {
            list_v4(&c, kind, off, u, ed, &mut constants)?;
        }
    }
    Ok(constants)
}

fn err(c: &Ctx, at: u64, what: &str) -> Error {
    Error::new(Reason::BadDwarf, format!("{} at {at:#x}: {what}", c.name))
}

/// The `len` bytes at `at`, or an error saying what ran past the section end.
fn span(c: &Ctx, at: u64, len: u64, what: &str) -> Result<std::ops::Range<usize>> {
    at.checked_add(len)
        .filter(|&end| end <= c.data.len() as u64)
        .map(|end| at as usize..end as usize)
        .ok_or_else(|| err(c, at, what))
}

fn word(c: &Ctx, at: u64, size: u8) -> Result<u64> {
    let b = &c.data[span(c, at, u64::from(size), "list runs past the section end")?];
    let mut v = [0u8; 8];
    v[..size as usize].copy_from_slice(b);
    Ok(u64::from_le_bytes(v))
}

fn mask(size: u8) -> u64 {
    if size >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * size)) - 1
    }
}

/// `f(base + x) - f(base)`, in the address size.
fn relative(map: &AddrMap, base: u64, x: u64, size: u8) -> u64 {
    map.map(base.wrapping_add(x) & mask(size)).wrapping_sub(map.map(base)) & mask(size)
}

/// DWARF 2-4: pairs of addresses; (max, addr) selects a new base, (0, 0) ends.
fn list_v4(c: &Ctx, kind: Kind, start: u64, u: &UnitInfo, ed: &mut Edits, constants: &mut Vec<u64>) -> Result<()> {
    let asz = u.encoding.address_size;
    let mut base = u.low_pc;
    let mut at = start;
    loop {
        let (b, e) = (word(c, at, asz)?, word(c, at + u64::from(asz), asz)?);
        let next = at + 2 * u64::from(asz);
        if b == 0 && e == 0 {
            return Ok(());
        }
        if b == mask(asz) {
            ed.address(c.map, c.sec, at + u64::from(asz), e, asz)?;
            base = e;
            at = next;
            continue;
        }
        for (field, v) in [(at, b), (at + u64::from(asz), e)] {
            let new = relative(c.map, base, v, asz);
            if new != v {
                ed.put(c.sec, field, new, asz)?;
            }
        }
        at = next;
        if kind == Kind::Locations {
            let len = word(c, at, 2)?;
            let body = span(c, at + 2, len, "expression runs past the section end")?;
            walk_expression(c, u, body, ed, constants)?;
            at += 2 + len;
        }
    }
}

fn walk_expression(
    c: &Ctx,
    u: &UnitInfo,
    body: std::ops::Range<usize>,
    ed: &mut Edits,
    constants: &mut Vec<u64>,
) -> Result<()> {
    let place = Place { sec: c.sec, name: c.name, base: c.base_slice, encoding: u.encoding, addr_base: u.addr_base };
    expr::walk(c.base_slice.range(body), &place, c.map, ed, constants)
}

/// DWARF 5 list entry kinds (DW_RLE_* and DW_LLE_* share numbers 0-8).
const END: u8 = 0;
const BASE_ADDRESSX: u8 = 1;
const STARTX_ENDX: u8 = 2;
const STARTX_LENGTH: u8 = 3;
const OFFSET_PAIR: u8 = 4;
const LLE_DEFAULT_LOCATION: u8 = 5;
const RLE_BASE_ADDRESS: u8 = 5;
const RLE_START_END: u8 = 6;
const RLE_START_LENGTH: u8 = 7;
const LLE_BASE_ADDRESS: u8 = 6;
const LLE_START_END: u8 = 7;
const LLE_START_LENGTH: u8 = 8;
const LLE_GNU_VIEW_PAIR: u8 = 9;

fn list_v5(c: &Ctx, kind: Kind, start: u64, u: &UnitInfo, ed: &mut Edits, constants: &mut Vec<u64>) -> Result<()> {
    let asz = u.encoding.address_size;
    let a = u64::from(asz);
    let mut base = u.low_pc;
    let mut at = start;
    let uleb = |at: &mut u64| -> Result<u64> {
        let (v, n) = read_uleb(c.data, *at as usize).ok_or_else(|| err(c, *at, "bad LEB128"))?;
        *at += n as u64;
        Ok(v)
    };
    let indexed = |i: u64| -> Result<u64> {
        let addr = c.addr.ok_or_else(|| err(c, start, "an indexed entry needs .debug_addr, which is missing"))?;
        let b = i
            .checked_mul(a)
            .and_then(|o| o.checked_add(u.addr_base))
            .and_then(|off| crate::elf::slice(addr, off, a).ok())
            .ok_or_else(|| err(c, start, "address index out of range"))?;
        let mut v = [0u8; 8];
        v[..asz as usize].copy_from_slice(b);
        Ok(u64::from_le_bytes(v))
    };
    loop {
        let entry = at;
        let k = *c.data.get(at as usize).ok_or_else(|| err(c, at, "list runs past the section end"))?;
        at += 1;
        let (base_addr_kind, start_end, start_length) = match kind {
            Kind::Ranges => (RLE_BASE_ADDRESS, RLE_START_END, RLE_START_LENGTH),
            Kind::Locations => (LLE_BASE_ADDRESS, LLE_START_END, LLE_START_LENGTH),
        };
        let mut has_expr = kind == Kind::Locations;
        match k {
            END => return Ok(()),
            BASE_ADDRESSX => {
                base = indexed(uleb(&mut at)?)?;
                has_expr = false;
            }
            STARTX_ENDX | STARTX_LENGTH => {
                uleb(&mut at)?;
                uleb(&mut at)?;
            }
            OFFSET_PAIR => {
                for _ in 0..2 {
                    let field = at;
                    let v = uleb(&mut at)?;
                    let new = relative(c.map, base, v, asz);
                    if new != v {
                        put_uleb_same_size(c, ed, field, at - field, new)?;
                    }
                }
            }
            LLE_DEFAULT_LOCATION if kind == Kind::Locations => {}
            LLE_GNU_VIEW_PAIR if kind == Kind::Locations => {
                uleb(&mut at)?;
                uleb(&mut at)?;
                has_expr = false;
            }
            k if k == base_addr_kind => {
                base = word(c, at, asz)?;
                ed.address(c.map, c.sec, at, base, asz)?;
                at += a;
                has_expr = false;
            }
            k if k == start_end => {
                for _ in 0..2 {
                    let v = word(c, at, asz)?;
                    ed.address(c.map, c.sec, at, v, asz)?;
                    at += a;
                }
            }
            k if k == start_length => {
                let v = word(c, at, asz)?;
                ed.address(c.map, c.sec, at, v, asz)?;
                at += a;
                uleb(&mut at)?;
            }
            other => {
                return Err(Error::new(
                    Reason::UnsupportedDwarf,
                    format!("{} at {entry:#x}: unknown list entry kind {other:#x}", c.name),
                ))
            }
        }
        if has_expr {
            let len = uleb(&mut at)?;
            let body = span(c, at, len, "expression runs past the section end")?;
            walk_expression(c, u, body.clone(), ed, constants)?;
            at = body.end as u64;
        }
    }
}

/// Rewrites a ULEB128 of `len` bytes in place, padding with continuation bytes; an
/// error when the value needs more bytes than the field has.
fn put_uleb_same_size(c: &Ctx, ed: &mut Edits, at: u64, len: u64, value: u64) -> Result<()> {
    if len > 8 || (len < 10 && value >> (7 * len) != 0) {
        return Err(Error::new(
            Reason::UnsupportedDwarf,
            format!(
                "{} at {at:#x}: an offset pair relative to a base that does not move would grow; \
                 the list cannot be rewritten in place",
                c.name
            ),
        ));
    }
    let mut bytes = 0u64;
    for i in 0..len {
        let mut b = (value >> (7 * i)) & 0x7f;
        if i + 1 < len {
            b |= 0x80;
        }
        bytes |= b << (8 * i);
    }
    ed.put(c.sec, at, bytes, len as u8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dwarf::testbytes::{assert_refused, encoding, entry, framed, patched, uleb, Bytes, DV, MAP};
    use gimli::constants as dw;

    fn unit(version: u16, address_size: u8, low_pc: u64) -> UnitInfo {
        UnitInfo { encoding: encoding(version, address_size), low_pc, addr_base: ADDR_BASE }
    }

    /// Where the test `.debug_addr` entries start (after a DWARF 5 header).
    const ADDR_BASE: u64 = 8;

    /// A `.debug_addr` with a DWARF 5 header and these 8-byte entries.
    fn debug_addr(entries: &[u64]) -> Vec<u8> {
        let mut b = Bytes::new();
        let len = b.length();
        b.u16(5);
        b.u8(8);
        b.u8(0);
        for &e in entries {
            b.u64(e);
        }
        b.end_length(len);
        b.0
    }

    /// A DWARF 5 list section header with no offset table; lists start after it.
    fn v5_header(b: &mut Bytes) -> u64 {
        let len = b.length();
        b.u16(5);
        b.u8(8);
        b.u8(0);
        b.u32(0);
        len
    }

    /// A DWARF 5 list section begun: its bytes, length field and first list's offset.
    fn v5_table() -> (Bytes, u64, u64) {
        let mut b = Bytes::new();
        let len = v5_header(&mut b);
        let list = b.at();
        (b, len, list)
    }

    /// Walks the lists at `offsets` (each of unit 0) of section `name`; returns the
    /// section after the walk and the `.debug_addr` constants found.
    fn walk(name: &str, data: &[u8], u: UnitInfo, offsets: &[u64]) -> Result<(Vec<u8>, Vec<u64>)> {
        let addr = debug_addr(&[0x2000, 0x3000]);
        let secs = Sections::for_tests(&[(name, data), (".debug_addr", &addr)]);
        let mut refs = Refs::default();
        let lists = offsets.iter().map(|&o| (o, 0)).collect();
        if name.contains("loc") {
            refs.loclists = lists;
        } else {
            refs.rnglists = lists;
        }
        let mut ed = Edits::new(&secs);
        repair(&[u], &secs, &MAP, &mut refs, &mut ed)?;
        assert!(ed.moves_of(SecId(1)).is_empty() && ed.puts_of(SecId(1)).is_empty(), ".debug_addr is addr.rs's");
        Ok((ed.applied(&secs, SecId(0), &MAP), refs.addr_constants))
    }

    #[test]
    fn v4_ranges_move_absolute_pairs_and_keep_pairs_relative_to_a_moving_base() {
        let mut b = Bytes::new();
        // Relative to the unit's low_pc, which moves with them: unchanged.
        b.u64(0x10);
        b.u64(0x20);
        // A base that stays (0x700) under targets that move (0x1000, 0x1100).
        b.u64(u64::MAX);
        b.u64(0x700);
        let p1 = b.u64(0x900);
        let p2 = b.u64(0xa00);
        // Targets that stay too: 0x9100 is past the moved range.
        b.u64(0x8a00);
        b.u64(0x8a10);
        // A base inside the moved range moves itself.
        b.u64(u64::MAX);
        let base = b.u64(0x2000);
        b.u64(0);
        b.u64(0);
        // A second list, of a unit whose base is 0: absolute addresses.
        let absolute = b.u64(0x1000);
        let absolute_end = b.u64(0x1100);
        b.u64(0x100);
        b.u64(0x200);
        b.u64(0);
        b.u64(0);
        let (out, _) = walk(".debug_ranges", &b.0, unit(4, 8, 0x1000), &[0]).unwrap();
        let want = [(p1, 0x900 + DV, 8), (p2, 0xa00 + DV, 8), (base, 0x2000 + DV, 8)];
        assert_eq!(out, patched(&b.0, &want));
        let (out, _) = walk(".debug_ranges", &b.0, unit(4, 8, 0), &[absolute]).unwrap();
        assert_eq!(out, patched(&b.0, &[(absolute, 0x1000 + DV, 8), (absolute_end, 0x1100 + DV, 8)]));
    }

    #[test]
    fn v4_locations_of_4_byte_addresses_walk_their_expressions() {
        let mut b = Bytes::new();
        let start = b.u32(0x1000);
        let end = b.u32(0x1010);
        b.u16(5);
        b.u8(dw::DW_OP_addr.0);
        let addr = b.u32(0x2000);
        b.u32(0x9000);
        b.u32(0x9010);
        b.u16(1);
        b.u8(dw::DW_OP_reg0.0);
        b.u32(0);
        b.u32(0);
        let (out, _) = walk(".debug_loc", &b.0, unit(4, 4, 0), &[0]).unwrap();
        let want = [(start, 0x1000 + DV, 4), (end, 0x1010 + DV, 4), (addr, 0x2000 + DV, 4)];
        assert_eq!(out, patched(&b.0, &want));
        // The expression's length runs past the section.
        let cut = &b.0[..addr as usize + 2];
        assert_eq!(walk(".debug_loc", cut, unit(4, 4, 0), &[0]).unwrap_err().reason, Reason::BadDwarf);
    }

    #[test]
    fn v5_range_list_entries_of_every_kind() {
        let (mut b, len, list) = v5_table();
        entry(&mut b, dw::DW_RLE_offset_pair.0, &[0x10, 0x20]);
        b.u8(dw::DW_RLE_base_address.0);
        b.u64(0x700);
        // Relative to 0x700, which stays, targets at 0x1000 and 0x1100 which move: the
        // ULEB128s (padded to 4 bytes, as a linker leaves them) grow by the shift.
        b.u8(dw::DW_RLE_offset_pair.0);
        let p1 = b.uleb_padded(0x900, 4);
        let p2 = b.uleb_padded(0xa00, 4);
        b.u8(dw::DW_RLE_start_end.0);
        let start = b.u64(0x1100);
        b.u64(0x9100);
        b.u8(dw::DW_RLE_start_length.0);
        let start2 = b.u64(0x8ff0);
        b.uleb(0x10);
        // .debug_addr entry 1 (0x3000) as base: it moves with what is relative to it.
        entry(&mut b, dw::DW_RLE_base_addressx.0, &[1]);
        entry(&mut b, dw::DW_RLE_offset_pair.0, &[4, 8]);
        // Indexed entries are .debug_addr's to move.
        entry(&mut b, dw::DW_RLE_startx_length.0, &[0, 4]);
        entry(&mut b, dw::DW_RLE_startx_endx.0, &[0, 1]);
        b.u8(dw::DW_RLE_end_of_list.0);
        b.end_length(len);
        let (out, _) = walk(".debug_rnglists", &b.0, unit(5, 8, 0x1000), &[list]).unwrap();
        let mut want = patched(&b.0, &[(start, 0x1100 + DV, 8), (start2, 0x8ff0 + DV, 8)]);
        want[p1 as usize..p1 as usize + 4].copy_from_slice(&uleb(0x900 + DV, 4));
        want[p2 as usize..p2 as usize + 4].copy_from_slice(&uleb(0xa00 + DV, 4));
        assert_eq!(out, want);
    }

    #[test]
    fn v5_lists_that_cannot_be_rewritten_in_place_are_errors() {
        let list = |body: &dyn Fn(&mut Bytes)| framed(v5_header, body);
        // 0x900 from a base that stays to a target that moves needs 4 bytes, not 2.
        let grows = list(&|b| {
            b.u8(dw::DW_RLE_base_address.0);
            b.u64(0x700);
            entry(b, dw::DW_RLE_offset_pair.0, &[0x900, 0x910]);
            b.u8(dw::DW_RLE_end_of_list.0);
        });
        // DW_LLE_start_length's number, which no range list entry has.
        let unknown = list(&|b| {
            b.u8(dw::DW_LLE_start_length.0);
        });
        let index_out_of_range = list(&|b| {
            entry(b, dw::DW_RLE_base_addressx.0, &[2]);
        });
        let truncated = list(&|b| {
            b.u8(dw::DW_RLE_start_end.0);
            b.u32(0x1000);
        });
        let cases = [
            (grows, Reason::UnsupportedDwarf),
            (unknown, Reason::UnsupportedDwarf),
            (index_out_of_range, Reason::BadDwarf),
            (truncated, Reason::BadDwarf),
        ];
        assert_refused(&cases, |data| walk(".debug_rnglists", data, unit(5, 8, 0x1000), &[12]));
    }

    #[test]
    fn v5_location_list_entries_and_their_expressions() {
        let (mut b, len, list) = v5_table();
        entry(&mut b, dw::DW_LLE_offset_pair.0, &[0, 0x10]);
        b.uleb(9); // the expression's length
        b.u8(dw::DW_OP_addr.0);
        let a1 = b.u64(0x1800);
        b.u8(dw::DW_LLE_start_length.0);
        b.u64(0x9000);
        b.uleb(4);
        b.uleb(9);
        b.u8(dw::DW_OP_addr.0);
        let a2 = b.u64(0x2000);
        // DW_OP_constx 1 names .debug_addr entry 1 as a constant for addr.rs.
        b.u8(dw::DW_LLE_default_location.0);
        b.uleb(3);
        b.u8(dw::DW_OP_constx.0);
        b.uleb(1);
        b.u8(dw::DW_OP_stack_value.0);
        entry(&mut b, dw::DW_LLE_GNU_view_pair.0, &[1, 2]);
        b.u8(dw::DW_LLE_base_address.0);
        let base = b.u64(0x8000);
        b.u8(dw::DW_LLE_start_end.0);
        let start = b.u64(0x1000);
        b.u64(0x9000);
        b.uleb(1);
        b.u8(dw::DW_OP_reg0.0);
        b.u8(dw::DW_LLE_end_of_list.0);
        b.end_length(len);
        let (out, constants) = walk(".debug_loclists", &b.0, unit(5, 8, 0x1000), &[list]).unwrap();
        let want = [(a1, 0x1800 + DV, 8), (a2, 0x2000 + DV, 8), (base, 0x8000 + DV, 8), (start, 0x1000 + DV, 8)];
        assert_eq!(out, patched(&b.0, &want));
        assert_eq!(constants, [ADDR_BASE + 8]);
    }
}
