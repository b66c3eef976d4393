//! `.debug_info` and `.debug_types`: attributes with DW_FORM_addr move; expressions
//! (exprloc, and blocks of attributes whose value is an expression) are walked;
//! references to location and range lists are collected for `lists`.
//!
//! The walk is the costliest part of a DWARF repair, so units are spread over the
//! available cores, and attributes whose form cannot hold an address, an expression
//! or a list reference are skipped without being decoded.

use super::expr::{self, Place};
use super::{gimli_err, Edits, Refs, SecId, Sections, Slice};
use crate::addr_map::AddrMap;
use crate::error::{Error, Reason, Result};
use crate::leb::read_uleb;
use gimli::constants as dw;
use gimli::AttributeValue as V;

/// What later passes need to know about a unit.
pub(crate) struct UnitInfo {
    /// Address size, offset size, version.
    pub encoding: gimli::Encoding,
    /// The unit's base address (DW_AT_low_pc, 0 when absent).
    pub low_pc: u64,
    /// DW_AT_addr_base / DW_AT_GNU_addr_base.
    pub addr_base: u64,
}

/// Attributes whose *block* form holds a DWARF expression, beyond those gimli
/// already classifies (GNU call-site attributes of DWARF 2-4).
const EXPRESSION_BLOCKS: &[dw::DwAt] = &[
    dw::DW_AT_GNU_call_site_value,
    dw::DW_AT_GNU_call_site_data_value,
    dw::DW_AT_GNU_call_site_target,
    dw::DW_AT_GNU_call_site_target_clobbered,
];

/// Attributes whose block form is raw data.
const DATA_BLOCKS: &[dw::DwAt] = &[dw::DW_AT_const_value, dw::DW_AT_discr_list, dw::DW_AT_discr_value];

type Header<'a> = gimli::UnitHeader<Slice<'a>>;

/// Walks every unit; returns per-unit facts in section order.
pub(crate) fn repair(
    dwarf: &gimli::Dwarf<Slice<'_>>,
    secs: &Sections,
    map: &AddrMap,
    ed: &mut Edits,
    refs: &mut Refs,
) -> Result<Vec<UnitInfo>> {
    let mut headers = Vec::new();
    if let Some(sec) = secs.id(".debug_info") {
        let mut iter = dwarf.units();
        while let Some(h) = iter.next().map_err(|e| gimli_err(".debug_info", 0, e))? {
            headers.push((sec, ".debug_info", h));
        }
    }
    if let Some(sec) = secs.id(".debug_types") {
        let mut iter = dwarf.type_units();
        while let Some(h) = iter.next().map_err(|e| gimli_err(".debug_types", 0, e))? {
            headers.push((sec, ".debug_types", h));
        }
    }
    // Every walker reads addresses of the unit's size into 8-byte words.
    if let Some((_, name, h)) = headers.iter().find(|(_, _, h)| !matches!(h.encoding().address_size, 4 | 8)) {
        return Err(Error::new(
            Reason::BadDwarf,
            format!("{name}: unit at {:#x} has address size {}", h.offset().0, h.encoding().address_size),
        ));
    }
    let shares = super::in_parallel(
        &headers,
        |(_, _, h)| h.length_including_self(),
        |share, ed| {
            let mut refs = Refs::default();
            let mut units = Vec::new();
            for (sec, name, header) in share {
                walk_unit(dwarf, *header, *sec, name, secs, map, ed, &mut refs, &mut units)?;
            }
            Ok((units, refs))
        },
        ed,
    )?;
    let mut units = Vec::new();
    for (u, mut r) in shares {
        let base = units.len();
        let base = base as u32;
        refs.loclists.extend(r.loclists.iter().map(|&(o, i)| (o, i + base)));
        refs.rnglists.extend(r.rnglists.iter().map(|&(o, i)| (o, i + base)));
        refs.addr_constants.append(&mut r.addr_constants);
        refs.split_units |= r.split_units;
        units.extend(u);
    }
    Ok(units)
}

