//! `.debug_frame`: FDE initial locations and `DW_CFA_set_loc` operands are absolute
//! addresses; CFA rules may hold expressions with `DW_OP_addr`.

use super::expr::{self, Place};
use super::{Edits, Sections};
use crate::addr_map::AddrMap;
use crate::cfi::{self, Field, Flavour};
use crate::error::Result;

pub(crate) fn repair(secs: &Sections, map: &AddrMap, asz: u8, ed: &mut Edits) -> Result<()> {
    let Some(sec) = secs.id(".debug_frame") else { return Ok(()) };
    let data = secs.data(sec);
    let base = gimli::EndianSlice::new(data, gimli::LittleEndian);
    let encoding = gimli::Encoding { format: gimli::Format::Dwarf32, version: 4, address_size: asz };
    let place = Place { sec, name: ".debug_frame", base, encoding, addr_base: 0 };
    let mut constants = Vec::new();
    cfi::walk(data, Flavour::DebugFrame, asz, |f| match f {
        Field::Pointer { off, size, value, .. } => ed.address(map, sec, off, value, size),
        Field::Expression { off, len } => {
            expr::walk(base.range(off as usize..(off + len) as usize), &place, map, ed, &mut constants)
        }
        Field::Fde { .. } => Ok(()),
    })
}
