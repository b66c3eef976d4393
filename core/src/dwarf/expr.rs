//! DWARF expressions: `DW_OP_addr` operands move, unless the operand is a TLS offset
//! (the next operation is `DW_OP_form_tls_address` / `DW_OP_GNU_push_tls_address`).
//! `DW_OP_entry_value` nests a whole expression, walked recursively.
//! `DW_OP_constx` indices are recorded: those `.debug_addr` entries are constants.
//!
//! Operands are skipped by shape, from a table of every operation of DWARF 2-5 and
//! the GNU extensions (DWARF 5 section 7.7.1 and GCC's dwarf2.def). Large files hold
//! millions of expressions, and nothing but their shape is needed here. An opcode
//! outside the table is an error: it might carry an address.

use super::{Edits, SecId, Slice};
use crate::addr_map::AddrMap;
use crate::error::{Error, Reason, Result};
use crate::leb::{read_sleb, read_uleb};

/// Where an expression lives and how to read it.
pub(crate) struct Place<'a> {
    /// The section holding the expression.
    pub sec: SecId,
    /// Its name, for errors.
    pub name: &'static str,
    /// The whole section, to turn slices into offsets.
    pub base: Slice<'a>,
    /// Encoding of the unit (address size, offset size, version).
    pub encoding: gimli::Encoding,
    /// The unit's `.debug_addr` base, for DW_OP_constx.
    pub addr_base: u64,
}

const DW_OP_FORM_TLS_ADDRESS: u8 = 0x9b;
const DW_OP_GNU_PUSH_TLS_ADDRESS: u8 = 0xe0;

/// The operand shape of an operation.
#[derive(Clone, Copy)]
enum Shape {
    None,
    Fixed(u8),
    Uleb,
    Sleb,
    UlebUleb,
    UlebSleb,
    Address,
    Offset,
    /// DW_OP_implicit_pointer: a DIE reference then a SLEB.
    RefSleb,
    /// DW_OP_implicit_value: a ULEB length and that many bytes.
    Block,
    /// DW_OP_entry_value: a ULEB length and a nested expression.
    Nested,
    /// DW_OP_const_type: a ULEB type, a 1-byte size, that many bytes.
    ConstType,
    /// DW_OP_deref_type: a 1-byte size then a ULEB.
    ByteUleb,
    /// DW_OP_constx / DW_OP_GNU_const_index.
    ConstIndex,
    Unknown,
}

/// Gives the opcodes `first..=last` one shape.
const fn set_range(t: &mut [Shape; 256], first: usize, last: usize, shape: Shape) {
    let mut op = first;
    while op <= last {
        t[op] = shape;
        op += 1;
    }
}

const fn shapes() -> [Shape; 256] {
    use Shape::*;
    let mut t = [Unknown; 256];
    t[0x03] = Address;
    t[0x06] = None;
    t[0x08] = Fixed(1);
    t[0x09] = Fixed(1);
    t[0x0a] = Fixed(2);
    t[0x0b] = Fixed(2);
    t[0x0c] = Fixed(4);
    t[0x0d] = Fixed(4);
    t[0x0e] = Fixed(8);
    t[0x0f] = Fixed(8);
    t[0x10] = Uleb;
    t[0x11] = Sleb;
    set_range(&mut t, 0x12, 0x14, None); // dup, drop, over
    t[0x15] = Fixed(1); // pick
    set_range(&mut t, 0x16, 0x22, None); // swap .. plus
    t[0x23] = Uleb; // plus_uconst
    set_range(&mut t, 0x24, 0x27, None); // shl shr shra xor
    t[0x28] = Fixed(2); // bra
    set_range(&mut t, 0x29, 0x2e, None); // eq .. ne
    t[0x2f] = Fixed(2); // skip
    set_range(&mut t, 0x30, 0x6f, None); // lit0-31, reg0-31
    set_range(&mut t, 0x70, 0x8f, Sleb); // breg0-31
    t[0x90] = Uleb; // regx
    t[0x91] = Sleb; // fbreg
    t[0x92] = UlebSleb; // bregx
    t[0x93] = Uleb; // piece
    t[0x94] = Fixed(1); // deref_size
    t[0x95] = Fixed(1); // xderef_size
    t[0x96] = None; // nop
    t[0x97] = None; // push_object_address
    t[0x98] = Fixed(2); // call2
    t[0x99] = Fixed(4); // call4
    t[0x9a] = Offset; // call_ref
    t[0x9b] = None; // form_tls_address
    t[0x9c] = None; // call_frame_cfa
    t[0x9d] = UlebUleb; // bit_piece
    t[0x9e] = Block; // implicit_value
    t[0x9f] = None; // stack_value
    t[0xa0] = RefSleb; // implicit_pointer
    t[0xa1] = Uleb; // addrx: the address lives in .debug_addr
    t[0xa2] = ConstIndex; // constx
    t[0xa3] = Nested; // entry_value
    t[0xa4] = ConstType; // const_type
    t[0xa5] = UlebUleb; // regval_type
    t[0xa6] = ByteUleb; // deref_type
    t[0xa7] = ByteUleb; // xderef_type
    t[0xa8] = Uleb; // convert
    t[0xa9] = Uleb; // reinterpret
    t[0xe0] = None; // GNU_push_tls_address
    t[0xf0] = None; // GNU_uninit
    t[0xf2] = RefSleb; // GNU_implicit_pointer
    t[0xf3] = Nested; // GNU_entry_value
    t[0xf4] = ConstType; // GNU_const_type
    t[0xf5] = UlebUleb; // GNU_regval_type
    t[0xf6] = ByteUleb; // GNU_deref_type
    t[0xf7] = Uleb; // GNU_convert
    t[0xf9] = Uleb; // GNU_reinterpret
    t[0xfa] = Fixed(4); // GNU_parameter_ref
    t[0xfb] = Uleb; // GNU_addr_index
    t[0xfc] = ConstIndex; // GNU_const_index
    t[0xfd] = Offset; // GNU_variable_value
    t
}

