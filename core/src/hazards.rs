//! References a shift cannot repair: code that computes the address of something
//! that stays (the ELF header, the program headers, loader metadata) pc-relatively.
//! After a shift such code would be off by `dv`. There is no relocation to fix, so
//! the only safe answer is to refuse the shift (alignment-only still works).
//!
//! Independent detectors:
//! * symbols the linker defines only when something refers to them (`__ehdr_start`
//!   and friends), and the dynamic loader itself (which uses `__ehdr_start`);
//! * on x86-64 and i386, the instructions of every function (bounds from `.eh_frame`
//!   FDEs, else from the sizes of function symbols) are decoded with a real decoder:
//!   an instruction whose RIP-relative operand (i386: GOT-relative displacement) or
//!   branch target lies in what stays is a hazard, and so is code the decoder cannot
//!   decode (data inside a function, an instruction cut at its end), since it could
//!   hide one. Only code outside every function's bounds (padding, PLT stubs without
//!   an FDE) is probed by byte pattern (RIP-relative `lea`/`mov`, GOT-relative on
//!   i386), as before;
//! * on aarch64, every instruction word is decoded for `adrp` (with its `add`/`ldr`),
//!   `adr` and literal loads: fixed-width code needs no bounds to stay in step;
//! * on i386, code addresses data relative to the GOT: the GOT must move with it.

use crate::cfi::{self, Field, Flavour, PE_ABSPTR, PE_PCREL};
use crate::elf::consts::*;
use crate::elf::names::EH_FRAME;
use crate::elf::{c_string, Elf, Shdr};
use crate::error::{Error, Reason, Result};
use crate::layout::Analysis;
use iced_x86::{Decoder, DecoderError, DecoderOptions, FastFormatter, Instruction, OpKind, Register};

/// Linker-defined symbols that exist only when code refers to them and that lie in
/// what stays.
const STAYING_SYMBOLS: &[&str] = &[
    "__ehdr_start",
    "__executable_start",
    "__rela_iplt_start",
    "__rela_iplt_end",
    "__rel_iplt_start",
    "__rel_iplt_end",
];

/// Fails if anything shows code referring to what the shift leaves in place.
/// The code is decoded first, so a true reference is reported as its instruction
/// rather than by the symbol that betrays it.
pub fn check_shift(elf: &Elf, an: &Analysis) -> Result<()> {
    check_code(elf, an)?;
    check_symbols(elf)?;
    check_soname(elf)
}

fn check_code(elf: &Elf, an: &Analysis) -> Result<()> {
    let stay = Staying { low: an.loads.first().map_or(0, |l| l.p_vaddr), end: an.move_start };
    match elf.ehdr.e_machine {
        EM_X86_64 => check_x86(elf, an, stay, Addressing::RipRelative),
        EM_AARCH64 => probe_aarch64(elf, an),
        EM_386 => {
            let got = got_that_moves(elf, an)?;
            got.map_or(Ok(()), |got| check_x86(elf, an, stay, Addressing::GotRelative(got)))
        }
        _ => Ok(()),
    }
}

fn check_symbols(elf: &Elf) -> Result<()> {
    for s in elf.shdrs.iter().filter(|s| s.sh_type == SHT_SYMTAB || s.sh_type == SHT_DYNSYM) {
        for (_, sym) in elf.symbols(s)? {
            if sym.shndx == SHN_UNDEF {
                continue;
            }
            let Some(name) = elf.symbol_name(s, &sym) else {
                continue;
            };
            if STAYING_SYMBOLS.contains(&name) {
                return Err(Error::new(
                    Reason::EhdrReference,
                    format!("{} defines {name}, so code refers to the headers pc-relatively", s.name),
                ));
            }
        }
    }
    Ok(())
}

fn check_soname(elf: &Elf) -> Result<()> {
    let dynamic = elf.dynamic()?;
    let Some(strtab) = dynamic.iter().find(|(_, d)| d.tag == DT_STRTAB).map(|(_, d)| d.val) else {
        return Ok(());
    };
    for (_, d) in dynamic.iter().filter(|(_, d)| d.tag == DT_SONAME) {
        let Some(off) = strtab.checked_add(d.val).and_then(|a| elf.vaddr_to_offset(a)) else {
            continue;
        };
        let name = c_string(elf.data, off).unwrap_or("");
        if name.starts_with("ld-linux") || name.starts_with("ld.so") || name.starts_with("ld64.so") {
            return Err(Error::new(
                Reason::EhdrReference,
                format!("{name} is the dynamic loader, which finds its own headers pc-relatively"),
            ));
        }
    }
    Ok(())
}

