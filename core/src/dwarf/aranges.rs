//! `.debug_aranges`: sets of (address, length) tuples after a header; the tuples
//! start at a multiple of their own size from the set's start.

use super::{Edits, Sections};
use crate::elf::{align_up, read_u16, read_u32, read_u64};
use crate::error::{Error, Reason, Result};
use crate::plan::AddrMap;

pub(crate) fn repair(secs: &Sections, map: &AddrMap, ed: &mut Edits) -> Result<()> {
    let Some(sec) = secs.id(".debug_aranges") else { return Ok(()) };
    let data = secs.data(sec);
    let bad = |at: u64, what: &str| Error::new(Reason::BadDwarf, format!(".debug_aranges at {at:#x}: {what}"));
    let len = data.len() as u64;
    let mut set = 0u64;
    while set < len {
        let mut length = u64::from(read_u32(data, set).map_err(|_| bad(set, "truncated header"))?);
        let (mut pos, offset_size) = (set + 4, 4);
        let offset_size = if length == 0xffff_ffff {
            length = read_u64(data, pos).map_err(|_| bad(set, "truncated header"))?;
            pos += 8;
            8
        } else {
            offset_size
        };
        let end =
            pos.checked_add(length).filter(|&e| e <= len).ok_or_else(|| bad(set, "set runs past the section end"))?;
        let version = read_u16(data, pos).map_err(|_| bad(set, "truncated header"))?;
        if version != 2 {
            return Err(Error::new(Reason::UnsupportedDwarf, format!(".debug_aranges at {set:#x}: version {version}")));
        }
        pos += 2 + offset_size;
        let (asz, seg) =
            (*data.get(pos as usize).ok_or_else(|| bad(set, "truncated header"))?, data.get(pos as usize + 1));
        if seg != Some(&0) || !matches!(asz, 4 | 8) {
            return Err(Error::new(
                Reason::UnsupportedDwarf,
                format!(".debug_aranges at {set:#x}: address size {asz}"),
            ));
        }
        let tuple = 2 * u64::from(asz);
        let mut at = set + align_up(pos + 2 - set, tuple);
        while at + tuple <= end {
            let addr = if asz == 8 { read_u64(data, at)? } else { u64::from(read_u32(data, at)?) };
            let size = if asz == 8 { read_u64(data, at + 8)? } else { u64::from(read_u32(data, at + 4)?) };
            if addr == 0 && size == 0 {
                break;
            }
            ed.address(map, sec, at, addr, asz)?;
            at += tuple;
        }
        set = end;
    }
    Ok(())
}
