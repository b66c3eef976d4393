//! A walker over call-frame information (`.eh_frame` and `.debug_frame`) that reports
//! the position and encoding of every field holding an address: FDE initial
//! locations, LSDA and personality pointers, `DW_CFA_set_loc` operands, and the
//! DWARF expressions inside CFA rules. It never decodes more than it must, and an
//! unknown augmentation or instruction is an error, never a guess.

use crate::error::{Error, Reason, Result};
use crate::leb::{read_sleb, read_uleb};
use std::collections::HashMap;

/// DW_EH_PE_omit.
pub const PE_OMIT: u8 = 0xff;
/// DW_EH_PE_absptr.
pub const PE_ABSPTR: u8 = 0x00;
/// DW_EH_PE_pcrel.
pub const PE_PCREL: u8 = 0x10;
/// DW_EH_PE_datarel.
pub const PE_DATAREL: u8 = 0x30;

/// Which flavour of call-frame section is walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    /// `.eh_frame`: relative CIE pointers, pointer encodings from augmentations.
    EhFrame,
    /// `.debug_frame`: CIE pointers are section offsets, addresses are absolute.
    DebugFrame,
}

/// A field the walker found.
#[derive(Clone, Copy, Debug)]
pub enum Field {
    /// An encoded pointer at `off` (section offset) with encoding `enc` (a
    /// DW_EH_PE_* value; `.debug_frame` addresses are reported as absptr).
    Pointer {
        /// Section offset of the field.
        off: u64,
        /// Encoding.
        enc: u8,
        /// Size of the field in bytes (0 for LEB128 encodings).
        size: u8,
        /// Raw value as stored (sign-extended for signed encodings).
        value: u64,
    },
    /// The code an FDE describes: its initial location (as in the `Pointer` reported
    /// just before) and the length of the range, in bytes.
    Fde {
        /// Section offset of the initial location.
        off: u64,
        /// Its encoding.
        enc: u8,
        /// Its raw value.
        value: u64,
        /// The pc_range.
        len: u64,
    },
    /// A DWARF expression block at `off` of `len` bytes (CFA rules).
    Expression {
        /// Section offset.
        off: u64,
        /// Length.
        len: u64,
    },
}

struct Cie {
    fde_enc: u8,
    lsda_enc: u8,
    has_z: bool,
    addr_size: u8,
}

struct Cursor<'a> {
    data: &'a [u8],
    pos: u64,
    end: u64,
}

fn bad(what: impl Into<String>) -> Error {
    Error::new(Reason::BadEhFrame, what)
}

