//! `.debug_line`: the only address in a line program is the operand of
//! `DW_LNE_set_address`; every other opcode advances relative to it. Programs are
//! contiguous, so the section is walked program by program; gimli parses each
//! header (all versions, including DWARF 5 entry formats).

use super::{gimli_err, Edits, Sections, Slice};
use crate::addr_map::AddrMap;
use crate::error::{Error, Reason, Result};
use crate::leb::read_uleb;

const DW_LNS_FIXED_ADVANCE_PC: u8 = 9;
const DW_LNE_SET_ADDRESS: u8 = 2;

pub(crate) fn repair(
    dwarf: &gimli::Dwarf<Slice<'_>>,
    secs: &Sections,
    map: &AddrMap,
    asz: u8,
    ed: &mut Edits,
) -> Result<()> {
    let Some(sec) = secs.id(".debug_line") else { return Ok(()) };
    let data = secs.data(sec);
    let base = gimli::EndianSlice::new(data, gimli::LittleEndian);
    let mut off = 0usize;
    while off < data.len() {
        if data[off..].iter().all(|&b| b == 0) {
            break; // trailing padding
        }
        let program = dwarf
            .debug_line
            .program(gimli::DebugLineOffset(off), asz, None, None)
            .map_err(|e| gimli_err(".debug_line", off as u64, e))?;
        let header = program.header();
        let buf = header.raw_program_buf();
        let start = buf.offset_from(base);
        let end = start + buf.len();
        let lengths = header.standard_opcode_lengths().slice();
        walk(data, start, end, header.opcode_base(), lengths, map, sec, ed)?;
        off = end;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn walk(
    data: &[u8],
    start: usize,
    end: usize,
    opcode_base: u8,
    lengths: &[u8],
    map: &AddrMap,
    sec: super::SecId,
    ed: &mut Edits,
) -> Result<()> {
    let bad = |at: usize| Error::new(Reason::BadDwarf, format!(".debug_line at {at:#x}: truncated opcode"));
    let mut at = start;
    let uleb = |at: &mut usize| -> Result<u64> {
        let (v, n) = read_uleb(&data[..end], *at).ok_or_else(|| bad(*at))?;
        *at += n;
        Ok(v)
    };
    while at < end {
        let op = data[at];
        at += 1;
        if op >= opcode_base {
            continue;
        }
        match op {
            0 => {
                let len = uleb(&mut at)?;
                if len == 0 || len > (end - at) as u64 {
                    return Err(bad(at));
                }
                let len = len as usize;
                if data[at] == DW_LNE_SET_ADDRESS {
                    let size = len - 1;
                    if !matches!(size, 4 | 8) {
                        return Err(Error::new(
                            Reason::UnsupportedDwarf,
                            format!(".debug_line at {at:#x}: address of {size} bytes"),
                        ));
                    }
                    let mut v = [0u8; 8];
                    v[..size].copy_from_slice(&data[at + 1..at + 1 + size]);
                    ed.address(map, sec, at as u64 + 1, u64::from_le_bytes(v), size as u8)?;
                }
                at += len;
            }
            // A uhalf operand, not LEB128: cut off by the end, the program is broken.
            DW_LNS_FIXED_ADVANCE_PC if end - at < 2 => return Err(bad(at)),
            DW_LNS_FIXED_ADVANCE_PC => at += 2,
            _ => {
                let n = *lengths.get(usize::from(op) - 1).ok_or_else(|| bad(at))?;
                for _ in 0..n {
                    uleb(&mut at)?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dwarf::testbytes::{assert_refused, framed, patched, repaired, Bytes, DV, MAP};
    use gimli::constants::*;

    /// The standard opcodes' operand counts, DW_LNS_copy to DW_LNS_set_isa.
    const LENGTHS: [u8; 12] = [0, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1];

    /// The line program header fields from minimum_instruction_length on.
    fn fields(b: &mut Bytes, opcode_base: u8) {
        b.u8(1); // minimum_instruction_length
        b.u8(1); // maximum_operations_per_instruction
        b.u8(1); // default_is_stmt
        b.raw(&(-5i8).to_le_bytes()); // line_base
        b.u8(14); // line_range
        b.u8(opcode_base);
        b.raw(&LENGTHS[..usize::from(opcode_base) - 1]);
    }

    /// A DWARF 4 header; returns the unit length and header length fields.
    fn header_v4(b: &mut Bytes) -> (u64, u64) {
        let len = b.length();
        b.u16(4);
        let header_len = b.length();
        fields(b, 13);
        b.u8(0); // no include directories
        b.str("a.c");
        b.uleb(0);
        b.uleb(0);
        b.uleb(0);
        b.u8(0);
        b.end_length(header_len);
        (len, header_len)
    }

    /// A DWARF 5 header with a short standard opcode table (opcode_base 10).
    fn header_v5(b: &mut Bytes) -> u64 {
        let len = b.length();
        b.u16(5);
        b.u8(8);
        b.u8(0);
        let header_len = b.length();
        fields(b, 10);
        b.u8(1);
        b.uleb(u64::from(DW_LNCT_path.0));
        b.uleb(u64::from(DW_FORM_string.0));
        b.uleb(1);
        b.str("/src");
        b.u8(2);
        b.uleb(u64::from(DW_LNCT_path.0));
        b.uleb(u64::from(DW_FORM_string.0));
        b.uleb(u64::from(DW_LNCT_directory_index.0));
        b.uleb(u64::from(DW_FORM_udata.0));
        b.uleb(1);
        b.str("a.c");
        b.uleb(0);
        b.end_length(header_len);
        len
    }

    fn set_address(b: &mut Bytes, a: u64, size: u8) -> u64 {
        b.u8(0);
        b.uleb(1 + u64::from(size));
        b.u8(DW_LNE_set_address.0);
        b.word(a, size)
    }

    fn end_sequence(b: &mut Bytes) {
        b.u8(0);
        b.uleb(1);
        b.u8(DW_LNE_end_sequence.0);
    }

    fn walk(data: &[u8]) -> Result<Vec<u8>> {
        repaired(".debug_line", data, |secs, ed| repair(&secs.gimli(), secs, &MAP, 8, ed))
    }

    #[test]
    fn set_address_moves_and_the_opcodes_between_are_skipped_whole() {
        let mut b = Bytes::new();
        let (len, _) = header_v4(&mut b);
        let a1 = set_address(&mut b, 0x1000, 8);
        b.u8(DW_LNS_advance_pc.0);
        b.uleb(0x10);
        b.u8(DW_LNS_const_add_pc.0);
        b.u8(0x20); // a special opcode
        b.u8(DW_LNS_copy.0);
        b.u8(DW_LNS_advance_line.0);
        b.sleb(-1);
        set_address(&mut b, 0x9000, 8);
        b.u8(DW_LNS_set_file.0);
        b.uleb(1);
        end_sequence(&mut b);
        // A u16 operand whose bytes, misread as opcodes, would swallow the
        // DW_LNE_set_address after it.
        b.u8(DW_LNS_fixed_advance_pc.0);
        b.u16(u16::from(DW_LNS_fixed_advance_pc.0) << 8);
        let a2 = set_address(&mut b, 0x8fff, 8);
        end_sequence(&mut b);
        b.end_length(len);
        // A DWARF 5 program follows; opcodes 10-12 are special opcodes there.
        let len = header_v5(&mut b);
        let a3 = set_address(&mut b, 0x2000, 8);
        b.raw(&[10, 11, 12]);
        // A vendor's extended opcode is skipped by its length.
        b.u8(0);
        b.uleb(3);
        b.raw(&[DW_LNE_lo_user.0, 0, 0]);
        end_sequence(&mut b);
        b.end_length(len);
        b.u32(0); // padding
        let want = [(a1, 0x1000 + DV, 8), (a2, 0x8fff + DV, 8), (a3, 0x2000 + DV, 8)];
        assert_eq!(walk(&b.0).unwrap(), patched(&b.0, &want));
    }

    #[test]
    fn odd_address_sizes_and_truncated_opcodes_are_errors() {
        let program = |body: &dyn Fn(&mut Bytes)| framed(|b| header_v4(b).0, body);
        let two_bytes = program(&|b| {
            set_address(b, 0x1000, 2);
        });
        let past_end = program(&|b| {
            b.u8(0);
            b.uleb(9);
            b.u8(DW_LNE_set_address.0);
        });
        let bad_leb = program(&|b| {
            b.u8(DW_LNS_advance_pc.0);
            b.u8(0x80);
        });
        let cut_off = program(&|b| {
            b.u8(DW_LNS_fixed_advance_pc.0);
            b.u8(0x10);
        });
        let cases = [
            (two_bytes, Reason::UnsupportedDwarf),
            (past_end, Reason::BadDwarf),
            (bad_leb, Reason::BadDwarf),
            (cut_off, Reason::BadDwarf),
        ];
        assert_refused(&cases, walk);
    }

    /// gimli reads a line program header from the program's own bytes (it splits
    /// the unit off at its length, then the header at header_length); this pins
    /// that a program too short for its header is refused rather than completed
    /// from the next program's bytes.
    #[test]
    fn a_program_too_short_for_its_header_is_refused() {
        let mut next = Bytes::new();
        let (len, _) = header_v4(&mut next);
        set_address(&mut next, 0x1000, 8);
        end_sequence(&mut next);
        next.end_length(len);
        walk(&next.0).unwrap();
        // A unit of 2 bytes (a version only), and one of 6 whose header_length says
        // the header goes on past the unit's end.
        let short = |fields: &[u8]| [&(fields.len() as u32).to_le_bytes()[..], fields, &next.0].concat();
        let cases = [(short(&[4, 0]), Reason::BadDwarf), (short(&[4, 0, 30, 0, 0, 0]), Reason::BadDwarf)];
        assert_refused(&cases, walk);
    }
}
