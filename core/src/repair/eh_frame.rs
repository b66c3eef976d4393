//! `.eh_frame` and `.eh_frame_hdr`: their pointers are mostly pc-relative or
//! relative to the header, so they keep their meaning as long as the pointer and its
//! target move together. Only pointers that cross the split point change:
//! `new = f(target) - f(base)`. Absolute pointers are covered by dynamic
//! relocations and are left to that repair.

use super::Ctx;
use crate::addr_map::AddrMap;
use crate::cfi::{self, Field, Flavour, PE_ABSPTR, PE_DATAREL, PE_OMIT, PE_PCREL};
use crate::elf::names::{EH_FRAME, EH_FRAME_HDR};
use crate::elf::Shdr;
use crate::error::{Error, Reason, Result};
use crate::patch::Patches;

pub(super) fn repair(ctx: &Ctx, p: &mut Patches) -> Result<()> {
    let elf = ctx.elf;
    let asz = elf.class.word() as u8;
    if let Some(s) = elf.section(EH_FRAME).filter(|s| s.is_alloc() && s.has_file_data()) {
        let map = ctx.plan.map;
        cfi::walk(elf.section_data(s), Flavour::EhFrame, asz, |f| match f {
            Field::Pointer { off, enc, size, value } => relative_pointer(s, &map, off, enc, size, value, 0, p),
            Field::Expression { .. } | Field::Fde { .. } => Ok(()),
        })?;
    }
    if let Some(h) = elf.section(EH_FRAME_HDR).filter(|s| s.is_alloc() && s.has_file_data()) {
        header(ctx, h, p)?;
    }
    Ok(())
}

/// Re-encodes a pc-relative or data-relative pointer whose target moved differently
/// from its base. `datarel_base` is the address datarel values are relative to.
#[allow(clippy::too_many_arguments)]
fn relative_pointer(
    s: &Shdr,
    map: &AddrMap,
    off: u64,
    enc: u8,
    size: u8,
    value: u64,
    datarel_base: u64,
    p: &mut Patches,
) -> Result<()> {
    if enc == PE_OMIT || enc & 0x70 == PE_ABSPTR {
        return Ok(());
    }
    let base = match enc & 0x70 {
        PE_PCREL => s.sh_addr + off,
        PE_DATAREL if datarel_base != 0 => datarel_base,
        _ => {
            return Err(Error::new(
                Reason::UnsupportedSection,
                format!("{}: pointer encoding {enc:#x} at {off:#x} is not supported", s.name),
            ))
        }
    };
    let target = base.wrapping_add(value);
    let new = map.map(target).wrapping_sub(map.map(base));
    if new == value {
        return Ok(());
    }
    let fits = match (size, enc & 0x0f) {
        (4, 0x0b) => new as i64 == i64::from(new as i32),
        (4, 0x03) => new <= u64::from(u32::MAX),
        (8, _) => true,
        _ => false,
    };
    if !fits {
        return Err(Error::new(
            Reason::UnsupportedSection,
            format!("{}: pointer at {off:#x} (encoding {enc:#x}) cannot hold its moved value", s.name),
        ));
    }
    p.put(s.sh_offset + off, &new.to_le_bytes()[..size as usize]);
    Ok(())
}

/// `.eh_frame_hdr`: version, three encodings, the `.eh_frame` pointer, the FDE
/// count, then a sorted table of (initial location, FDE address) pairs relative to
/// the header itself. A uniform shift keeps the table sorted.
fn header(ctx: &Ctx, h: &Shdr, p: &mut Patches) -> Result<()> {
    let data = ctx.elf.section_data(h);
    if data.len() < 4 || data[0] != 1 {
        return Err(Error::new(Reason::BadEhFrame, format!("{}: unknown version or truncated header", h.name)));
    }
    let (ptr_enc, count_enc, table_enc) = (data[1], data[2], data[3]);
    let mut pos = 4u64;
    let mut pointers = Vec::new();
    if ptr_enc != PE_OMIT {
        let (value, size) = fixed(h, data, pos, ptr_enc)?;
        pointers.push((pos, ptr_enc, size, value));
        pos += u64::from(size);
    }
    if count_enc != PE_OMIT && table_enc != PE_OMIT {
        let (count, size) = fixed(h, data, pos, count_enc)?;
        pos += u64::from(size);
        for _ in 0..count.saturating_mul(2) {
            let (value, size) = fixed(h, data, pos, table_enc)?;
            pointers.push((pos, table_enc, size, value));
            pos += u64::from(size);
        }
    }
    let map = ctx.plan.map;
    for (at, enc, size, value) in pointers {
        relative_pointer(h, &map, at, enc, size, value, h.sh_addr, p)?;
    }
    Ok(())
}