/// What stays in place: `[low, end)`, from the start of the image to the split point.
#[derive(Clone, Copy)]
struct Staying {
    low: u64,
    end: u64,
}

impl Staying {
    fn holds(self, a: u64) -> bool {
        a >= self.low && a < self.end
    }
}

/// How x86 code forms addresses without relocations.
#[derive(Clone, Copy)]
enum Addressing {
    /// x86-64: relative to the instruction pointer.
    RipRelative,
    /// i386 PIC: relative to the GOT at this address, held in a register.
    GotRelative(u64),
}

impl Addressing {
    fn bitness(self) -> u32 {
        match self {
            Addressing::RipRelative => 64,
            Addressing::GotRelative(_) => 32,
        }
    }

    /// The address in what stays that `insn` forms, if any: its memory operand
    /// (RIP-relative, or a GOT-relative displacement) or its branch target.
    fn staying_target(self, insn: &Instruction, stay: Staying) -> Option<(u64, &'static str)> {
        if matches!(insn.op0_kind(), OpKind::NearBranch64 | OpKind::NearBranch32 | OpKind::NearBranch16)
            && stay.holds(insn.near_branch_target())
        {
            return Some((insn.near_branch_target(), "by a branch"));
        }
        match self {
            Addressing::RipRelative => {
                let target = insn.ip_rel_memory_address();
                (insn.memory_base() == Register::RIP && stay.holds(target)).then_some((target, "pc-relatively"))
            }
            Addressing::GotRelative(got) => {
                let base = insn.memory_base();
                if base == Register::None || base == Register::ESP || insn.memory_displ_size() != 4 {
                    return None;
                }
                let target = got.wrapping_add(u64::from(insn.memory_displacement32()) as i32 as u64) & 0xffff_ffff;
                stay.holds(target).then_some((target, "GOT-relatively"))
            }
        }
    }
}

/// The bounds `[start, end)` of every function the file describes, sorted by start,
/// one per start: the FDEs of `.eh_frame`, then function symbols whose start no FDE
/// gives (an FDE describes code only; a hand-written symbol size may cover data).
fn function_bounds(elf: &Elf) -> Result<Vec<(u64, u64)>> {
    let wrap = |a: u64| if elf.class.is64 { a } else { a & 0xffff_ffff };
    let mut fdes = Vec::new();
    if let Some(s) = elf.section(EH_FRAME).filter(|s| s.is_alloc() && s.has_file_data()) {
        cfi::walk(elf.section_data(s), Flavour::EhFrame, elf.class.word() as u8, |f| {
            if let Field::Fde { off, enc, value, len } = f {
                let start = match enc & 0x70 {
                    PE_ABSPTR => Some(value),
                    PE_PCREL => Some((s.sh_addr + off).wrapping_add(value)),
                    _ => None, // other bases: that code is probed as outside any function
                };
                if let Some(start) = start.filter(|_| len > 0 && enc & 0x80 == 0) {
                    fdes.push((wrap(start), wrap(start).saturating_add(len)));
                }
            }
            Ok(())
        })?;
    }
    fdes.sort_unstable();
    fdes.dedup_by_key(|r| r.0);
    let mut symbols = Vec::new();
    for t in elf.shdrs.iter().filter(|s| s.sh_type == SHT_SYMTAB || s.sh_type == SHT_DYNSYM) {
        for (_, sym) in elf.symbols(t)? {
            let function = sym.kind() == STT_FUNC || sym.kind() == STT_GNU_IFUNC;
            if function && sym.size > 0 && sym.shndx != SHN_UNDEF && sym.shndx < SHN_LORESERVE {
                let start = wrap(sym.value);
                if fdes.binary_search_by_key(&start, |r| r.0).is_err() {
                    symbols.push((start, start.saturating_add(sym.size)));
                }
            }
        }
    }
    symbols.sort_unstable();
    symbols.dedup_by_key(|r| r.0);
    fdes.extend(symbols);
    fdes.sort_unstable();
    Ok(fdes)
}