static SHAPES: [Shape; 256] = shapes();

/// Walks `expr`, moving every DW_OP_addr operand that holds a moved address.
pub(crate) fn walk(
    expr: Slice<'_>,
    at: &Place<'_>,
    map: &AddrMap,
    ed: &mut Edits,
    constants: &mut Vec<u64>,
) -> Result<()> {
    let data = at.base.slice();
    let start = expr.offset_from(at.base);
    walk_range(data, start, start + expr.len(), at, map, ed, constants)
}

fn walk_range(
    data: &[u8],
    start: usize,
    end: usize,
    at: &Place<'_>,
    map: &AddrMap,
    ed: &mut Edits,
    constants: &mut Vec<u64>,
) -> Result<()> {
    let enc = at.encoding;
    let asz = usize::from(enc.address_size);
    let offset_size = usize::from(enc.format.word_size());
    let bad = |pos: usize, what: &str| Error::new(Reason::BadDwarf, format!("{} at {pos:#x}: {what}", at.name));
    let uleb = |pos: &mut usize| -> Result<u64> {
        let (v, n) = read_uleb(&data[..end], *pos).ok_or_else(|| bad(*pos, "truncated expression"))?;
        *pos += n;
        Ok(v)
    };
    let sleb = |pos: &mut usize| -> Result<()> {
        let (_, n) = read_sleb(&data[..end], *pos).ok_or_else(|| bad(*pos, "truncated expression"))?;
        *pos += n;
        Ok(())
    };
    let mut pos = start;
    while pos < end {
        let op_at = pos;
        let op = data[pos];
        pos += 1;
        match SHAPES[usize::from(op)] {
            Shape::None => {}
            Shape::Fixed(n) => pos += usize::from(n),
            Shape::Uleb => {
                uleb(&mut pos)?;
            }
            Shape::Sleb => sleb(&mut pos)?,
            Shape::UlebUleb => {
                uleb(&mut pos)?;
                uleb(&mut pos)?;
            }
            Shape::UlebSleb => {
                uleb(&mut pos)?;
                sleb(&mut pos)?;
            }
            Shape::Address => {
                if pos + asz > end {
                    return Err(bad(op_at, "truncated DW_OP_addr"));
                }
                let mut v = [0u8; 8];
                v[..asz].copy_from_slice(&data[pos..pos + asz]);
                // An address operand followed by a TLS operation is a TLS offset.
                let tls = matches!(data.get(pos + asz), Some(&DW_OP_FORM_TLS_ADDRESS | &DW_OP_GNU_PUSH_TLS_ADDRESS))
                    && pos + asz < end;
                if !tls {
                    ed.address(map, at.sec, pos as u64, u64::from_le_bytes(v), asz as u8)?;
                }
                pos += asz;
            }
            Shape::Offset => pos += offset_size,
            Shape::RefSleb => {
                pos += if enc.version <= 2 { asz } else { offset_size };
                sleb(&mut pos)?;
            }
            Shape::Block => {
                let n = uleb(&mut pos)? as usize;
                pos = pos.checked_add(n).ok_or_else(|| bad(op_at, "bad length"))?;
            }
            Shape::Nested => {
                let n = uleb(&mut pos)? as usize;
                let inner_end = pos.checked_add(n).filter(|&e| e <= end).ok_or_else(|| bad(op_at, "bad length"))?;
                walk_range(data, pos, inner_end, at, map, ed, constants)?;
                pos = inner_end;
            }
            Shape::ConstType => {
                uleb(&mut pos)?;
                let n = *data.get(pos).ok_or_else(|| bad(op_at, "truncated DW_OP_const_type"))?;
                pos += 1 + usize::from(n);
            }
            Shape::ByteUleb => {
                pos += 1;
                uleb(&mut pos)?;
            }
            Shape::ConstIndex => {
                let index = uleb(&mut pos)?;
                let entry = index.checked_mul(asz as u64).and_then(|o| o.checked_add(at.addr_base));
                constants.push(entry.ok_or_else(|| bad(op_at, "DW_OP_constx index beyond any .debug_addr"))?);
            }
            Shape::Unknown => {
                return Err(Error::new(
                    Reason::UnsupportedDwarf,
                    format!("{} at {op_at:#x}: DWARF expression opcode {op:#04x} is not known", at.name),
                ))
            }
        }
        if pos > end {
            return Err(bad(op_at, "an operand runs past the end of the expression"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dwarf::sections::SecId;

    /// The (offset, size) of every address move, and the constant indices seen.
    type Walked = (Vec<(u64, usize)>, Vec<u64>);

    fn run(bytes: &[u8], map: &AddrMap) -> Result<Walked> {
        let base = gimli::EndianSlice::new(bytes, gimli::LittleEndian);
        let encoding = gimli::Encoding { format: gimli::Format::Dwarf32, version: 5, address_size: 8 };
        let place = Place { sec: SecId(0), name: "test", base, encoding, addr_base: 16 };
        let mut ed = Edits::for_tests(bytes.len() as u64);
        let mut constants = Vec::new();
        walk(base, &place, map, &mut ed, &mut constants)?;
        Ok((ed.moves_of(SecId(0)).iter().map(|m| (m.off(), m.size())).collect(), constants))
    }

    const MAP: AddrMap = AddrMap::shift(0x1000, 0x9000, 0x200000);

    #[rustfmt::skip]
    #[test]
    fn moves_addresses_keeps_tls_offsets_and_recurses() {
        let expr = [
            0x03, 0x00, 0x20, 0, 0, 0, 0, 0, 0,    // DW_OP_addr 0x2000        -> moves
            0x9f,                                  // DW_OP_stack_value
            0x03, 0x10, 0x20, 0, 0, 0, 0, 0, 0,    // DW_OP_addr 0x2010 …
            0xe0,                                  // … GNU_push_tls_address: a TLS offset, stays
            0xa3, 0x0a,                            // DW_OP_entry_value, 10 bytes:
                0x03, 0x00, 0x30, 0, 0, 0, 0, 0, 0,//   DW_OP_addr 0x3000      -> moves
                0x9f,                              //   DW_OP_stack_value
            0x03, 0x00, 0x00, 0, 0, 0, 0, 0, 0,    // DW_OP_addr 0 (tombstone) stays
            0xa2, 0x03,                            // DW_OP_constx 3 -> .debug_addr offset 16 + 3*8
            0x91, 0x7f,                            // DW_OP_fbreg -1
        ];
        let (edits, constants) = run(&expr, &MAP).unwrap();
        assert_eq!(edits, vec![(1, 8), (23, 8)]);
        assert_eq!(constants, vec![40]);
    }

    #[test]
    fn unknown_opcodes_and_truncation_are_errors() {
        assert_eq!(run(&[0xf1, 0x1b, 0, 0, 0, 0], &MAP).unwrap_err().reason, Reason::UnsupportedDwarf);
        assert_eq!(run(&[0x03, 0x00, 0x20], &MAP).unwrap_err().reason, Reason::BadDwarf);
        assert_eq!(run(&[0xa3, 0x09, 0x03], &MAP).unwrap_err().reason, Reason::BadDwarf);
    }
}