impl<'a> Cursor<'a> {
    fn need(&self, n: u64) -> Result<usize> {
        if self.pos.checked_add(n).is_none_or(|e| e > self.end) {
            return Err(bad(format!("record at {:#x} is truncated", self.pos)));
        }
        Ok(self.pos as usize)
    }
    fn u8(&mut self) -> Result<u8> {
        let p = self.need(1)?;
        self.pos += 1;
        Ok(self.data[p])
    }
    fn fixed(&mut self, n: u64) -> Result<u64> {
        let p = self.need(n)?;
        let mut v = [0u8; 8];
        v[..n as usize].copy_from_slice(&self.data[p..p + n as usize]);
        self.pos += n;
        Ok(u64::from_le_bytes(v))
    }
    fn uleb(&mut self) -> Result<u64> {
        let (v, n) = read_uleb(&self.data[..self.end as usize], self.pos as usize)
            .ok_or_else(|| bad(format!("bad LEB128 at {:#x}", self.pos)))?;
        self.pos += n as u64;
        Ok(v)
    }
    fn sleb(&mut self) -> Result<i64> {
        let (v, n) = read_sleb(&self.data[..self.end as usize], self.pos as usize)
            .ok_or_else(|| bad(format!("bad LEB128 at {:#x}", self.pos)))?;
        self.pos += n as u64;
        Ok(v)
    }
    fn skip(&mut self, n: u64) -> Result<()> {
        self.need(n)?;
        self.pos += n;
        Ok(())
    }
    fn cstr(&mut self) -> Result<&'a [u8]> {
        let start = self.pos as usize;
        let rest = &self.data[start..self.end as usize];
        let n = rest.iter().position(|&b| b == 0).ok_or_else(|| bad("unterminated augmentation string"))?;
        self.pos += n as u64 + 1;
        Ok(&rest[..n])
    }

    /// Reads an encoded pointer and reports it.
    fn pointer(&mut self, enc: u8, addr_size: u8, visit: &mut impl FnMut(Field) -> Result<()>) -> Result<()> {
        if enc == PE_OMIT {
            return Ok(());
        }
        let off = self.pos;
        let (value, size) = match enc & 0x0f {
            0x00 => (self.fixed(u64::from(addr_size))?, addr_size),
            0x01 => (self.uleb()?, 0),
            0x02 => (self.fixed(2)?, 2),
            0x03 => (self.fixed(4)?, 4),
            0x04 => (self.fixed(8)?, 8),
            0x08 => (sign_extend(self.fixed(u64::from(addr_size))?, addr_size), addr_size),
            0x09 => (self.sleb()? as u64, 0),
            0x0a => (sign_extend(self.fixed(2)?, 2), 2),
            0x0b => (sign_extend(self.fixed(4)?, 4), 4),
            0x0c => (self.fixed(8)?, 8),
            f => return Err(bad(format!("unknown pointer encoding {enc:#x} (format {f:#x}) at {off:#x}"))),
        };
        visit(Field::Pointer { off, enc, size, value })
    }

    /// Like `pointer`, for a length (pc_range): read, returned, never reported.
    fn length(&mut self, enc: u8, addr_size: u8) -> Result<u64> {
        let mut len = 0;
        self.pointer(enc & 0x0f, addr_size, &mut |f| {
            if let Field::Pointer { value, .. } = f {
                len = value;
            }
            Ok(())
        })?;
        Ok(len)
    }

    /// Reads the augmentation data of a record whose augmentation string starts with
    /// 'z' (a ULEB128 length, then the fields `read` takes) and moves to its end. A
    /// length past the record would skip its instructions unread; fields that run past
    /// the length make a short augmentation. Errors name the record (`what` at `at`).
    fn augmentation(&mut self, what: &str, at: u64, read: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        let len = self.uleb()?;
        let end = self
            .pos
            .checked_add(len)
            .filter(|&e| e <= self.end)
            .ok_or_else(|| bad(format!("{what} at {at:#x} has an impossible augmentation length")))?;
        read(self)?;
        if self.pos > end {
            return Err(bad(format!("{what} at {at:#x} has a short augmentation")));
        }
        self.pos = end;
        Ok(())
    }
}

fn sign_extend(v: u64, size: u8) -> u64 {
    let shift = 64 - 8 * u32::from(size);
    (((v << shift) as i64) >> shift) as u64
}