/// The scan's unit (see check_x86), and the bytes it sees on either side of one: more
/// than the longest encoding `encoded_references` looks at around a place.
const CHUNK: usize = 4 << 20;
const EDGE: usize = 16;

/// Finds every place in the moved code that could encode an instruction forming an
/// address in what stays, then decodes the functions holding one: only a real
/// instruction counts. A place outside every function cannot be decoded in step, so
/// it counts as it is.
fn check_x86(elf: &Elf, an: &Analysis, stay: Staying, addressing: Addressing) -> Result<()> {
    let bounds = function_bounds(elf)?;
    let mut insn = Instruction::default();
    let mut decoded = Vec::new();
    for s in an.exec_sections(elf).filter(|s| an.section_moves[s.index]) {
        let code = elf.section_data(s);
        let end = s.sh_addr + code.len() as u64;
        decoded.clear();
        // Chunk by chunk, so that a refusal stops the scan where it is found (chromium:
        // 11 MiB into 225 MiB of code); each chunk is scanned with the bytes around it,
        // so places at its edges see their opcode before and displacement after.
        let places = (0..code.len()).step_by(CHUNK).flat_map(|c0| {
            let (lo, hi) = (c0.saturating_sub(EDGE), (c0 + CHUNK + EDGE).min(code.len()));
            encoded_references(&code[lo..hi], s.sh_addr + lo as u64, stay, addressing)
                .into_iter()
                .map(move |(at, target)| (at + lo, target))
                .filter(move |&(at, _)| at >= c0 && at < c0 + CHUNK)
        });
        for (at, target) in places {
            let pc = s.sh_addr + at as u64;
            // The function holding `pc` that starts last: decoding starts in step there.
            let holder = bounds[..bounds.partition_point(|r| r.0 <= pc)]
                .iter()
                .rev()
                .take(8)
                .find(|r| r.1 > pc && r.0 >= s.sh_addr);
            let Some(&(start, stop)) = holder else {
                if looks_like_lea_or_mov(code, at) {
                    return Err(outside_functions(elf, s, at - 1, code, target, addressing));
                }
                continue;
            };
            if decoded.last() == Some(&start) {
                continue;
            }
            decoded.push(start);
            let stop = stop.min(end);
            let bytes = &code[(start - s.sh_addr) as usize..(stop - s.sh_addr) as usize];
            let mut decoder = Decoder::with_ip(addressing.bitness(), bytes, start, DecoderOptions::NONE);
            while decoder.can_decode() {
                decoder.decode_out(&mut insn);
                if insn.is_invalid() {
                    return Err(undecodable(s, code, &insn, decoder.last_error(), (start, stop)));
                }
                if let Some((target, how)) = addressing.staying_target(&insn, stay) {
                    let at = (insn.ip() - s.sh_addr) as usize;
                    return Err(staying_instruction(elf, s, &code[at..at + insn.len()], &insn, how, target));
                }
            }
        }
    }
    Ok(())
}

