//! `.debug_line`: the only address in a line program is the operand of
//! `DW_LNE_set_address`; every other opcode advances relative to it. Programs are
//! contiguous, so the section is walked program by program; gimli parses each
//! header (all versions, including DWARF 5 entry formats).

use super::{gimli_err, Edits, Sections, Slice};
use crate::error::{Error, Reason, Result};
use crate::leb::read_uleb;
use crate::plan::AddrMap;

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