/// Reads a fixed-size encoded value (the header never uses LEB128).
fn fixed(h: &Shdr, data: &[u8], pos: u64, enc: u8) -> Result<(u64, u8)> {
    let size: u8 = match enc & 0x0f {
        0x02 | 0x0a => 2,
        0x03 | 0x0b => 4,
        0x04 | 0x0c => 8,
        _ => return Err(Error::new(Reason::UnsupportedSection, format!("{}: unsupported encoding {enc:#x}", h.name))),
    };
    let bytes = data
        .get(pos as usize..pos as usize + usize::from(size))
        .ok_or_else(|| Error::new(Reason::BadEhFrame, format!("{}: table truncated at {pos:#x}", h.name)))?;
    let mut v = [0u8; 8];
    v[..bytes.len()].copy_from_slice(bytes);
    let raw = u64::from_le_bytes(v);
    let shift = 64 - 8 * u32::from(size);
    let value = if enc & 0x08 != 0 { (((raw << shift) as i64) >> shift) as u64 } else { raw };
    Ok((value, size))
}

#[cfg(test)]
mod tests {
    use crate::elf::{read_u32, Elf};
    use crate::testelf::{contents, shifted, Arrangement};

    /// The target of the pcrel|sdata4 or datarel|sdata4 field at `off` of `data`.
    fn target(data: &[u8], off: u64, base: u64) -> u64 {
        base.wrapping_add(read_u32(data, off).unwrap() as i32 as u64)
    }

    #[test]
    fn only_pointers_that_cross_the_split_point_change() {
        let (built, dv, out) = shifted(Arrangement::SeparateCode);
        let (old, new) = (Elf::parse(&built.data).unwrap(), Elf::parse(&out).unwrap());
        let (text, stays) = (built.addr(".text"), built.addr(".dynstr"));
        let (frame, hdr) = (built.addr(".eh_frame") + dv, built.addr(".eh_frame_hdr") + dv);

        // The FDEs' initial locations (at 32 and 56): the code's moved with the FDE, so
        // its bytes are as they were; the other still names the address that stays.
        let f = contents(&new, ".eh_frame");
        assert_eq!(&f[32..36], &contents(&old, ".eh_frame")[32..36]);
        assert_eq!((target(f, 32, frame + 32), target(f, 56, frame + 56)), (text + dv, stays));

        let h = contents(&new, ".eh_frame_hdr");
        assert_eq!(target(h, 4, hdr + 4), frame);
        let table: Vec<u64> = (0..4).map(|i| target(h, 12 + 4 * i, hdr)).collect();
        assert_eq!(table, [stays, frame + 48, text + dv, frame + 24]);
        assert_eq!(&h[..12], &contents(&old, ".eh_frame_hdr")[..12]);
    }

    #[test]
    fn a_file_without_call_frames_transforms() {
        use crate::elf::consts::PT_GNU_EH_FRAME;
        let mut dso = crate::testelf::Dso::new(Arrangement::SeparateCode, 0x3000);
        dso.eh_frame = false;
        let (_, _, out) = crate::testelf::run(&dso, crate::ModeChoice::Shift, 2 << 20);
        let new = Elf::parse(&out).unwrap();
        assert!(new.section(".eh_frame").is_none() && new.phdrs.iter().all(|p| p.p_type != PT_GNU_EH_FRAME));
    }
}
