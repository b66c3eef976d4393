//! DWARF expressions: `DW_OP_addr` operands move, unless the operand is a TLS offset
//! (the next operation is `DW_OP_form_tls_address` / `DW_OP_GNU_push_tls_address`).
//! `DW_OP_entry_value` nests a whole expression, walked recursively.
//! `DW_OP_constx` indices are recorded: those `.debug_addr` entries are constants.

use super::{gimli_err, Edits, SecId, Slice};
use crate::error::Result;
use crate::plan::AddrMap;
use gimli::Operation;

/// Where an expression lives and how to read it.
pub(crate) struct Place<'a> {
    /// The section holding the expression.
    pub sec: SecId,
    /// The whole section, to turn slices into offsets.
    pub base: Slice<'a>,
    /// Encoding of the unit (address size, offset size, version).
    pub encoding: gimli::Encoding,
    /// The unit's `.debug_addr` base, for DW_OP_constx.
    pub addr_base: u64,
}

/// Walks `expr`, moving every DW_OP_addr operand that holds a moved address.
pub(crate) fn walk(
    expr: Slice<'_>,
    at: &Place<'_>,
    map: &AddrMap,
    ed: &mut Edits,
    constants: &mut Vec<u64>,
) -> Result<()> {
    let mut r = expr;
    let mut pending: Option<(u64, u64)> = None;
    let asz = at.encoding.address_size;
    while !r.is_empty() {
        let pos = r.offset_from(at.base) as u64;
        let op = Operation::parse(&mut r, at.encoding).map_err(|e| gimli_err(ed.secs.name(at.sec), pos, e))?;
        if let Some((off, value)) = pending.take() {
            if !matches!(op, Operation::TLS) {
                ed.address(map, at.sec, off, value, asz)?;
            }
        }
        match op {
            Operation::Address { address } => pending = Some((pos + 1, address)),
            Operation::EntryValue { expression } => walk(expression, at, map, ed, constants)?,
            Operation::ConstantIndex { index } => constants.push(at.addr_base + index.0 as u64 * u64::from(asz)),
            _ => {}
        }
    }
    if let Some((off, value)) = pending {
        ed.address(map, at.sec, off, value, asz)?;
    }
    Ok(())
}
