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
                let aug_len = c.uleb()?;
                let aug_end = c
                    .pos
                    .checked_add(aug_len)
                    .ok_or_else(|| bad(format!("FDE at {pos:#x} has an impossible augmentation length")))?;
                c.pointer(cie.lsda_enc, cie.addr_size, &mut visit)?;
                if c.pos > aug_end {
                    return Err(bad(format!("FDE at {pos:#x} has a short augmentation")));
                }
                c.pos = aug_end;
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
        let aug_len = c.uleb()?;
        let aug_end = c
            .pos
            .checked_add(aug_len)
            .ok_or_else(|| bad(format!("CIE at {at:#x} has an impossible augmentation length")))?;
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
        if c.pos > aug_end {
            return Err(bad(format!("CIE at {at:#x} has a short augmentation")));
        }
        c.pos = aug_end;
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