/// Section offsets of the first byte of every encoding, at any byte offset, that
/// could form an address in what stays: a ModRM with a 32-bit displacement
/// (x86-64: RIP-relative, mod=00 rm=101, the next instruction 0 to 4 immediate
/// bytes later; i386: a base register, mod=10, with or without SIB, added to the
/// GOT), a rel32 call, jump or conditional jump, or a rel8 branch close to the split
/// point. Every instruction that forms such an address has one of these, so code
/// without any cannot refer to what stays however it is decoded; this scan is what
/// keeps the check fast.
fn encoded_references(code: &[u8], base: u64, stay: Staying, addressing: Addressing) -> Vec<(usize, u64)> {
    let disp = |at: usize| i32::from_le_bytes(code[at..at + 4].try_into().unwrap()) as i64 as u64;
    let wrap = |a: u64| if addressing.bitness() == 32 { a & 0xffff_ffff } else { a };
    // A target `next + k` for k in 0..=4 (the immediate after the displacement).
    // A target `next + k` for k in 0..=slack (the immediate after the displacement).
    let reaches = |next: u64, slack: u64| {
        let t = wrap(next);
        (t < stay.end && t.saturating_add(slack) >= stay.low).then_some(t)
    };
    let rel16 = |next: u64, at: usize| {
        let t =
            (next & !0xffff) | (next.wrapping_add(i16::from_le_bytes([code[at], code[at + 1]]) as i64 as u64) & 0xffff);
        reaches(t, 0)
    };
    let near_split = stay.end.saturating_add(130);
    let exact = |i: usize| {
        let b = code[i];
        let pc = base + i as u64;
        match (b, addressing) {
            (0xe8 | 0xe9, _) if i + 5 <= code.len() => reaches((pc + 5).wrapping_add(disp(i + 1)), 0),
            (0x0f, _) if i + 6 <= code.len() && code[i + 1] & 0xf0 == 0x80 => {
                reaches((pc + 6).wrapping_add(disp(i + 2)), 0)
            }
            (0x70..=0x7f | 0xe0..=0xe3 | 0xeb, _) if pc < near_split && i + 2 <= code.len() => {
                reaches((pc + 2).wrapping_add(code[i + 1] as i8 as i64 as u64), 0)
            }
            // An operand-size prefix makes a 32-bit branch's displacement 16 bits.
            (0x66, Addressing::GotRelative(_)) => match code.get(i + 1..i + 5) {
                Some([0xe8 | 0xe9, ..]) => rel16(pc + 4, i + 2),
                Some([0x0f, op, ..]) if op & 0xf0 == 0x80 => rel16(pc + 5, i + 3),
                _ => None,
            },
            (_, Addressing::RipRelative) if b & 0xc7 == 0x05 && i + 5 <= code.len() => {
                reaches((pc + 5).wrapping_add(disp(i + 1)), 4)
            }
            (_, Addressing::GotRelative(got)) if b & 0xc0 == 0x80 => {
                let at = if b & 7 == 4 { i + 2 } else { i + 1 }; // past the SIB byte
                if at + 4 <= code.len() {
                    reaches(got.wrapping_add(disp(at)), 0)
                } else {
                    None
                }
            }
            _ => None,
        }
    };
    // Every form's target but the short branches' is a 32-bit displacement added to
    // the address just past it (RIP-relative, rel32) or to the GOT: a branch-free
    // test of both at every byte leaves `exact` to the few places just before a
    // displacement that passes (its ModRM, or opcode and ModRM/SIB). The short
    // branches (rel8, rel16) reach what stays only from its first 64 KiB after it,
    // where every byte is tested exactly.
    let lo = stay.low.saturating_sub(4); // the immediate after a RIP-relative displacement
    let span = stay.end - lo;
    let mut found: Vec<(usize, u64)> = Vec::new();
    let mut test = |i: usize| {
        if found.last().is_none_or(|&(last, _)| last < i) {
            if let Some(t) = exact(i) {
                found.push((i, t));
            }
        }
    };
    let short_reach = stay.end.saturating_add(0x1_0000);
    let slow = (short_reach.saturating_sub(base) as usize).min(code.len());
    for i in 0..slow {
        test(i);
    }
    let mut hits = displacements_reaching::<true>(code, slow, base + 4, lo, span);
    if let Addressing::GotRelative(got) = addressing {
        hits.extend(displacements_reaching::<false>(code, slow, got, lo, span));
        hits.sort_unstable();
    }
    for j in hits {
        for i in j.saturating_sub(2)..j {
            test(i);
        }
    }
    // Places whose displacement the file cuts short.
    for i in code.len().saturating_sub(6).max(slow)..code.len() {
        test(i);
    }
    found
}

/// Offsets `j >= first` of `code` where a 32-bit displacement `d` may give a target
/// `base + d` in `[lo, lo + span)`, where base is `bias + j` (PC_RELATIVE: the
/// displacement counts from the address `bias` past its own position) or `bias`.
/// The hot loop of the check, so it computes modulo 2^32 (every true target is
/// found; a few more are, which `exact` then rules out) and tests five places per
/// load without a branch.
fn displacements_reaching<const PC_RELATIVE: bool>(
    code: &[u8],
    first: usize,
    bias: u64,
    lo: u64,
    span: u64,
) -> Vec<usize> {
    let end = code.len().saturating_sub(3); // the last displacement starts before it
    let Ok(span) = u32::try_from(span) else {
        return (first..end).collect(); // what stays spans 4 GiB: every place may reach it
    };
    let from_lo = bias.wrapping_sub(lo) as u32;
    let base = |j: usize| if PC_RELATIVE { from_lo.wrapping_add(j as u32) } else { from_lo };
    let mut hits = Vec::new();
    let mut j = first;
    // Five displacements from one 8-byte load, tested without a branch.
    while j + 8 <= code.len() {
        let w = u64::from_le_bytes(code[j..j + 8].try_into().unwrap());
        let reach = |k: usize| base(j + k).wrapping_add((w >> (8 * k)) as u32) < span;
        if reach(0) | reach(1) | reach(2) | reach(3) | reach(4) {
            hits.extend((0..5).filter(|&k| reach(k)).map(|k| j + k));
        }
        j += 5;
    }
    for j in j..end {
        if base(j).wrapping_add(u32::from_le_bytes(code[j..j + 4].try_into().unwrap())) < span {
            hits.push(j);
        }
    }
    hits
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}