/// Whether an attribute of this form can hold an address, an expression or a list
/// reference (data4/data8 are list offsets in DWARF 2 and 3).
fn interesting(form: dw::DwForm, version: u16) -> bool {
    matches!(
        form,
        dw::DW_FORM_addr
            | dw::DW_FORM_addrx
            | dw::DW_FORM_addrx1
            | dw::DW_FORM_addrx2
            | dw::DW_FORM_addrx3
            | dw::DW_FORM_addrx4
            | dw::DW_FORM_GNU_addr_index
            | dw::DW_FORM_exprloc
            | dw::DW_FORM_block
            | dw::DW_FORM_block1
            | dw::DW_FORM_block2
            | dw::DW_FORM_block4
            | dw::DW_FORM_sec_offset
            | dw::DW_FORM_loclistx
            | dw::DW_FORM_rnglistx
            | dw::DW_FORM_indirect
    ) || (version < 4 && matches!(form, dw::DW_FORM_data4 | dw::DW_FORM_data8))
}

/// How to walk the attributes of one abbreviation: runs to skip, and the indices
/// of attributes to decode.
enum Step {
    Skip(usize, usize),
    Read(usize),
}

#[allow(clippy::too_many_arguments)]
fn walk_unit<'a>(
    dwarf: &gimli::Dwarf<Slice<'a>>,
    header: Header<'a>,
    sec: SecId,
    name: &'static str,
    secs: &Sections,
    map: &AddrMap,
    ed: &mut Edits,
    refs: &mut Refs,
    units: &mut Vec<UnitInfo>,
) -> Result<()> {
    let start = header.offset().0 as u64;
    let err = |at: u64| move |e| gimli_err(name, at, e);
    let unit = gimli::Unit::new(dwarf, header).map_err(err(start))?;
    let encoding = unit.encoding();
    let index = units.len() as u32;
    units.push(UnitInfo { encoding, low_pc: unit.low_pc, addr_base: unit.addr_base.0 as u64 });
    refs.split_units |= unit.dwo_id.is_some();
    let base = gimli::EndianSlice::new(secs.data(sec), gimli::LittleEndian);
    let place = Place { sec, name, base, encoding, addr_base: unit.addr_base.0 as u64 };
    // Per abbreviation code (small, dense integers in practice): which attributes to
    // decode. Indexed rather than hashed: this lookup happens once per DIE.
    let mut plans: Vec<Option<Vec<Step>>> = Vec::new();
    let mut raw = unit.entries_raw(None).map_err(err(start))?;
    while !raw.is_empty() {
        let at = start + raw.next_offset().0 as u64;
        let Some(abbrev) = raw.read_abbreviation().map_err(err(at))? else { continue };
        let specs = abbrev.attributes();
        let code = abbrev.code() as usize;
        if code >= plans.len() {
            if code > 1 << 20 {
                return Err(Error::new(
                    Reason::UnsupportedDwarf,
                    format!("{name} at {at:#x}: abbreviation code {code}"),
                ));
            }
            plans.resize_with(code + 1, || None);
        }
        let steps = plans[code].get_or_insert_with(|| plan(specs, encoding.version));
        for step in steps.iter() {
            let i = match *step {
                Step::Skip(a, b) => {
                    let at = start + raw.next_offset().0 as u64;
                    raw.skip_attributes(&specs[a..b]).map_err(err(at))?;
                    continue;
                }
                Step::Read(i) => i,
            };
            let spec = specs[i];
            let at = start + raw.next_offset().0 as u64;
            let attr = raw.read_attribute(spec).map_err(err(at))?;
            match attr.value() {
                V::Addr(a) => {
                    let off = if spec.form() == dw::DW_FORM_indirect { at + uleb_len(base, at)? } else { at };
                    ed.address(map, sec, off, a, encoding.address_size)?;
                }
                V::Exprloc(e) => expr::walk(e.0, &place, map, ed, &mut refs.addr_constants)?,
                V::Block(b) if EXPRESSION_BLOCKS.contains(&attr.name()) => {
                    expr::walk(b, &place, map, ed, &mut refs.addr_constants)?
                }
                V::Block(_) if DATA_BLOCKS.contains(&attr.name()) => {}
                V::Block(_) => {
                    return Err(Error::new(
                        Reason::UnsupportedDwarf,
                        format!("{name} at {at:#x}: block value of {} cannot be classified", attr.name()),
                    ))
                }
                V::LocationListsRef(o) => refs.loclists.push((o.0 as u64, index)),
                V::DebugLocListsIndex(i) => {
                    let o = dwarf.locations_offset(&unit, i).map_err(err(at))?;
                    refs.loclists.push((o.0 as u64, index));
                }
                V::RangeListsRef(r) => refs.rnglists.push((dwarf.ranges_offset_from_raw(&unit, r).0 as u64, index)),
                V::DebugRngListsIndex(i) => {
                    let o = dwarf.ranges_offset(&unit, i).map_err(err(at))?;
                    refs.rnglists.push((o.0 as u64, index));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

fn plan(specs: &[gimli::AttributeSpecification], version: u16) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut run = 0;
    for (i, s) in specs.iter().enumerate() {
        if interesting(s.form(), version) {
            if run < i {
                steps.push(Step::Skip(run, i));
            }
            steps.push(Step::Read(i));
            run = i + 1;
        }
    }
    if run < specs.len() {
        steps.push(Step::Skip(run, specs.len()));
    }
    steps
}

fn uleb_len(base: Slice<'_>, at: u64) -> Result<u64> {
    read_uleb(base.slice(), at as usize)
        .map(|(_, n)| n as u64)
        .ok_or_else(|| Error::new(Reason::BadDwarf, format!("bad DW_FORM_indirect at {at:#x}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dwarf::testbytes::{abbrev, assert_refused, framed, patched, Bytes, DV, MAP};
    use dw::*;

    /// The abbreviations the tests' units use.
    fn abbrevs() -> Vec<u8> {
        let mut a = Bytes::new();
        let cu = [(DW_AT_producer, DW_FORM_string), (DW_AT_low_pc, DW_FORM_addr), (DW_AT_high_pc, DW_FORM_data8)];
        abbrev(&mut a, 1, DW_TAG_compile_unit, true, &[&cu[..], &[(DW_AT_ranges, DW_FORM_sec_offset)]].concat());
        abbrev(
            &mut a,
            2,
            DW_TAG_subprogram,
            false,
            &[(DW_AT_low_pc, DW_FORM_addr), (DW_AT_frame_base, DW_FORM_exprloc)],
        );
        let var = [(DW_AT_location, DW_FORM_exprloc), (DW_AT_const_value, DW_FORM_block1)];
        abbrev(&mut a, 3, DW_TAG_variable, false, &[&var[..], &[(DW_AT_entry_pc, DW_FORM_indirect)]].concat());
        abbrev(&mut a, 4, DW_TAG_variable, false, &[(DW_AT_location, DW_FORM_sec_offset)]);
        abbrev(&mut a, 5, DW_TAG_compile_unit, true, &[(DW_AT_low_pc, DW_FORM_addr)]);
        // DWARF 3 has no sec_offset: a location list is named by data4.
        abbrev(&mut a, 6, DW_TAG_variable, false, &[(DW_AT_location, DW_FORM_data4)]);
        abbrev(&mut a, 7, DW_TAG_variable, false, &[(DW_AT_name, DW_FORM_block1)]);
        a.uleb(0);
        a.0
    }

    /// A DWARF 2-4 unit header (32-bit) at the end of `b`; returns its length field.
    fn unit_v4(b: &mut Bytes, version: u16, address_size: u8) -> u64 {
        let len = b.length();
        b.u16(version);
        b.u32(0);
        b.u8(address_size);
        len
    }

    fn walk(info: &[u8]) -> Result<(Vec<u8>, Vec<UnitInfo>, Refs)> {
        let abbrev = abbrevs();
        let secs = Sections::for_tests(&[(".debug_abbrev", &abbrev), (".debug_info", info)]);
        let (mut ed, mut refs) = (Edits::new(&secs), Refs::default());
        let units = repair(&secs.gimli(), &secs, &MAP, &mut ed, &mut refs)?;
        assert!(ed.moves_of(SecId(0)).is_empty());
        Ok((ed.applied(&secs, SecId(1), &MAP), units, refs))
    }

    #[test]
    fn address_forms_move_lengths_and_data_blocks_do_not() {
        let mut b = Bytes::new();
        let len = unit_v4(&mut b, 4, 8);
        b.uleb(1);
        b.str("cc");
        let cu_low = b.u64(0x1000);
        b.u64(0x100); // high_pc as data8 is a length
        b.u32(0x10); // ranges
        b.uleb(2);
        let sub_low = b.u64(0x2000);
        b.uleb(9);
        b.u8(DW_OP_addr.0);
        b.u64(0x9000); // just past the moved range
        b.uleb(3);
        b.uleb(9);
        b.u8(DW_OP_addr.0);
        let var = b.u64(0x8fff);
        // A constant's bytes that read like DW_OP_addr 0x2000 are data.
        b.u8(9);
        b.u8(DW_OP_addr.0);
        b.u64(0x2000);
        b.uleb(u64::from(DW_FORM_addr.0)); // the indirect form, then its value
        let indirect = b.u64(0x3000);
        b.uleb(4);
        b.u32(0x20);
        b.uleb(0);
        b.end_length(len);
        // A DWARF 3 unit of 4-byte addresses.
        let len = unit_v4(&mut b, 3, 4);
        b.uleb(5);
        let cu3_low = b.u32(0x4000);
        b.uleb(6);
        b.u32(0x30);
        b.uleb(0);
        b.end_length(len);
        let (out, units, refs) = walk(&b.0).unwrap();
        let want = [
            (cu_low, 0x1000 + DV, 8),
            (sub_low, 0x2000 + DV, 8),
            (var, 0x8fff + DV, 8),
            (indirect, 0x3000 + DV, 8),
            (cu3_low, 0x4000 + DV, 4),
        ];
        assert_eq!(out, patched(&b.0, &want));
        let facts: Vec<_> = units.iter().map(|u| (u.encoding.version, u.encoding.address_size, u.low_pc)).collect();
        assert_eq!(facts, [(4, 8, 0x1000), (3, 4, 0x4000)]);
        assert_eq!((refs.rnglists, refs.loclists), (vec![(0x10, 0)], vec![(0x20, 0), (0x30, 1)]));
    }

    #[test]
    fn unclassified_blocks_odd_sizes_and_unknown_versions_are_errors() {
        let unit = |version: u16, address_size: u8, body: &dyn Fn(&mut Bytes)| {
            framed(|b| unit_v4(b, version, address_size), body)
        };
        let name_block = unit(4, 8, &|b| {
            b.uleb(7);
            b.u8(1);
            b.u8(0);
        });
        let two_byte_addresses = unit(4, 2, &|b| {
            b.uleb(5);
            b.u16(0x1000);
        });
        let version_6 = unit(6, 8, &|_| {});
        let mut truncated = unit(4, 8, &|b| {
            b.uleb(5);
            b.u64(0x1000);
        });
        truncated.truncate(truncated.len() - 1);
        let cases = [
            (name_block, Reason::UnsupportedDwarf),
            (two_byte_addresses, Reason::BadDwarf),
            (version_6, Reason::UnsupportedDwarf),
            (truncated, Reason::BadDwarf),
        ];
        assert_refused(&cases, walk);
    }

    /// gimli reads a unit header from the unit's own bytes (it splits the unit off
    /// at its length first); this pins that a unit too short for its header is
    /// refused rather than completed from the next unit's bytes.
    #[test]
    fn a_unit_too_short_for_its_header_is_refused() {
        let next = framed(
            |b| unit_v4(b, 4, 8),
            |b| {
                b.uleb(5);
                b.u64(0x1000);
            },
        );
        walk(&next).unwrap();
        let short = |fields: &[u8]| [&(fields.len() as u32).to_le_bytes()[..], fields, &next].concat();
        // A version and no more, and a DWARF 5 header missing its abbreviation offset.
        let cases = [(short(&[4, 0]), Reason::BadDwarf), (short(&[5, 0, 1, 8]), Reason::BadDwarf)];
        assert_refused(&cases, walk);
    }
}