/// Walks a call-frame section, calling `visit` for every address-bearing field.
pub fn walk(data: &[u8], flavour: Flavour, addr_size: u8, mut visit: impl FnMut(Field) -> Result<()>) -> Result<()> {
    let mut cies: HashMap<u64, Cie> = HashMap::new();
    let mut pos = 0u64;
    let len = data.len() as u64;
    while pos < len {
        let mut c = Cursor { data, pos, end: len };
        let mut length = c.fixed(4)?;
        if length == 0 {
            if flavour == Flavour::EhFrame {
                // The zero terminator; anything after it is padding.
                return Ok(());
            }
            pos = c.pos;
            continue;
        }
        let wide = length == 0xffff_ffff;
        if wide {
            length = c.fixed(8)?;
        }
        let id_off = c.pos;
        let end = id_off
            .checked_add(length)
            .filter(|&e| e <= len)
            .ok_or_else(|| bad(format!("record at {pos:#x} runs past the section end")))?;
        c.end = end;
        let id = c.fixed(if wide { 8 } else { 4 })?;
        let is_cie = match flavour {
            Flavour::EhFrame => id == 0,
            Flavour::DebugFrame => id == if wide { u64::MAX } else { 0xffff_ffff },
        };
        if is_cie {
            let cie = parse_cie(&mut c, addr_size, &mut visit)?;
            cies.insert(pos, cie);
        } else {
            let cie_pos = match flavour {
                Flavour::EhFrame => {
                    id_off.checked_sub(id).ok_or_else(|| bad(format!("FDE at {pos:#x} has a bad CIE pointer")))?
                }
                Flavour::DebugFrame => id,
            };
            let cie =
                cies.get(&cie_pos).ok_or_else(|| bad(format!("FDE at {pos:#x} refers to no CIE at {cie_pos:#x}")))?;
            let mut start = None;
            c.pointer(cie.fde_enc, cie.addr_size, &mut |f| {
                if let Field::Pointer { off, enc, value, .. } = f {
                    start = Some((off, enc, value));
                }
                visit(f)
            })?;
            let len = c.length(cie.fde_enc, cie.addr_size)?;
            if let Some((off, enc, value)) = start {
                visit(Field::Fde { off, enc, value, len })?;
            }
            if cie.has_z {
                c.augmentation("FDE", pos, |c| c.pointer(cie.lsda_enc, cie.addr_size, &mut visit))?;
            }
            instructions(&mut c, cie.fde_enc, cie.addr_size, &mut visit)?;
        }
        pos = end;
    }
    Ok(())
}

fn parse_cie(c: &mut Cursor, addr_size: u8, visit: &mut impl FnMut(Field) -> Result<()>) -> Result<Cie> {
    let at = c.pos;
    let version = c.u8()?;
    if !matches!(version, 1 | 3 | 4) {
        return Err(bad(format!("CIE at {at:#x} has unknown version {version}")));
    }
    let aug = c.cstr()?;
    if aug.windows(2).any(|w| w == b"eh") {
        c.skip(u64::from(addr_size))?;
    }
    let mut cie = Cie { fde_enc: PE_ABSPTR, lsda_enc: PE_OMIT, has_z: aug.first() == Some(&b'z'), addr_size };
    if version == 4 {
        cie.addr_size = c.u8()?;
        if !matches!(cie.addr_size, 4 | 8) {
            return Err(bad(format!("CIE at {at:#x} has address size {}", cie.addr_size)));
        }
        let segment_size = c.u8()?;
        if segment_size != 0 {
            return Err(Error::new(Reason::UnsupportedDwarf, format!("CIE at {at:#x} uses segmented addresses")));
        }
    }
    c.uleb()?; // code alignment
    c.sleb()?; // data alignment
    if version == 1 {
        c.u8()?;
    } else {
        c.uleb()?;
    }
    if cie.has_z {
        c.augmentation("CIE", at, |c| {
            for &ch in &aug[1..] {
                match ch {
                    b'L' => cie.lsda_enc = c.u8()?,
                    b'R' => cie.fde_enc = c.u8()?,
                    b'P' => {
                        let enc = c.u8()?;
                        c.pointer(enc, cie.addr_size, visit)?;
                    }
                    b'S' | b'B' | b'G' => {}
                    other => {
                        return Err(Error::new(
                            Reason::UnsupportedSection,
                            format!("CIE at {at:#x} has unknown augmentation '{}'", char::from(other)),
                        ))
                    }
                }
            }
            Ok(())
        })?;
    } else if !aug.is_empty() && aug != b"eh" {
        return Err(bad(format!("CIE at {at:#x} has augmentation {:?} without 'z'", String::from_utf8_lossy(aug))));
    }
    instructions(c, cie.fde_enc, cie.addr_size, visit)?;
    Ok(cie)
}

