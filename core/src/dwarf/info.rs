//! `.debug_info` and `.debug_types`: attributes with DW_FORM_addr move; expressions
//! (exprloc, and blocks of attributes whose value is an expression) are walked;
//! references to location and range lists are collected for `lists`.

use super::expr::{self, Place};
use super::{gimli_err, Edits, Refs, Sections, Slice};
use crate::error::{Error, Reason, Result};
use crate::leb::read_uleb;
use crate::plan::AddrMap;
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
    /// Whether the unit named an addr_base at all.
    pub has_addr_base: bool,
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

/// Walks every unit; returns per-unit facts in iteration order.
pub(crate) fn repair(
    dwarf: &gimli::Dwarf<Slice<'_>>,
    secs: &Sections,
    map: &AddrMap,
    ed: &mut Edits,
    refs: &mut Refs,
) -> Result<Vec<UnitInfo>> {
    let mut units = Vec::new();
    if let Some(sec) = secs.id(".debug_info") {
        let base = gimli::EndianSlice::new(secs.data(sec), gimli::LittleEndian);
        let mut iter = dwarf.units();
        loop {
            let header = iter.next().map_err(|e| gimli_err(".debug_info", 0, e))?;
            let Some(header) = header else { break };
            walk_unit(dwarf, header, sec, base, map, ed, refs, &mut units)?;
        }
    }
    if let Some(sec) = secs.id(".debug_types") {
        let base = gimli::EndianSlice::new(secs.data(sec), gimli::LittleEndian);
        let mut iter = dwarf.type_units();
        loop {
            let header = iter.next().map_err(|e| gimli_err(".debug_types", 0, e))?;
            let Some(header) = header else { break };
            walk_unit(dwarf, header, sec, base, map, ed, refs, &mut units)?;
        }
    }
    Ok(units)
}

#[allow(clippy::too_many_arguments)]
fn walk_unit<'a>(
    dwarf: &gimli::Dwarf<Slice<'a>>,
    header: gimli::UnitHeader<Slice<'a>>,
    sec: super::SecId,
    base: Slice<'a>,
    map: &AddrMap,
    ed: &mut Edits,
    refs: &mut Refs,
    units: &mut Vec<UnitInfo>,
) -> Result<()> {
    let name = if ed.secs.name(sec) == ".debug_types" { ".debug_types" } else { ".debug_info" };
    let start = header.offset().0 as u64;
    let err = |at: u64| move |e| gimli_err(name, at, e);
    let unit = gimli::Unit::new(dwarf, header).map_err(err(start))?;
    let encoding = unit.encoding();
    let index = units.len();
    units.push(UnitInfo {
        encoding,
        low_pc: unit.low_pc,
        addr_base: unit.addr_base.0 as u64,
        has_addr_base: unit.addr_base.0 != 0 || has_addr_base_attr(&unit),
    });
    refs.split_units |= unit.dwo_id.is_some();
    let place = Place { sec, base, encoding, addr_base: unit.addr_base.0 as u64 };
    let mut raw = unit.entries_raw(None).map_err(err(start))?;
    while !raw.is_empty() {
        let at = start + raw.next_offset().0 as u64;
        let Some(abbrev) = raw.read_abbreviation().map_err(err(at))? else { continue };
        for spec in abbrev.attributes() {
            let at = start + raw.next_offset().0 as u64;
            let attr = raw.read_attribute(*spec).map_err(err(at))?;
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
                        format!("{} at {at:#x}: block value of {} cannot be classified", ed.secs.name(sec), attr.name()),
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

fn has_addr_base_attr(unit: &gimli::Unit<Slice<'_>>) -> bool {
    let mut cursor = unit.entries();
    match cursor.next_dfs() {
        Ok(Some(root)) => {
            root.attr(dw::DW_AT_addr_base).is_some() || root.attr(dw::DW_AT_GNU_addr_base).is_some()
        }
        _ => false,
    }
}

fn uleb_len(base: Slice<'_>, at: u64) -> Result<u64> {
    read_uleb(base.slice(), at as usize)
        .map(|(_, n)| n as u64)
        .ok_or_else(|| Error::new(Reason::BadDwarf, format!("bad DW_FORM_indirect at {at:#x}")))
}