/// What lies at `a` in the input: the headers, or the allocated section holding it.
fn what_is_at(elf: &Elf, a: u64) -> String {
    let image = elf.loads().next().map_or(0, |l| l.p_vaddr);
    if a >= image && a - image < elf.class.ehdr_size() {
        return "the ELF header".into();
    }
    let phdrs = elf.ehdr.e_phoff.wrapping_sub(elf.loads().next().map_or(0, |l| l.p_offset)).wrapping_add(image);
    if a >= phdrs && a - phdrs < elf.phdrs.len() as u64 * elf.class.phdr_size() {
        return "the program headers".into();
    }
    elf.shdrs
        .iter()
        .find(|s| s.is_alloc() && s.sh_addr <= a && a < s.vend())
        .map_or_else(|| "no section".into(), |s| s.name.clone())
}

fn staying_instruction(elf: &Elf, s: &Shdr, bytes: &[u8], insn: &Instruction, how: &str, target: u64) -> Error {
    let mut text = String::new();
    FastFormatter::new().format(insn, &mut text);
    Error::new(
        Reason::EhdrReference,
        format!(
            "`{text}` ({}) at {:#x} in {} refers {how} to {target:#x} ({}), which stays in place",
            hex(bytes),
            insn.ip(),
            s.name,
            what_is_at(elf, target)
        ),
    )
}

fn undecodable(s: &Shdr, code: &[u8], insn: &Instruction, error: DecoderError, function: (u64, u64)) -> Error {
    let at = (insn.ip() - s.sh_addr) as usize;
    let shown = &code[at..code.len().min(at + 8).min((function.1 - s.sh_addr) as usize)];
    let why = if error == DecoderError::NoMoreBytes {
        format!("an instruction is cut by the function's end at {:#x}", function.1)
    } else {
        "they are no instruction".into()
    };
    Error::new(
        Reason::UndecodableCode,
        format!(
            "the bytes at {:#x} in {} ({}) inside the function at {:#x} cannot be decoded: {why}",
            insn.ip(),
            s.name,
            hex(shown),
            function.0
        ),
    )
}

/// Whether the ModRM byte at `at` follows a `lea` or `mov` opcode (8d, 8b): outside
/// every function's bounds only that form counts, as the byte probe always had it.
/// Other places there are not decoded in step and would refuse files for noise:
/// libnode's V8 builtins, generated code with no FDE, are 20 MiB of such bytes.
fn looks_like_lea_or_mov(code: &[u8], at: usize) -> bool {
    at > 0 && matches!(code[at - 1], 0x8d | 0x8b) && (code[at] & 0xc7 == 0x05 || code[at] & 0xc0 == 0x80)
}

/// A `lea`/`mov` outside every function's bounds (see `looks_like_lea_or_mov`) that
/// could form an address in what stays: it cannot be decoded in step, so it counts.
fn outside_functions(elf: &Elf, s: &Shdr, at: usize, code: &[u8], target: u64, addressing: Addressing) -> Error {
    let how = match addressing {
        Addressing::RipRelative => "pc-relatively",
        Addressing::GotRelative(_) => "GOT-relatively",
    };
    Error::new(
        Reason::EhdrReference,
        format!(
            "bytes at {:#x} in {} ({}), outside any function's bounds, could be code that refers {how} to \
             {target:#x} ({}), which stays in place",
            s.sh_addr + at as u64,
            s.name,
            hex(&code[at..code.len().min(at + 8)]),
            what_is_at(elf, target)
        ),
    )
}