/// Walks call-frame instructions to the end of the record.
fn instructions(c: &mut Cursor, enc: u8, addr_size: u8, visit: &mut impl FnMut(Field) -> Result<()>) -> Result<()> {
    while c.pos < c.end {
        let at = c.pos;
        let op = c.u8()?;
        match op >> 6 {
            1 => continue, // advance_loc
            2 => {
                c.uleb()?; // offset
                continue;
            }
            3 => continue, // restore
            _ => {}
        }
        match op {
            0x00 | 0x0a | 0x0b | 0x2d => {} // nop, remember/restore_state, GNU_window_save / negate_ra_state
            0x01 => c.pointer(enc, addr_size, visit)?, // set_loc
            0x02 => c.skip(1)?,
            0x03 => c.skip(2)?,
            0x04 => c.skip(4)?,
            0x1d => c.skip(8)?, // MIPS_advance_loc8
            0x06 | 0x07 | 0x08 | 0x0d | 0x0e | 0x2e => {
                c.uleb()?;
            }
            0x05 | 0x09 | 0x0c | 0x14 | 0x2f => {
                c.uleb()?;
                c.uleb()?;
            }
            0x11 | 0x12 | 0x15 => {
                c.uleb()?;
                c.sleb()?;
            }
            0x13 => {
                c.sleb()?;
            }
            0x0f => expression(c, visit)?, // def_cfa_expression
            0x10 | 0x16 => {
                c.uleb()?;
                expression(c, visit)?; // expression, val_expression
            }
            _ => return Err(bad(format!("unknown call frame instruction {op:#x} at {at:#x}"))),
        }
    }
    Ok(())
}

