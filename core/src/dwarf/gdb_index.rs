//! `.gdb_index` (versions 7 and 8): its address area holds (low, high, CU index)
//! triples after a header of six 32-bit offsets.

use super::{Edits, Sections};
use crate::elf::{read_u32, read_u64};
use crate::error::{Error, Reason, Result};
use crate::plan::AddrMap;

pub(crate) fn repair(secs: &Sections, map: &AddrMap, ed: &mut Edits) -> Result<()> {
    let Some(sec) = secs.id(".gdb_index") else { return Ok(()) };
    let data = secs.data(sec);
    let bad = |what: &str| Error::new(Reason::BadDwarf, format!(".gdb_index: {what}"));
    let version = read_u32(data, 0).map_err(|_| bad("truncated header"))?;
    if !(7..=9).contains(&version) {
        return Err(Error::new(Reason::UnsupportedDwarf, format!(".gdb_index version {version}")));
    }
    let area = u64::from(read_u32(data, 12).map_err(|_| bad("truncated header"))?);
    let symbols = u64::from(read_u32(data, 16).map_err(|_| bad("truncated header"))?);
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