/// Every instruction word of the moved code, for the three forms that compute an
/// address pc-relatively. `adrp xD, page` computes a 4 KiB page: a page wholly
/// below the split point is a reference to what stays; for the page holding the
/// split point the low bits come from the `add`/`ldr` that uses xD next (or,
/// unknown, count it). `adr` (±1 MiB) and literal loads (`ldr`/`ldrsw`/`prfm` of a
/// label) give the address itself.
fn probe_aarch64(elf: &Elf, an: &Analysis) -> Result<()> {
    let stay = Staying { low: an.loads.first().map_or(0, |l| l.p_vaddr), end: an.move_start };
    let insn = |code: &[u8], i: usize| code.get(i..i + 4).map(|b| u32::from_le_bytes(b.try_into().unwrap()));
    for s in an.exec_sections(elf).filter(|s| an.section_moves[s.index]) {
        let code = elf.section_data(s);
        for i in (0..code.len()).step_by(4) {
            let Some(w) = insn(code, i) else { break };
            let pc = s.sh_addr + i as u64;
            let (target, form) = if let Some(page) = adrp_page(w, pc) {
                if !stay.holds(page) {
                    continue;
                }
                let rd = w & 0x1f;
                let target = if page + 0x1000 <= stay.end {
                    page
                } else {
                    match insn(code, i + 4) {
                        // add xD, xD, #imm12{, lsl #12}
                        Some(n) if n & 0xff80_0000 == 0x9100_0000 && (n >> 5) & 0x1f == rd => {
                            page + (u64::from((n >> 10) & 0xfff) << (12 * ((n >> 22) & 1)))
                        }
                        // ldr xD/wD, [xD, #imm12 * size]
                        Some(n) if n & 0xbfc0_0000 == 0xb940_0000 && (n >> 5) & 0x1f == rd => {
                            page + (u64::from((n >> 10) & 0xfff) << (2 + (n >> 30 & 1)))
                        }
                        _ => page,
                    }
                };
                (target, "adrp")
            } else if let Some(target) = adr_target(w, pc) {
                (target, "adr")
            } else if let Some(target) = literal_target(w, pc) {
                (target, "a literal load")
            } else {
                continue;
            };
            if stay.holds(target) {
                return Err(Error::new(
                    Reason::EhdrReference,
                    format!(
                        "{form} ({w:08x}) at {pc:#x} in {} refers pc-relatively to {target:#x} ({}), which stays in place",
                        s.name,
                        what_is_at(elf, target)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The page an `adrp` at `pc` computes, or None if `insn` is not an `adrp`.
fn adrp_page(insn: u32, pc: u64) -> Option<u64> {
    if insn & 0x9f00_0000 != 0x9000_0000 {
        return None;
    }
    let imm = u64::from(((insn >> 5) & 0x7ffff) << 2 | (insn >> 29) & 3);
    let offset = ((imm << 43) as i64 >> 31) as u64; // sign-extend 21 bits, times 4096
    Some((pc & !0xfff).wrapping_add(offset))
}

/// The address an `adr` at `pc` computes (immhi:immlo, 21 bits, signed).
fn adr_target(insn: u32, pc: u64) -> Option<u64> {
    if insn & 0x9f00_0000 != 0x1000_0000 {
        return None;
    }
    let imm = u64::from(((insn >> 5) & 0x7ffff) << 2 | (insn >> 29) & 3);
    Some(pc.wrapping_add(((imm << 43) as i64 >> 43) as u64))
}

/// The label a literal load at `pc` reads: LDR (literal) of a general or SIMD
/// register, LDRSW and PRFM (literal), all `xx011x00 imm19 Rt`.
fn literal_target(insn: u32, pc: u64) -> Option<u64> {
    if insn & 0x3b00_0000 != 0x1800_0000 {
        return None;
    }
    let imm = u64::from((insn >> 5) & 0x7ffff);
    Some(pc.wrapping_add(((imm << 45) as i64 >> 43) as u64)) // sign-extend 19 bits, times 4
}

/// i386 PIC reaches data as GOT + offset: the GOT must move with the code. Returns
/// the GOT's address (None without one).
fn got_that_moves(elf: &Elf, an: &Analysis) -> Result<Option<u64>> {
    let Some(got) = elf.dynamic()?.iter().find(|(_, d)| d.tag == DT_PLTGOT).map(|(_, d)| d.val) else {
        return Ok(None);
    };
    if got < an.move_start {
        return Err(Error::new(
            Reason::UnsupportedLayout,
            format!("the GOT at {got:#x} stays while the code moves, so GOT-relative references would break"),
        ));
    }
    Ok(Some(got))
}

#[cfg(test)]
mod tests {
    use super::{adr_target, adrp_page, check_shift, check_soname, literal_target};
    use crate::elf::consts::*;
    use crate::elf::{Class, Ehdr, Elf, Shdr};
    use crate::error::{Error, Reason};
    use crate::layout::analyse;
    use crate::testelf::{Arrangement, Dso};

    /// The shift check of a file whose .text starts with `code`: its FDE covers the
    /// first 16 bytes of .text (the function), the rest is trap bytes outside it.
    fn check(code: impl FnOnce(u64) -> Vec<u8>) -> (u64, Result<(), Error>) {
        let mut dso = Dso::new(Arrangement::SeparateCode, 0x3000);
        let text = dso.build().addr(".text");
        dso.code = code(text);
        let data = dso.build().data;
        let elf = Elf::parse(&data).unwrap();
        (text, check_shift(&elf, &analyse(&elf).unwrap()))
    }

    /// `disp32` from the end of an instruction of `len` bytes at `at` to `target`.
    fn rel(at: u64, len: u64, target: u64) -> [u8; 4] {
        (target.wrapping_sub(at + len) as u32).to_le_bytes()
    }

    #[test]
    fn a_true_reference_is_named_by_its_instruction() {
        // lea rax, [rip + disp32] to the ELF header at 0.
        let (text, r) = check(|text| [&[0x48, 0x8d, 0x05][..], &rel(text, 7, 0)].concat());
        let e = r.unwrap_err();
        assert_eq!(e.reason, Reason::EhdrReference);
        assert!(e.detail.starts_with("`lea rax,[") && e.detail.contains("` (48 8d 05 "), "{e}");
        assert!(e.detail.contains(&format!("at {text:#x} in .text")), "{e}");
        assert!(e.detail.contains("refers pc-relatively to 0x0 (the ELF header)"), "{e}");
        // Any instruction with such an operand counts, not only lea/mov: cmp [rip+x], 1.
        let (_, r) = check(|text| [&[0x83, 0x3d][..], &rel(text, 7, 0x40), &[1]].concat());
        let e = r.unwrap_err();
        assert!(e.detail.contains("cmp dword ptr") && e.detail.contains("(the program headers)"), "{e}");
        // And a branch into what stays: jmp rel32.
        let (_, r) = check(|text| [&[0xe9][..], &rel(text, 5, 0x10)].concat());
        let e = r.unwrap_err();
        assert!(e.detail.starts_with("`jmp ") && e.detail.contains("refers by a branch to 0x10"), "{e}");
    }

    #[test]
    fn bytes_that_only_look_like_a_reference_are_no_hazard() {
        // movabs rax, imm64 whose immediate holds `lea rax, [rip + disp32]` to the
        // ELF header: the byte probe counted it, the decoder sees one instruction.
        let (_, r) = check(|text| [&[0x48, 0xb8, 0x48, 0x8d, 0x05][..], &rel(text + 2, 7, 0), &[0]].concat());
        assert!(r.is_ok(), "{:?}", r.err());
    }

    #[test]
    fn code_the_decoder_cannot_decode_is_a_hazard() {
        // 0x06 (push es) does not exist in 64-bit mode: data inside a function, here
        // data that could also be read as `add eax, disp32` pointing at the header.
        let (text, r) = check(|text| [&[0x90, 0x06, 0x05][..], &rel(text + 2, 5, 0)].concat());
        let e = r.unwrap_err();
        assert_eq!(e.reason, Reason::UndecodableCode);
        assert!(e.detail.contains(&format!("bytes at {:#x} in .text (06 05", text + 1)), "{e}");
        assert!(e.detail.contains("are no instruction"), "{e}");
        // A call to the header whose rel32 runs past the function's end (its FDE covers 16 bytes).
        let (text, r) = check(|text| [&[0xcc; 12][..], &[0xe8], &rel(text + 12, 5, 0)].concat());
        let e = r.unwrap_err();
        assert_eq!(e.reason, Reason::UndecodableCode);
        assert!(e.detail.contains(&format!("cut by the function's end at {:#x}", text + 16)), "{e}");
    }

    #[test]
    fn code_outside_every_function_is_probed_by_pattern() {
        let (text, r) =
            check(|text| [vec![0xcc; 0x20], [&[0x48, 0x8d, 0x05][..], &rel(text + 0x20, 7, 0)].concat()].concat());
        let e = r.unwrap_err();
        assert_eq!(e.reason, Reason::EhdrReference);
        let want = format!("bytes at {:#x} in .text (8d 05", text + 0x21);
        assert!(e.detail.starts_with(&want) && e.detail.contains("outside any function's bounds"), "{e}");
        assert!(e.detail.contains("refers pc-relatively to 0x0 (the ELF header)"), "{e}");
        // Other forms there are not decoded in step: generated code without FDEs
        // (V8's builtins) is full of them by chance.
        let (_, r) = check(|text| [vec![0xcc; 0x20], [&[0xe8][..], &rel(text + 0x20, 5, 0)].concat()].concat());
        assert!(r.is_ok(), "{:?}", r.err());
    }

    /// A file that is only `data` and a dynamic section of `size` bytes at `offset`.
    fn dynamic_only(data: &[u8], offset: u64, size: u64) -> Elf<'_> {
        let ehdr = Ehdr {
            e_type: ET_DYN,
            e_machine: EM_X86_64,
            e_entry: 0,
            e_phoff: 0,
            e_shoff: 0,
            e_phentsize: 56,
            phnum: 0,
            e_shentsize: 64,
            shnum: 1,
            shstrndx: 0,
        };
        let s = Shdr {
            index: 0,
            name: ".dynamic".into(),
            sh_name: 0,
            sh_type: SHT_DYNAMIC,
            sh_flags: 0,
            sh_addr: 0,
            sh_offset: offset,
            sh_size: size,
            sh_link: 0,
            sh_info: 0,
            sh_addralign: 8,
            sh_entsize: 16,
        };
        Elf { data, class: Class { is64: true }, ehdr, phdrs: Vec::new(), shdrs: vec![s] }
    }

    #[test]
    fn soname_offsets_past_the_address_space_are_errors_or_skipped() {
        let entries = [(DT_STRTAB, u64::MAX - 0xff), (DT_SONAME, 0x1000), (DT_NULL, 0)];
        let data: Vec<u8> = entries.iter().flat_map(|&(t, v)| [t.to_le_bytes(), v.to_le_bytes()].concat()).collect();
        assert!(check_soname(&dynamic_only(&data, 0, data.len() as u64)).is_ok());
        // An empty dynamic section (unchecked by parsing) at the very end of the offsets.
        let e = check_soname(&dynamic_only(&data, u64::MAX - 7, 0)).unwrap_err();
        assert_eq!(e.reason, Reason::BadDynamic);
    }

    /// `adrp x<rd>, page`, encoded by hand from the Arm ARM (C6.2.11).
    fn adrp(rd: u32, pc: u64, page: u64) -> u32 {
        let imm = ((page as i64 - (pc & !0xfff) as i64) >> 12) as u32 & 0x1f_ffff;
        0x9000_0000 | (imm & 3) << 29 | (imm >> 2) << 5 | rd
    }

    #[test]
    fn adrp_pages_decode_both_ways() {
        assert_eq!(adrp_page(adrp(24, 0x12_3450, 0), 0x12_3450), Some(0));
        assert_eq!(adrp_page(adrp(3, 0x1000, 0x5_0000), 0x1ffc), Some(0x5_0000));
        assert_eq!(adrp_page(adrp(0, 0x40_0000, 0x1000), 0x40_0abc), Some(0x1000));
        assert_eq!(adrp_page(0xd420_0000, 0), None); // brk #0
    }

    #[test]
    fn adr_and_literal_loads_decode_both_ways() {
        // adr x1, .-4: immhi:immlo = -4, so immlo 0 and immhi all ones
        assert_eq!(adr_target(0x10ff_ffe1, 0x1000), Some(0xffc));
        // adr x0, .+0x10: immlo 0, immhi 4
        assert_eq!(adr_target(0x1000_0080, 0x2000), Some(0x2010));
        // ldr x2, .+8 (imm19 = 2) and ldr w3, .-8 (imm19 = -2)
        assert_eq!(literal_target(0x5800_0042, 0x4000), Some(0x4008));
        assert_eq!(literal_target(0x18ff_ffc3, 0x4000), Some(0x3ff8));
        assert_eq!(adr_target(0x9000_0000, 0), None); // adrp is no adr
        assert_eq!(literal_target(0xd503_201f, 0), None); // nop
    }
}