fn expression(c: &mut Cursor, visit: &mut impl FnMut(Field) -> Result<()>) -> Result<()> {
    let len = c.uleb()?;
    let off = c.pos;
    c.skip(len)?;
    visit(Field::Expression { off, len })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dwarf::testbytes::{assert_refused, Bytes};
    use gimli::constants::*;

    /// A field as (kind, offset, encoding, size, value), comparable; an FDE's value
    /// folds in its length.
    type Flat = (char, u64, u8, u8, u64);

    fn flat(f: Field) -> Flat {
        match f {
            Field::Pointer { off, enc, size, value } => ('p', off, enc, size, value),
            Field::Fde { off, enc, value, len } => ('f', off, enc, 0, value ^ len.rotate_left(32)),
            Field::Expression { off, len } => ('e', off, 0, 0, len),
        }
    }

    fn walked(data: &[u8], flavour: Flavour) -> Result<Vec<Flat>> {
        let mut out = Vec::new();
        walk(data, flavour, 8, |f| {
            out.push(flat(f));
            Ok(())
        })?;
        Ok(out)
    }

    const PCREL_SDATA4: u8 = DW_EH_PE_pcrel.0 | DW_EH_PE_sdata4.0;

    /// Where the walker must find each field of the test `.eh_frame`.
    struct EhFrame {
        data: Vec<u8>,
        personality: u64,
        initial: u64,
        lsda: u64,
        set_loc: u64,
        expression: u64,
        fde_end: u64,
    }

    /// A `.eh_frame` with a "zPLR" CIE (pc-relative sdata4 pointers), one FDE with
    /// an LSDA, a DW_CFA_set_loc and a CFA expression, and the zero terminator.
    fn eh_frame() -> EhFrame {
        let mut b = Bytes::new();
        let cie = b.length();
        b.u32(0); // CIE id
        b.u8(1); // version
        b.str("zPLR");
        b.uleb(1); // code alignment
        b.sleb(-8); // data alignment
        b.u8(16); // return address register
        b.uleb(7); // augmentation data: P (1 + 4), L, R
        b.u8(PCREL_SDATA4);
        let personality = b.u32(0x100);
        b.u8(PCREL_SDATA4);
        b.u8(PCREL_SDATA4);
        b.u8(DW_CFA_def_cfa.0);
        b.uleb(7);
        b.uleb(8);
        b.u8(DW_CFA_offset.0 | 16);
        b.uleb(1);
        b.end_length(cie);
        let fde = b.length();
        let id = b.at();
        b.u32((id - cie) as u32); // CIE pointer: back to the CIE
        let initial = b.raw(&(-0x40i32).to_le_bytes());
        b.u32(0x30); // pc_range
        b.uleb(4);
        let lsda = b.u32(0x200);
        b.u8(DW_CFA_advance_loc.0 | 1);
        b.u8(DW_CFA_set_loc.0);
        let set_loc = b.u32(0x10);
        b.u8(DW_CFA_def_cfa_expression.0);
        b.uleb(2);
        let expression = b.u8(DW_OP_breg7.0);
        b.sleb(8);
        b.u8(DW_CFA_nop.0);
        b.end_length(fde);
        let fde_end = b.at();
        b.u32(0);
        EhFrame { data: b.0, personality, initial, lsda, set_loc, expression, fde_end }
    }

    #[test]
    fn eh_frame_pointers_are_found_with_their_encodings() {
        let e = eh_frame();
        let minus_0x40 = (-0x40i64) as u64;
        let want = [
            ('p', e.personality, PCREL_SDATA4, 4, 0x100),
            ('p', e.initial, PCREL_SDATA4, 4, minus_0x40),
            ('f', e.initial, PCREL_SDATA4, 0, minus_0x40 ^ 0x30u64.rotate_left(32)),
            ('p', e.lsda, PCREL_SDATA4, 4, 0x200),
            ('p', e.set_loc, PCREL_SDATA4, 4, 0x10),
            ('e', e.expression, 0, 0, 2),
        ];
        assert_eq!(walked(&e.data, Flavour::EhFrame).unwrap(), want);
    }

    #[test]
    fn every_cut_inside_a_record_is_an_error_not_a_panic() {
        let e = eh_frame();
        let cie_end = 4 + u64::from(u32::from_le_bytes(e.data[..4].try_into().unwrap()));
        for n in 0..e.data.len() as u64 {
            let r = walked(&e.data[..n as usize], Flavour::EhFrame);
            if [0, cie_end, e.fde_end].contains(&n) {
                assert!(r.is_ok(), "cut at {n:#x}, a record boundary");
            } else {
                assert_eq!(r.unwrap_err().reason, Reason::BadEhFrame, "cut at {n:#x}");
            }
        }
    }

    #[test]
    fn pointer_encodings_have_their_sizes_and_signs() {
        // One FDE per encoding, under a "zR" CIE using it.
        let cases: [(DwEhPe, &[u8], u8, u64); 9] = [
            (DW_EH_PE_absptr, &0x1122_3344_5566_7788u64.to_le_bytes(), 8, 0x1122_3344_5566_7788),
            (DW_EH_PE_udata2, &0xfff0u16.to_le_bytes(), 2, 0xfff0),
            (DW_EH_PE_sdata2, &0xfff0u16.to_le_bytes(), 2, (-0x10i64) as u64),
            (DW_EH_PE_udata4, &0xffff_fff0u32.to_le_bytes(), 4, 0xffff_fff0),
            (DW_EH_PE_sdata4, &0xffff_fff0u32.to_le_bytes(), 4, (-0x10i64) as u64),
            (DW_EH_PE_udata8, &8u64.to_le_bytes(), 8, 8),
            (DW_EH_PE_sdata8, &(-8i64).to_le_bytes(), 8, (-8i64) as u64),
            (DW_EH_PE_uleb128, &[0x80, 0x01], 0, 0x80),
            (DW_EH_PE_sleb128, &[0x40], 0, (-0x40i64) as u64),
        ];
        for (enc, bytes, size, value) in cases {
            let enc = (DW_EH_PE_datarel | enc).0;
            let mut b = Bytes::new();
            let cie = b.length();
            b.u32(0);
            b.u8(1);
            b.str("zR");
            b.uleb(1);
            b.sleb(-8);
            b.u8(16);
            b.uleb(1);
            b.u8(enc);
            b.end_length(cie);
            let fde = b.length();
            b.u32((b.at() - cie) as u32);
            let at = b.raw(bytes);
            b.raw(bytes); // the pc_range, in the same format
            b.uleb(0);
            b.end_length(fde);
            let fields = walked(&b.0, Flavour::EhFrame).unwrap();
            assert_eq!(fields[0], ('p', at, enc, size, value), "{enc:#x}");
        }
    }

    #[test]
    fn debug_frame_addresses_are_absolute_and_64_bit_records_are_read() {
        let mut b = Bytes::new();
        // A DWARF 4 CIE of 64-bit DWARF: 0xffffffff, a 64-bit length and CIE id.
        b.u32(u32::MAX);
        let len_at = b.u64(0);
        b.u64(u64::MAX);
        b.u8(4);
        b.str("");
        b.u8(8); // address size
        b.u8(0); // segment selector size
        b.uleb(1);
        b.sleb(-8);
        b.uleb(16);
        let cie_end = b.at();
        b.0[len_at as usize..len_at as usize + 8].copy_from_slice(&(cie_end - len_at - 8).to_le_bytes());
        let fde = b.length();
        b.u32(u32::MAX); // a 32-bit FDE cannot point at a 64-bit CIE's 0xffffffff id
        b.end_length(fde);
        assert_eq!(walked(&b.0, Flavour::DebugFrame).unwrap_err().reason, Reason::BadEhFrame);
        b.0.truncate(cie_end as usize);
        let fde = b.length();
        b.u32(0); // CIE pointer: a section offset
        let initial = b.u64(0x1000);
        b.u64(0x20);
        b.u8(DW_CFA_set_loc.0);
        let set_loc = b.u64(0x1010);
        b.u8(DW_CFA_val_expression.0);
        b.uleb(3);
        b.uleb(1);
        let expression = b.u8(DW_OP_lit0.0);
        b.end_length(fde);
        let abs = DW_EH_PE_absptr.0;
        let want = [
            ('p', initial, abs, 8, 0x1000),
            ('f', initial, abs, 0, 0x1000 ^ 0x20u64.rotate_left(32)),
            ('p', set_loc, abs, 8, 0x1010),
            ('e', expression, 0, 0, 1),
        ];
        assert_eq!(walked(&b.0, Flavour::DebugFrame).unwrap(), want);
    }

    #[test]
    fn what_the_walker_cannot_read_is_an_error() {
        let e = eh_frame();
        let corrupt = |at: usize, byte: u8| {
            let mut d = e.data.clone();
            d[at] = byte;
            d
        };
        let aug = 4 + 4 + 1; // the CIE's augmentation string
        let cases = [
            (corrupt(8, 2), Reason::BadEhFrame),                             // CIE version 2
            (corrupt(aug + 1, b'X'), Reason::UnsupportedSection),            // "zXLR"
            (corrupt(e.personality as usize - 1, 0x05), Reason::BadEhFrame), // pointer format 5
            (corrupt(e.expression as usize - 2, 0x3f), Reason::BadEhFrame),  // no such instruction
            (corrupt(e.initial as usize - 4, 0xff), Reason::BadEhFrame),     // CIE pointer to nowhere
            (corrupt(0, 0xff), Reason::BadEhFrame),                          // CIE longer than the section
        ];
        assert_refused(&cases, |data| walked(data, Flavour::EhFrame));
    }

    #[test]
    fn an_augmentation_longer_than_its_record_is_an_error() {
        // The FDE's augmentation length reaching past the record would skip its
        // instructions, DW_CFA_set_loc included, unexamined.
        let e = eh_frame();
        let mut data = e.data.clone();
        data[e.lsda as usize - 1] = 0x7f;
        assert_eq!(walked(&data, Flavour::EhFrame).unwrap_err().reason, Reason::BadEhFrame);
        // The same for the CIE's augmentation (and the instructions after it).
        let mut data = e.data.clone();
        data[e.personality as usize - 2] = 0x7f;
        assert_eq!(walked(&data, Flavour::EhFrame).unwrap_err().reason, Reason::BadEhFrame);
    }
}
