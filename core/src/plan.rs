//! Planning: where every segment goes, for each mode, and what it buys.
//!
//! * **Shift** (the paper's separation shift): everything from the split point moves
//!   by one constant `dv`, chosen so the code ends on a huge-page boundary and the
//!   free space between the metadata and the moved code holds the leading padding.
//!   The executable segment then covers whole huge-page windows and nothing else.
//!   In lld's rodata-first layout the read-only data between the split point and the
//!   code (.rodata, .eh_frame_hdr, .eh_frame) moves too, in a read-only load of its
//!   own, and one `dv` keeps its distance to the code. Nothing of it may join the
//!   executable segment ([`crate::exposure`]): the code's window next to it stays
//!   partial, in small pages, at the code's start or at its end, whichever leaves more
//!   code on whole windows. Only a policy's exposure limit lets the data into the
//!   code's first window ([`Plan::exposed`]), where that gains more code than it exposes.
//! * **Align** (alignment only): no address changes; file offsets are padded so the
//!   code's offset is congruent to its address modulo the huge-page size, which lets
//!   the whole windows *inside* the code be mapped with huge pages.

use crate::addr_map::{AddrMap, Relocated};
use crate::elf::consts::*;
use crate::elf::{align_down, align_up, Elf, Phdr, Shdr};
use crate::error::{Error, Reason, Result};
use crate::exposure::OUTSIDE_SECTIONS;
use crate::hazards;
use crate::layout::{is_loader_metadata, Analysis, LoadPlace};
use crate::windows::{covered, huge_placed, huge_windows};

/// Which transformation a plan performs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Separation shift: code moves onto whole huge-page windows of its own.
    Shift,
    /// Alignment only: no address changes, padded file offsets.
    Align,
}

impl Mode {
    /// Short name used in reports and options.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Shift => "shift",
            Mode::Align => "align",
        }
    }
}

/// One range of input file bytes and where it goes in the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Input offset.
    pub src: u64,
    /// Length.
    pub len: u64,
    /// Output offset.
    pub dst: u64,
}

/// A complete plan for one file.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The mode.
    pub mode: Mode,
    /// Huge-page size the plan aligns to.
    pub huge_page: u64,
    /// How addresses change.
    pub map: AddrMap,
    /// The new program header table, in table order.
    pub phdrs: Vec<Phdr>,
    /// Loadable file content: the unchanged prefix, then each (part of a) segment.
    pub copies: Vec<Placement>,
    /// Output ranges filled with trap instructions.
    pub traps: Vec<(u64, u64)>,
    /// Output offset and address of a program header table that grows, if any.
    pub phdr_table: Option<(u64, u64)>,
    /// Whether that table had to leave e_phoff for the end of what stays, in a gap
    /// between sections, where libelf-based tools (dwz, eu-strip) zero it: nothing
    /// after it could make room ([`table_room`]).
    pub phdr_table_displaced: bool,
    /// Output offset where the non-loaded tail (sections, section headers) begins.
    pub tail_start: u64,
    /// File displacement of the code.
    pub df: u64,
    /// Bytes of executable sections inside whole huge-page windows of the new layout.
    pub covered_code: u64,
    /// Bytes of read-only sections that share the code's first huge-page window and so
    /// become executable (a rodata-first shift the exposure limit allows); 0 otherwise.
    pub exposed: u64,
    /// Those sections, with their bytes that become executable.
    pub exposed_sections: Vec<(String, u64)>,
}

/// A plan's outcome per mode, for `inspect`.
pub struct Candidates {
    /// The shift plan, or why not.
    pub shift: Result<Plan>,
    /// The alignment-only plan, or why not.
    pub align: Result<Plan>,
}

fn refused(reason: Reason, detail: impl Into<String>) -> Error {
    Error::new(reason, detail)
}

/// A huge-page size as messages name it: "2 MiB", or "0x10000-byte" below 1 MiB.
fn window_name(hp: u64) -> String {
    if hp % (1 << 20) == 0 {
        format!("{} MiB", hp >> 20)
    } else {
        format!("{hp:#x}-byte")
    }
}

/// Checks shared by every mode: threshold and whether the work is already done.
pub fn precheck(an: &Analysis, huge_page: u64, threshold: u64) -> Result<()> {
    let x = an.exec_load();
    if x.p_memsz < threshold {
        return Err(refused(
            Reason::BelowThreshold,
            format!("executable segment is {} bytes, below the threshold of {threshold}", x.p_memsz),
        ));
    }
    let fixed = an.kind.fixed_addresses();
    if huge_placed(x, fixed, huge_page) {
        let how = if fixed { "at its fixed address" } else { "with its p_align" };
        // The probe's windows (windows.rs): none means placed, yet nothing to gain.
        if huge_windows(&an.loads, fixed, huge_page).is_empty() {
            return Err(refused(
                Reason::NoWholeWindow,
                format!(
                    "executable segment is placed {how} with its file offset congruent to its address, \
                     but its code spans no whole {} window",
                    window_name(huge_page)
                ),
            ));
        }
        return Err(refused(
            Reason::AlreadyAligned,
            format!("executable segment is placed {how} with its file offset congruent to its address"),
        ));
    }
    Ok(())
}

/// Builds both candidate plans; a shift makes at most `exposure_limit` bytes that
/// were not executable executable ([`crate::exposure`]).
pub fn candidates(elf: &Elf, an: &Analysis, huge_page: u64, exposure_limit: u64) -> Candidates {
    Candidates { shift: plan_shift(elf, an, huge_page, exposure_limit), align: plan_align(elf, an, huge_page) }
}

/// Largest alignment among what moves: segment alignments, TLS alignment and
/// section alignments. `dv` must be a multiple of it.
fn moved_alignment(elf: &Elf, an: &Analysis) -> Result<u64> {
    let mut a = an.page;
    for (l, place) in an.loads.iter().zip(&an.places) {
        if *place != LoadPlace::Stays {
            a = a.max(l.p_align);
        }
    }
    for p in elf.phdrs.iter().filter(|p| p.p_type == PT_TLS && an_moves(an, p.p_vaddr)) {
        a = a.max(p.p_align);
    }
    for s in elf.shdrs.iter().filter(|s| an.section_moves[s.index]) {
        a = a.max(s.sh_addralign);
    }
    if !a.is_power_of_two() || a > 1 << 30 {
        return Err(refused(Reason::UnsupportedLayout, format!("alignment {a:#x} of moved content is not supported")));
    }
    Ok(a)
}

fn an_moves(an: &Analysis, a: u64) -> bool {
    a >= an.move_start && a <= an.image_end
}

/// The input's geometry around the code, shared by every shift candidate.
struct Around<'e> {
    first_moved: usize,
    /// Whether the first moved load also holds what stays (it splits in two).
    split: bool,
    /// `dv` must be a multiple of this ([`moved_alignment`]).
    align: u64,
    /// The first address that moves.
    start: u64,
    /// The loads between the split point and the code (lld's read-only data).
    leading: std::ops::Range<usize>,
    code_start: u64,
    code_src: u64,
    code_end: u64,
    /// The code's end rounded up to `align`: where the executable load ends.
    t: u64,
    /// Moved read-only sections below the code (lld's .rodata, .eh_frame_hdr, .eh_frame).
    below: Vec<&'e Shdr>,
}

fn plan_shift(elf: &Elf, an: &Analysis, hp: u64, exposure_limit: u64) -> Result<Plan> {
    let g = around(elf, an)?;
    search(elf, an, hp, &g, exposure_limit)
}

/// The input's geometry around the code, or why no shift can move it.
fn around<'e>(elf: &'e Elf, an: &Analysis) -> Result<Around<'e>> {
    if an.kind.fixed_addresses() {
        return Err(refused(Reason::UnsupportedType, "an ET_EXEC has fixed addresses; only alignment can change"));
    }
    let Some(first_moved) = an.places.iter().position(|p| *p != LoadPlace::Stays).filter(|&i| i <= an.exec) else {
        return Err(refused(Reason::UnsupportedLayout, "the executable segment lies before the split point"));
    };
    hazards::check_shift(elf, an)?;
    let x = an.exec_load();
    if x.p_filesz != x.p_memsz {
        return Err(refused(Reason::UnsupportedLayout, "the executable segment has bytes not backed by the file"));
    }
    let split = an.places[first_moved] == LoadPlace::Split;
    let align = moved_alignment(elf, an)?;
    let page = an.page;
    let start = an.move_start;
    // Read-only content between the split point and the code (lld's .rodata, .eh_frame
    // before .text) moves with the code by the same dv: the code reaches it pc-relatively.
    let leading = first_moved..an.exec;
    for l in &an.loads[leading.clone()] {
        if l.p_flags & PF_W != 0 || l.p_filesz != l.p_memsz {
            return Err(refused(
                Reason::UnsupportedLayout,
                format!(
                    "{} at the split point is followed by the {} segment at {:#x} before the code",
                    an.split_section,
                    if l.p_flags & PF_W != 0 { "writable" } else { "partly file-less" },
                    l.p_vaddr
                ),
            ));
        }
    }
    let code_start = if leading.is_empty() { start } else { x.p_vaddr };
    if code_start < x.p_vaddr {
        // S lies in the gap before the code (a .tbss at the end of the load before it).
        return Err(refused(
            Reason::UnsupportedLayout,
            format!("{} at the split point {code_start:#x} lies before the executable segment", an.split_section),
        ));
    }
    let code_end = x.vend();

    // Trailing padding runs from the code's end to T; the next segment must not start before it.
    let t = align_up(code_end, align);
    if let Some(next) = an.loads.get(an.exec + 1) {
        if align_down(next.p_vaddr, next.p_align.max(page)) < t {
            return Err(refused(
                Reason::UnsupportedLayout,
                format!(
                    "the segment after the code starts at {:#x}, inside the code's last {align:#x}-aligned page",
                    next.p_vaddr
                ),
            ));
        }
    }
    let below: Vec<&Shdr> = elf
        .shdrs
        .iter()
        .filter(|s| an.section_moves[s.index] && s.sh_size > 0 && s.sh_addr < code_start)
        // Below the code, outside the executable load: data, whatever its flags say.
        .filter(|s| !s.is_tls_bss())
        .collect();
    Ok(Around {
        first_moved,
        split,
        align,
        start,
        leading,
        code_start,
        code_src: x.p_offset + (code_start - x.p_vaddr),
        code_end,
        t,
        below,
    })
}

/// The displacement search: the candidate shifts (which end of the executable load
/// sits on a huge-page boundary, how far below the code it starts) and the one that
/// puts the most code on whole windows, exposing no more than `exposure_limit`.
fn search(elf: &Elf, an: &Analysis, hp: u64, g: &Around, exposure_limit: u64) -> Result<Plan> {
    let (page, align, code_start, t) = (an.page, g.align, g.code_start, g.t);
    // The executable load runs from `lead` bytes below the code to T; `dv` puts a
    // huge-page boundary at one of its ends (T + dv, or the start) and is then raised
    // in steps that keep it there. With the code's end on a boundary, every boundary
    // lies at T minus a multiple of hp (in input addresses) whatever dv is; `lead` to
    // the one below the code makes the first window whole.
    let end_on_boundary = (hp - t % hp) % hp;
    let lead_to_boundary = (hp - (t - code_start) % hp) % hp;
    let Some(data_end) = g.below.iter().map(|s| s.vend()).max() else {
        // Nothing moved lies below the code: trap padding fills the first window.
        return checked_gain(shift_with(elf, an, hp, g, lead_to_boundary, end_on_boundary)?, g, exposure_limit, None);
    };
    // Read-only data below the code (rodata-first): nothing of it may share the
    // executable load, which therefore starts at `floor` or above. Candidates: the
    // code's end on a boundary and its start on the boundary below if the data ends
    // before that, else on the code's own first page (its first, partial window stays
    // in small pages and the data below keeps its R load); or the code's start on a
    // boundary and its last, partial window in small pages. More code on whole windows
    // wins; on a tie, the first.
    let floor = align_up(data_end, page);
    let mut safe = Vec::new();
    let first_page = align_down(code_start, page);
    if code_start.checked_sub(lead_to_boundary).is_some_and(|e| e >= floor) {
        safe.push((lead_to_boundary, end_on_boundary));
    } else if first_page >= floor {
        safe.push((code_start - first_page, end_on_boundary));
    }
    let start_boundary = align_down(code_start, align.min(hp));
    if start_boundary >= floor {
        safe.push((code_start - start_boundary, (hp - start_boundary % hp) % hp));
    }
    let mut best: Option<Plan> = None;
    for (lead, dv) in safe {
        let p = shift_with(elf, an, hp, g, lead, dv)?;
        if best.as_ref().is_none_or(|b| p.covered_code > b.covered_code) {
            best = Some(p);
        }
    }
    // The first window whole, with the read-only data that shares it made executable:
    // only as the policy's exposure_limit allows, and only if it buys more code on
    // huge pages than it exposes. No section may straddle the load's start.
    let mut lead = lead_to_boundary;
    while g.below.iter().any(|s| s.sh_addr + lead < code_start && s.vend() + lead > code_start) {
        lead += hp;
    }
    let exposing = (lead > code_start.saturating_sub(floor))
        .then(|| shift_with(elf, an, hp, g, lead, end_on_boundary))
        .transpose()?;
    if let Some(p) = exposing.as_ref().filter(|p| p.exposed <= exposure_limit) {
        if p.covered_code > best.as_ref().map_or(0, |b| b.covered_code) + p.exposed {
            best = exposing.clone();
        }
    }
    match best {
        Some(p) => checked_gain(p, g, exposure_limit, exposing.as_ref()),
        None => Err(refused(
            Reason::UnsupportedLayout,
            format!("the read-only data below the code ends at {data_end:#x}, in the code's first page"),
        )),
    }
}

/// The plan, or no-gain if it puts no code on a whole window; `exposing` is the plan
/// that would have, by making read-only data executable, for the message.
fn checked_gain(p: Plan, g: &Around, exposure_limit: u64, exposing: Option<&Plan>) -> Result<Plan> {
    if p.covered_code > 0 {
        return Ok(p);
    }
    let mut detail = format!(
        "no whole huge-page window of code: {:#x} bytes of code, the executable load {:#x}-{:#x} after the shift",
        g.code_end - g.code_start,
        p.phdrs.iter().find(|l| l.is_exec()).map_or(0, |l| l.p_vaddr),
        p.phdrs.iter().find(|l| l.is_exec()).map_or(0, |l| l.vend()),
    );
    if let Some(x) = exposing.filter(|x| x.covered_code > 0) {
        let names: Vec<&str> =
            x.exposed_sections.iter().map(|(n, _)| n.as_str()).filter(|n| *n != OUTSIDE_SECTIONS).collect();
        detail = format!(
            "no whole huge-page window of code without making read-only data executable: the code's window \
             would hold {} bytes of {} (exposure_limit {exposure_limit})",
            x.exposed,
            names.join(", ")
        );
    }
    Err(refused(Reason::NoGain, detail))
}

/// The shift whose executable load starts `lead` bytes below the code, with `dv` the
/// smallest displacement congruent to `dv0` modulo max(hp, align) that clears what stays.
fn shift_with(elf: &Elf, an: &Analysis, hp: u64, g: &Around, lead: u64, dv0: u64) -> Result<Plan> {
    let page = an.page;
    // Input addresses (as distances below the code) of the lowest moved byte and of the
    // executable segment's start.
    let below_code = (g.code_start - g.start).max(lead);
    let read_only_end = g.code_start.saturating_sub(lead).max(g.start);
    let (exposed, exposed_sections) = exposed_below(an, g, read_only_end);

    // The loads of the output: what stays, the moved read-only part below the
    // executable segment, the executable segment, what follows it.
    let leading_loads: Vec<(u64, u64)> = an.loads[g.leading.clone()]
        .iter()
        .map(|l| (l.p_vaddr.max(g.start), l.vend().min(read_only_end)))
        .filter(|(from, to)| to > from)
        .collect();
    let new_load_count = an.places.iter().filter(|p| **p != LoadPlace::Moves).count()
        + leading_loads.len()
        + 1
        + (an.exec + 1..an.loads.len()).count();
    let table_size = (elf.phdrs.len() - an.loads.len() + new_load_count) as u64 * elf.class.phdr_size();
    let stay = staying_part(elf, an, g, table_size);
    let dv = displacement(g, hp, page, below_code, dv0, stay.vend);
    let moved = placements(an, g, hp, lead, below_code, dv, &stay);
    let map = AddrMap { start: g.start, end: an.image_end, dv, relocated: stay.relocated };
    let new_loads = new_loads(an, g, &stay, &moved, read_only_end, hp);
    debug_assert_eq!(new_loads.len(), new_load_count);
    let phdr_table = stay.phdr_table;
    let phdrs = rebuild_phdrs(elf, &new_loads, &map, &moved.copies, phdr_table.map(|(o, v)| (o, v, table_size)), hp)?;
    let mut plan = Plan {
        mode: Mode::Shift,
        huge_page: hp,
        map,
        phdrs,
        copies: moved.copies,
        traps: moved.traps,
        phdr_table,
        phdr_table_displaced: stay.displaced,
        tail_start: moved.tail_start,
        df: moved.df,
        covered_code: 0,
        exposed,
        exposed_sections,
    };
    plan.covered_code = covered_code(elf, an, &plan);
    Ok(plan)
}

/// What of the leading loads lies in the executable load, from `read_only_end` to the
/// code: its bytes, and per section (and the bytes between sections, counted as the
/// self-check counts them, [`crate::exposure`]).
fn exposed_below(an: &Analysis, g: &Around, read_only_end: u64) -> (u64, Vec<(String, u64)>) {
    let mut exposed_sections: Vec<(String, u64)> = Vec::new();
    let mut add = |name: &str, n: u64| match exposed_sections.iter_mut().find(|(s, _)| s == name) {
        Some((_, b)) => *b += n,
        None if n > 0 => exposed_sections.push((name.to_owned(), n)),
        None => {}
    };
    let mut exposed = 0;
    for l in &an.loads[g.leading.clone()] {
        let (from, to) = (l.p_vaddr.max(read_only_end), l.vend().min(g.code_start));
        if to <= from {
            continue;
        }
        exposed += to - from;
        let mut inside: Vec<&&Shdr> = g.below.iter().filter(|s| s.sh_addr < to && s.vend() > from).collect();
        inside.sort_by_key(|s| (s.sh_addr, s.index));
        let mut at = from;
        for s in inside {
            add(OUTSIDE_SECTIONS, s.sh_addr.saturating_sub(at));
            add(&s.name, s.vend().min(to) - s.sh_addr.max(from));
            at = at.max(s.vend().min(to));
        }
        add(OUTSIDE_SECTIONS, to.saturating_sub(at));
    }
    (exposed, exposed_sections)
}

/// What stays of a shift: the prefix of the file up to the first moved byte, and the
/// program header table.
struct Staying {
    /// Copies of the staying bytes (and of metadata relocated behind them).
    copies: Vec<Placement>,
    /// One past the last staying file byte and address.
    fend: u64,
    vend: u64,
    /// Output offset and address of a table that grows.
    phdr_table: Option<(u64, u64)>,
    /// Metadata moved behind what stays to make room for it.
    relocated: Relocated,
    /// Whether the table had to leave e_phoff ([`Plan::phdr_table_displaced`]).
    displaced: bool,
}

/// The staying part. When the first moved segment is split, the table of
/// `table_size` bytes gets the new load's header: it grows at e_phoff where the
/// sections after it can make room ([`table_room`]), else it moves behind what stays
/// ([`Plan::phdr_table_displaced`]).
fn staying_part(elf: &Elf, an: &Analysis, g: &Around, table_size: u64) -> Staying {
    let phdr_size = elf.class.phdr_size();
    let first = an.loads[g.first_moved];
    let start_src = first.p_offset + g.start.saturating_sub(first.p_vaddr);
    let mut stay = Staying {
        copies: vec![Placement { src: 0, len: start_src, dst: 0 }],
        fend: start_src,
        vend: an.loads[..g.first_moved].iter().map(Phdr::vend).max().unwrap_or(0),
        phdr_table: None,
        relocated: Relocated::default(),
        displaced: false,
    };
    if !g.split {
        return stay;
    }
    let vaddr_of = |off: u64| off - first.p_offset + first.p_vaddr;
    stay.vend = stay.vend.max(vaddr_of(start_src));
    let phoff = elf.ehdr.e_phoff;
    let grows = table_size > elf.phdrs.len() as u64 * phdr_size;
    match table_room(elf, &first, start_src, table_size) {
        Some(room) if grows => {
            stay.phdr_table = Some((phoff, vaddr_of(phoff)));
            let mut rest = phoff + table_size;
            stay.copies = vec![Placement { src: 0, len: phoff, dst: 0 }];
            if let Some((r, block)) = room {
                stay.relocated = r;
                stay.copies.push(block);
                rest = rest.max(block.src + block.len);
                stay.fend = block.dst + block.len;
                stay.vend = stay.vend.max(vaddr_of(stay.fend));
            }
            stay.copies.push(Placement { src: rest, len: start_src.saturating_sub(rest), dst: rest });
        }
        Some(_) => {}
        None => {
            stay.displaced = true;
            let off = align_up(start_src, elf.class.word());
            stay.phdr_table = Some((off, vaddr_of(off)));
            stay.fend = off + table_size;
            stay.vend = vaddr_of(off) + table_size;
        }
    }
    stay
}

/// dv: congruent to `dv0` and a multiple of the moved alignment; the smallest such dv
/// whose lowest moved page (`below_code` under the code) clears what stays.
fn displacement(g: &Around, hp: u64, page: u64, below_code: u64, dv0: u64, stay_vend: u64) -> u64 {
    let step = g.align.max(hp);
    let mut dv = dv0;
    while (g.code_start + dv)
        .checked_sub(below_code)
        .is_none_or(|low| align_down(low, page) < align_up(stay_vend, page))
    {
        dv += step;
    }
    dv
}

/// Where the moved bytes go in the output file.
struct Moved {
    /// What stays's copies, then the leading loads', the code's and the following loads'.
    copies: Vec<Placement>,
    /// Trap padding: what of the executable load no copy fills.
    traps: Vec<(u64, u64)>,
    /// The executable load: its addresses and its file offset.
    window_start: u64,
    window_end: u64,
    file_start: u64,
    /// The displacement.
    dv: u64,
    /// Output offset of each load after the code.
    following: Vec<u64>,
    /// Where the non-loaded tail begins.
    tail_start: u64,
    /// File displacement of the code.
    df: u64,
}

impl Moved {
    /// The output offset of moved input address `a`.
    fn offset_of(&self, a: u64) -> u64 {
        a + self.dv + self.file_start - self.window_start
    }
}

/// Placements and traps. Moved bytes keep their distances in the file too (output
/// offset = address minus a constant), at offsets congruent to their addresses modulo
/// hp, the lowest one after what stays; the loads after the code follow, each at an
/// offset congruent to its address.
fn placements(an: &Analysis, g: &Around, hp: u64, lead: u64, below_code: u64, dv: u64, stay: &Staying) -> Moved {
    let page = an.page;
    let window_start = g.code_start + dv - lead;
    let window_end = g.t + dv;
    let lowest = stay.fend + (below_code - lead);
    let file_start = lowest + (window_start % hp + hp - lowest % hp) % hp;
    let out_off = |a: u64| a + dv + file_start - window_start;
    let code_dst = out_off(g.code_start);
    let mut copies = stay.copies.clone();
    for l in &an.loads[g.leading.clone()] {
        let from = l.p_vaddr.max(g.start);
        copies.push(Placement { src: l.p_offset + (from - l.p_vaddr), len: l.vend() - from, dst: out_off(from) });
    }
    copies.push(Placement { src: g.code_src, len: g.code_end - g.code_start, dst: code_dst });
    let window_file_end = file_start + (window_end - window_start);
    let traps = gaps(&copies, file_start, window_file_end);
    let mut cursor = window_file_end;
    let mut following = Vec::new();
    for l in &an.loads[an.exec + 1..] {
        let dst = place_after(cursor, l, page);
        copies.push(Placement { src: l.p_offset, len: l.p_filesz, dst });
        cursor = cursor.max(dst + l.p_filesz);
        following.push(dst);
    }
    Moved {
        copies,
        traps,
        window_start,
        window_end,
        file_start,
        dv,
        following,
        tail_start: cursor,
        df: code_dst - g.code_src,
    }
}

/// The new loads, in address order: what stays (a split load keeps its staying part,
/// read-only), the leading loads' moved read-only parts below the executable load,
/// the executable load on its window, the loads after it moved by dv.
fn new_loads(an: &Analysis, g: &Around, stay: &Staying, moved: &Moved, read_only_end: u64, hp: u64) -> Vec<Phdr> {
    let dv = moved.dv;
    let mut new_loads = Vec::new();
    for (i, l) in an.loads.iter().enumerate() {
        match an.places[i] {
            LoadPlace::Stays => new_loads.push(*l),
            LoadPlace::Split => {
                let filesz = stay.fend - l.p_offset;
                let memsz = stay.vend - l.p_vaddr;
                new_loads.push(Phdr { p_flags: PF_R, p_filesz: filesz, p_memsz: memsz, ..*l });
            }
            LoadPlace::Moves => {}
        }
        if g.leading.contains(&i) {
            let (from, to) = (l.p_vaddr.max(g.start), l.vend().min(read_only_end));
            if to > from {
                new_loads.push(Phdr {
                    p_offset: moved.offset_of(from),
                    p_vaddr: from + dv,
                    p_paddr: l.p_paddr.wrapping_add(from - l.p_vaddr + dv),
                    p_filesz: to - from,
                    p_memsz: to - from,
                    ..*l
                });
            }
        } else if i == an.exec {
            let (start, end) = (moved.window_start, moved.window_end);
            new_loads.push(Phdr {
                p_type: PT_LOAD,
                p_flags: l.p_flags,
                p_offset: moved.file_start,
                p_vaddr: start,
                p_paddr: start.wrapping_add(l.p_paddr.wrapping_sub(l.p_vaddr)),
                p_filesz: end - start,
                p_memsz: end - start,
                p_align: hp,
            });
        } else if i > an.exec {
            let dst = moved.following[i - an.exec - 1];
            new_loads.push(Phdr { p_offset: dst, p_vaddr: l.p_vaddr + dv, p_paddr: l.p_paddr.wrapping_add(dv), ..*l });
        }
    }
    new_loads
}

/// Room for a program header table of `table_size` bytes at e_phoff, in the load
/// `first` whose bytes from `start_src` on move. The sections that follow the table
/// are loader metadata (`.interp`, notes, hash and symbol tables, version tables,
/// dynamic relocations: [`is_loader_metadata`]): only program headers, section
/// headers and `.dynamic` pointers (and symbols, DWARF and relocations, which all
/// follow the address map) refer to them; code that refers to them pc-relatively
/// already refuses the shift ([`crate::hazards`]). As few of them as make room move
/// behind what stays, together, each keeping its alignment. `Some(None)`: the table
/// fits without moving anything; `Some(Some(..))`: it fits once those sections move
/// (their address range and the placement of their bytes); `None`: it does not fit.
fn table_room(elf: &Elf, first: &Phdr, start_src: u64, table_size: u64) -> Option<Option<(Relocated, Placement)>> {
    let phoff = elf.ehdr.e_phoff;
    let old_end = phoff + elf.phdrs.len() as u64 * elf.class.phdr_size();
    let new_end = phoff + table_size;
    if phoff < first.p_offset || old_end > start_src || new_end > start_src {
        return None;
    }
    let movable =
        |s: &Shdr| is_loader_metadata(s) && s.sh_flags & (SHF_WRITE | SHF_EXECINSTR) == 0 && s.sh_type != SHT_NOBITS;
    let mut after: Vec<&Shdr> =
        elf.shdrs[1..].iter().filter(|s| s.is_alloc() && s.sh_offset >= old_end && s.sh_offset < start_src).collect();
    after.sort_by_key(|s| (s.sh_offset, s.index));
    if after.first().is_none_or(|s| s.sh_offset >= new_end) {
        return Some(None);
    }
    // A header other than a load describing the last section taken and the next one
    // (one PT_NOTE over several notes) takes both.
    let shares_header = |a: &Shdr, b: &Shdr| {
        elf.phdrs.iter().filter(|p| p.p_type != PT_LOAD && p.p_type != PT_PHDR && p.p_filesz > 0).any(|p| {
            let covers = |s: &Shdr| s.sh_offset >= p.p_offset && s.sh_offset < p.p_offset + p.p_filesz;
            covers(a) && covers(b)
        })
    };
    let mut taken: Vec<&Shdr> = Vec::new();
    for s in after {
        if s.sh_offset >= new_end && taken.last().is_none_or(|t| !shares_header(t, s)) {
            break;
        }
        if !movable(s) {
            return None;
        }
        taken.push(s);
    }
    let head = taken.first()?;
    let (from_off, to_off) = (head.sh_offset, taken.iter().map(|s| s.fend()).max().unwrap_or(head.sh_offset));
    // Within one load an address is its offset plus a constant; the sections keep it.
    let bias = first.p_vaddr.wrapping_sub(first.p_offset);
    if taken.iter().any(|s| s.sh_addr != s.sh_offset.wrapping_add(bias)) {
        return None;
    }
    // Every other header describing bytes there must describe only those bytes.
    let mut align = taken.iter().map(|s| s.sh_addralign.max(1)).max().unwrap_or(1);
    for p in elf.phdrs.iter().filter(|p| p.p_type != PT_LOAD && p.p_type != PT_PHDR && p.p_filesz > 0) {
        let (a, b) = (p.p_offset, p.p_offset + p.p_filesz);
        if a < to_off && b > from_off {
            if a < from_off || b > to_off {
                return None;
            }
            align = align.max(p.p_align.max(1));
        }
    }
    if !align.is_power_of_two() || align > first.p_align.max(1) {
        return None;
    }
    let dst = from_off + align_up(start_src - from_off, align);
    let delta = dst - from_off;
    let from = from_off.wrapping_add(bias);
    Some(Some((
        Relocated { from, to: from + (to_off - from_off), delta },
        Placement { src: from_off, len: to_off - from_off, dst },
    )))
}

/// The ranges of `[from, to)` that no copy fills, in order.
fn gaps(copies: &[Placement], from: u64, to: u64) -> Vec<(u64, u64)> {
    let mut filled: Vec<(u64, u64)> =
        copies.iter().map(|c| (c.dst.max(from), (c.dst + c.len).min(to))).filter(|(a, b)| b > a).collect();
    filled.sort_unstable();
    let mut out = Vec::new();
    let mut at = from;
    for (a, b) in filled {
        if a > at {
            out.push((at, a - at));
        }
        at = at.max(b);
    }
    if to > at {
        out.push((at, to - at));
    }
    out
}

fn plan_align(elf: &Elf, an: &Analysis, hp: u64) -> Result<Plan> {
    let x = an.exec_load();
    let page = an.page;
    // The smallest file displacement that makes the code's offset congruent to its address.
    let mut d = (x.p_vaddr % hp + hp - x.p_offset % hp) % hp;
    if d == 0 && an.kind.fixed_addresses() {
        return Err(refused(
            Reason::NoGain,
            "the executable's code offset is already congruent to its fixed address; rewriting gains nothing",
        ));
    }
    // The loader maps the code's first and last page whole. lld starts and ends the code
    // mid-page, the file bytes around it being the end of .eh_frame and the start of the
    // next load, which the input mapped executable that way. In the output those bytes
    // are trap padding inside the load (the code's file range moved: what shares its
    // pages now is new), with pages of its own in the file.
    let head = x.p_offset % page;
    let tail = if x.p_filesz == x.p_memsz { align_up(x.fend(), page) - x.fend() } else { 0 };
    if head > 0 && d == 0 {
        d = hp; // room for the padding before the code
    }
    let shares_page = |l: &Phdr| {
        align_down(l.p_vaddr, page) < align_up(x.vend(), page) && align_down(x.p_vaddr, page) < align_up(l.vend(), page)
    };
    if let Some(l) = an.loads.iter().enumerate().find(|&(i, l)| i != an.exec && shares_page(l)).map(|(_, l)| l) {
        return Err(refused(
            Reason::UnsupportedLayout,
            format!("the segment at {:#x} shares a page with the executable segment at {:#x}", l.p_vaddr, x.p_vaddr),
        ));
    }
    let mut copies = vec![Placement { src: 0, len: x.p_offset, dst: 0 }];
    let mut traps = Vec::new();
    let mut cursor = x.p_offset;
    let mut new_loads = Vec::new();
    for (i, l) in an.loads.iter().enumerate() {
        if i < an.exec {
            new_loads.push(*l);
            continue;
        }
        let dst = if i == an.exec { x.p_offset + d } else { place_after(cursor, l, page) };
        copies.push(Placement { src: l.p_offset, len: l.p_filesz, dst });
        cursor = cursor.max(dst + l.p_filesz);
        if i != an.exec {
            new_loads.push(Phdr { p_offset: dst, ..*l });
            continue;
        }
        traps.extend([(dst - head, head), (cursor, tail)].into_iter().filter(|t| t.1 > 0));
        cursor += tail;
        new_loads.push(Phdr {
            p_offset: dst - head,
            p_vaddr: l.p_vaddr - head,
            p_paddr: l.p_paddr.wrapping_sub(head),
            p_filesz: l.p_filesz + head + tail,
            p_memsz: l.p_memsz + head + tail,
            ..*l
        });
    }
    let map = AddrMap::default();
    let phdrs = rebuild_phdrs(elf, &new_loads, &map, &copies, None, hp)?;
    let mut plan = Plan {
        mode: Mode::Align,
        huge_page: hp,
        map,
        phdrs,
        copies,
        traps,
        phdr_table: None,
        phdr_table_displaced: false,
        tail_start: cursor,
        df: d,
        covered_code: 0,
        exposed: 0,
        exposed_sections: Vec::new(),
    };
    plan.covered_code = covered_code(elf, an, &plan);
    if plan.covered_code == 0 {
        return Err(refused(Reason::NoGain, "no whole huge-page window lies inside the executable segment"));
    }
    Ok(plan)
}

/// The lowest offset at or after `cursor` congruent to the load's own offset modulo
/// its alignment, so the segment's offset stays congruent to its address.
fn place_after(cursor: u64, l: &Phdr, page: u64) -> u64 {
    let a = l.p_align.max(page);
    if cursor <= l.p_offset {
        return l.p_offset;
    }
    l.p_offset + align_up(cursor - l.p_offset, a)
}

/// Maps an input file offset through the copies.
pub fn map_offset(copies: &[Placement], off: u64) -> Option<u64> {
    copies.iter().find(|c| off >= c.src && off < c.src + c.len).map(|c| off - c.src + c.dst)
}

/// The full new program header table: the new loads in place of the old ones (the
/// split load becomes two), other headers moved with what they describe.
fn rebuild_phdrs(
    elf: &Elf,
    new_loads: &[Phdr],
    map: &AddrMap,
    copies: &[Placement],
    table: Option<(u64, u64, u64)>,
    hp: u64,
) -> Result<Vec<Phdr>> {
    let mut out = Vec::with_capacity(elf.phdrs.len() + 1);
    let mut loads_emitted = false;
    for p in &elf.phdrs {
        match (p.p_type, table) {
            (PT_LOAD, _) => {
                // All loads, in address order, go where the first one was.
                if !loads_emitted {
                    for l in new_loads {
                        let congruent = l.p_offset % hp == l.p_vaddr % hp;
                        out.push(Phdr { p_align: if congruent { l.p_align.max(hp) } else { l.p_align }, ..*l });
                    }
                    loads_emitted = true;
                }
            }
            (PT_PHDR, Some((off, vaddr, size))) => {
                out.push(Phdr { p_offset: off, p_vaddr: vaddr, p_paddr: vaddr, p_filesz: size, p_memsz: size, ..*p });
            }
            (PT_GNU_STACK, _) => out.push(*p),
            _ => {
                let vaddr = map.map(p.p_vaddr);
                let offset = if p.p_filesz > 0 {
                    map_offset(copies, p.p_offset).ok_or_else(|| {
                        Error::new(
                            Reason::UnsupportedLayout,
                            format!(
                                "segment of type {:#x} at offset {:#x} is not inside a PT_LOAD",
                                p.p_type, p.p_offset
                            ),
                        )
                    })?
                } else {
                    // No file bytes: stay consistent with the load that holds the address.
                    new_loads
                        .iter()
                        .find(|l| vaddr >= l.p_vaddr && vaddr <= l.vend())
                        .map_or(p.p_offset, |l| l.p_offset + (vaddr - l.p_vaddr))
                };
                out.push(Phdr {
                    p_offset: offset,
                    p_vaddr: vaddr,
                    p_paddr: p.p_paddr.wrapping_add(vaddr - p.p_vaddr),
                    ..*p
                });
            }
        }
    }
    Ok(out)
}

/// Bytes of executable sections that end up inside whole huge-page windows of the
/// planned program headers.
fn covered_code(elf: &Elf, an: &Analysis, plan: &Plan) -> u64 {
    let runs = huge_windows(&plan.phdrs, an.kind.fixed_addresses(), plan.huge_page);
    let mapped =
        an.exec_sections(elf).map(|s| (plan.map.map(s.sh_addr), plan.map.map(s.sh_addr).saturating_add(s.sh_size)));
    covered(&runs, mapped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::analyse;
    use crate::testelf::{Arrangement, Dso};

    const HP: u64 = 2 << 20;

    fn plans(dso: &Dso, hp: u64) -> (Vec<u8>, Candidates) {
        plans_with(dso, hp, 0)
    }

    fn plans_with(dso: &Dso, hp: u64, exposure_limit: u64) -> (Vec<u8>, Candidates) {
        let data = dso.build().data;
        let elf = Elf::parse(&data).unwrap();
        let an = analyse(&elf).unwrap();
        let c = candidates(&elf, &an, hp, exposure_limit);
        drop(elf);
        (data, c)
    }

    const PAGE: u64 = 0x1000;

    /// lld's layout with 3 MiB of read-only data below `code` bytes of code.
    fn lld(code: u64) -> Dso {
        let mut dso = Dso::new(Arrangement::RodataFirst, code);
        dso.rodata_size = 3 << 20;
        dso.contiguous = true;
        dso
    }

    fn exec_load(p: &Plan) -> Phdr {
        *p.phdrs.iter().find(|p| p.is_exec()).unwrap()
    }

    /// A separate-code DSO with 0x2ff0 bytes of code at address and offset 0x1000, in
    /// the page after the metadata's R load.
    fn separate_code() -> (crate::testelf::Built, Vec<u8>) {
        let built = Dso::new(Arrangement::SeparateCode, 0x2ff0).build();
        let data = built.data.clone();
        let text = built.sec(".text");
        assert_eq!((text.addr, text.offset), (0x1000, 0x1000));
        (built, data)
    }

    #[test]
    fn the_staying_part_is_the_prefix_and_a_table_that_grows_keeps_e_phoff() {
        let data = separate_code().1;
        let elf = Elf::parse(&data).unwrap();
        let an = analyse(&elf).unwrap();
        // The first load stays whole: the first 0x1000 bytes, copied where they are.
        let stay = staying_part(&elf, &an, &around(&elf, &an).unwrap(), 0);
        assert_eq!(stay.copies, [Placement { src: 0, len: 0x1000, dst: 0 }]);
        let metadata = an.loads[0];
        assert_eq!((metadata.p_vaddr, an.places[0]), (0, LoadPlace::Stays));
        assert_eq!((stay.fend, stay.vend, stay.phdr_table, stay.displaced), (0x1000, metadata.vend(), None, false));
        // Text in the first load: the load splits, the table grows by one header where
        // it is (e_phoff 64, address 64 in a load mapped at 0), the bytes before it stay.
        let data = Dso::new(Arrangement::TextInFirst, 0x3000).build().data;
        let elf = Elf::parse(&data).unwrap();
        let an = analyse(&elf).unwrap();
        let g = around(&elf, &an).unwrap();
        let grown = (elf.phdrs.len() as u64 + 1) * 56;
        let stay = staying_part(&elf, &an, &g, grown);
        assert_eq!((stay.phdr_table, stay.copies[0]), (Some((64, 64)), Placement { src: 0, len: 64, dst: 0 }));
        assert!(!stay.displaced && stay.relocated.from >= 64 + grown - 56 && stay.relocated.delta > 0);
    }

    #[test]
    fn the_displacement_is_the_first_congruent_one_that_clears_what_stays() {
        let g = Around {
            first_moved: 1,
            split: false,
            align: PAGE,
            start: 0x1000,
            leading: 1..1,
            code_start: 0x1000,
            code_src: 0x1000,
            code_end: 0x4000,
            t: 0x4000,
            below: Vec::new(),
        };
        // dv0 puts the code's end (0x4000) on 2 MiB: 0x1fc000; the code then starts at
        // 0x1fd000, above what stays (to 0x1000).
        assert_eq!(displacement(&g, HP, PAGE, 0, HP - 0x4000, 0x1000), 0x1f_c000);
        // What stays reaching 0x1fe000 takes one step of max(hp, align) more.
        assert_eq!(displacement(&g, HP, PAGE, 0, HP - 0x4000, 0x1f_e000), 0x3f_c000);
        let wide = Around { align: 0x40_0000, leading: 1..1, below: Vec::new(), ..g };
        assert_eq!(displacement(&wide, HP, PAGE, 0, HP - 0x4000, 0x1f_e000), 0x5f_c000);
        // The executable load reaching 0x1fd000 below the code: its lowest page must clear too.
        assert_eq!(displacement(&g, HP, PAGE, 0x1f_d000, HP - 0x4000, 0x1000), 0x3f_c000);
    }

    #[test]
    fn placements_put_the_code_on_its_window_with_traps_around_it_and_the_rest_after() {
        let (built, data) = separate_code();
        let elf = Elf::parse(&data).unwrap();
        let an = analyse(&elf).unwrap();
        let g = around(&elf, &an).unwrap();
        // The executable load is to run from the 2 MiB boundary below the code to the
        // one its end (t = 0x4000) is moved onto: lead = hp - 0x3000, dv0 = hp - 0x4000.
        // That would put the load's start at 0, on what stays: one step more,
        // dv = 2 hp - 0x4000, the window [hp, 2 hp) in addresses and in the file.
        let (lead, dv) = (HP - 0x3000, 2 * HP - 0x4000);
        let stay = staying_part(&elf, &an, &g, 0);
        assert_eq!(displacement(&g, HP, PAGE, lead, HP - 0x4000, stay.vend), dv);
        let m = placements(&an, &g, HP, lead, lead, dv, &stay);
        assert_eq!((m.window_start, m.window_end, m.file_start), (HP, 2 * HP, HP));
        let code = Placement { src: 0x1000, len: 0x2ff0, dst: 2 * HP - 0x3000 };
        assert_eq!((m.copies[1], m.df), (code, 2 * HP - 0x4000));
        assert_eq!(m.traps, [(HP, HP - 0x3000), (2 * HP - 0x10, 0x10)]);
        // The loads after the code follow the window, each at an offset congruent to its
        // address modulo the page.
        let after: Vec<Phdr> = an.loads[an.exec + 1..].to_vec();
        assert_eq!(m.following[0], 2 * HP + after[0].p_offset % PAGE);
        assert_eq!(m.copies[2], Placement { src: after[0].p_offset, len: after[0].p_filesz, dst: m.following[0] });
        let last = after.last().unwrap();
        assert_eq!(m.tail_start, m.following[after.len() - 1] + last.p_filesz);

        // The new loads: the R load as it was, the window, the rest moved by dv.
        let loads = new_loads(&an, &g, &stay, &m, g.code_start, HP);
        assert_eq!(loads[0], an.loads[0]);
        let x = loads[1];
        assert_eq!(
            (x.p_flags, x.p_offset, x.p_vaddr, x.p_filesz, x.p_memsz, x.p_align),
            (PF_R | PF_X, HP, HP, HP, HP, HP)
        );
        for (i, (new, old)) in loads[2..].iter().zip(&after).enumerate() {
            assert_eq!((new.p_vaddr, new.p_offset, new.p_memsz), (old.p_vaddr + dv, m.following[i], old.p_memsz));
        }
        assert_eq!(built.addr(".text") + dv, 2 * HP - 0x3000);
    }

    #[test]
    fn shift_ends_the_code_on_a_huge_page_boundary() {
        for arrangement in [Arrangement::SeparateCode, Arrangement::TextInFirst] {
            let dso = Dso::new(arrangement, 0x3000);
            let built = dso.build();
            let (_, c) = plans(&dso, HP);
            let p = c.shift.unwrap();
            let text = built.addr(".text");
            let x = exec_load(&p);
            assert_eq!((x.p_vaddr % HP, x.p_offset % HP, x.p_memsz % HP, x.p_align), (0, 0, 0, HP));
            assert!(x.p_vaddr <= text + p.map.dv && text + 0x3000 + p.map.dv <= x.vend());
            // The next page of what moved starts on the boundary the code ends on.
            let last_moved = if arrangement == Arrangement::SeparateCode { ".text" } else { ".eh_frame" };
            let end = built.sec(last_moved).addr + built.sec(last_moved).size;
            assert_eq!(align_up(end, 0x1000) + p.map.dv, x.vend(), "{arrangement:?}");
            assert_eq!((p.map.dv % 0x1000, p.df % 0x1000), (0, 0));
            assert_eq!(p.covered_code, 0x3000);
            assert_eq!(p.map.start, text);
        }
    }

    #[test]
    fn shift_moves_by_a_multiple_of_the_largest_moved_alignment() {
        let hp = 0x10000;
        let mut dso = Dso::new(Arrangement::SeparateCode, 0x3000);
        dso.rodata_align = 0x40000;
        let p = plans(&dso, hp).1.shift.unwrap();
        assert_eq!((p.map.dv % 0x40000, p.df % hp), (0, 0), "dv {:#x}, df {:#x}", p.map.dv, p.df);
        assert_eq!(exec_load(&p).vend() % hp, 0);
        let mut small = Dso::new(Arrangement::SeparateCode, 0x3000);
        small.rodata_align = 16;
        let q = plans(&small, hp).1.shift.unwrap();
        assert!(q.map.dv < p.map.dv && q.map.dv % 0x1000 == 0);
    }

    #[test]
    fn align_changes_no_address() {
        let hp = 0x10000;
        let dso = Dso::new(Arrangement::RodataFirst, 0x30000);
        let (data, c) = plans(&dso, hp);
        let elf = Elf::parse(&data).unwrap();
        let p = c.align.unwrap();
        assert_eq!(p.map.dv, 0);
        assert_eq!(p.phdrs.len(), elf.phdrs.len());
        for (old, new) in elf.phdrs.iter().zip(&p.phdrs) {
            assert_eq!(
                (old.p_type, old.p_vaddr, old.p_memsz, old.p_filesz),
                (new.p_type, new.p_vaddr, new.p_memsz, new.p_filesz)
            );
        }
        // lld puts the code one page above its offset: the file moves it by one page.
        let x = exec_load(&p);
        assert_eq!((p.df, x.p_offset % hp, x.p_align), (0x1000, x.p_vaddr % hp, hp));
        assert!(p.covered_code >= hp && p.covered_code < 0x30000);
        // The metadata before the code stays where it was.
        assert_eq!(p.copies[0], Placement { src: 0, len: elf.phdrs[1].p_offset, dst: 0 });
    }

    #[test]
    fn rodata_first_moves_its_read_only_data_with_the_code() {
        // Code of whole windows: the read-only data gets a load of its own below them.
        let dso = Dso::new(Arrangement::RodataFirst, 0x30000);
        let built = dso.build();
        let p = plans(&dso, 0x10000).1.shift.unwrap();
        let rodata = built.addr(".rodata");
        assert_eq!((p.map.start, p.covered_code, p.exposed), (rodata, 0x30000, 0));
        let loads: Vec<&Phdr> = p.phdrs.iter().filter(|l| l.p_type == PT_LOAD).collect();
        assert_eq!(loads.iter().map(|l| l.p_flags).collect::<Vec<_>>(), [PF_R, PF_R, PF_R | PF_X, PF_R | PF_W]);
        assert_eq!(loads[1].p_vaddr, rodata + p.map.dv);
        assert!(loads[1].vend() <= loads[2].p_vaddr && loads[0].vend() < loads[1].p_vaddr);
        // The code keeps its distance to the data it reaches pc-relatively.
        assert_eq!(exec_load(&p).p_vaddr - loads[1].p_vaddr, built.addr(".text") - rodata);
    }

    #[test]
    fn rodata_first_code_short_of_a_window_does_not_shift() {
        // The code's only window would hold the end of the read-only data: no shift puts
        // code on a huge page without making that executable, and even where the limit
        // allows it, it would expose more than it gains.
        for limit in [0, 4 << 20] {
            let e = plans_with(&lld(0x3000), HP, limit).1.shift.unwrap_err();
            assert_eq!(e.reason, Reason::NoGain, "{e}");
            assert!(e.detail.contains("without making read-only data executable"), "{e}");
            assert!(e.detail.contains(".rodata, .eh_frame_hdr, .eh_frame"), "{e}");
        }
    }

    #[test]
    fn rodata_first_code_longer_than_a_window_shifts_without_exposing() {
        let dso = lld(0x280000);
        let built = dso.build();
        let (text, k) = (built.addr(".text"), built.addr(".text") % PAGE);
        let p = plans(&dso, HP).1.shift.unwrap();
        let x = exec_load(&p);
        // Whole windows only: the last, partial one stays in small pages (there the
        // padding would take 0x1000 - k bytes of the window, at the start k).
        assert_eq!((p.exposed, p.covered_code), (0, HP - k));
        let loads: Vec<&Phdr> = p.phdrs.iter().filter(|l| l.p_type == PT_LOAD).collect();
        assert_eq!(loads.iter().map(|l| l.p_flags).collect::<Vec<_>>(), [PF_R, PF_R, PF_R | PF_X, PF_R | PF_W]);
        // The load starts at the code's first page, on a boundary; the read-only data
        // keeps its R load below it, at the same distance from the code.
        let dv = p.map.dv;
        assert_eq!((x.p_vaddr, x.p_vaddr % HP, x.p_offset % HP), (align_down(text, PAGE) + dv, 0, 0));
        assert!(x.vend() % HP != 0);
        assert_eq!(loads[1].p_vaddr, built.addr(".rodata") + dv);
        for name in [".rodata", ".eh_frame_hdr", ".eh_frame"] {
            let s = built.sec(name);
            assert!(s.addr + s.size + dv <= loads[1].vend() && loads[1].vend() <= x.p_vaddr, "{name}");
        }
    }

    #[test]
    fn rodata_first_leaves_the_partial_window_where_less_code_is() {
        let mut dso = lld(HP);
        let k = dso.build().addr(".text") % PAGE; // where in its page the code starts
        assert!(k > 0x10 && k < 0xf00, "{k:#x}");
        // The code ends 0x100 into a page: the trailing padding (0xf00) would take more
        // of a whole window than the leading one (k), so the code starts on a boundary.
        dso.text_size = HP + PAGE - k + 0x100;
        let p = plans(&dso, HP).1.shift.unwrap();
        let x = exec_load(&p);
        assert_eq!((x.p_vaddr % HP, x.vend() % HP != 0, p.covered_code), (0, true, HP - k));
        // It ends 0x10 short of a page: the code ends on a boundary.
        dso.text_size = HP + 2 * PAGE - k - 0x10;
        let p = plans(&dso, HP).1.shift.unwrap();
        let x = exec_load(&p);
        assert_eq!((x.p_vaddr % HP != 0, x.vend() % HP, p.covered_code), (true, 0, HP - 0x10));
        assert_eq!(p.exposed, 0);
    }

    #[test]
    fn exposure_only_within_the_limit_and_when_it_buys_more_code() {
        // Code two windows but 32 KiB long above a little read-only data: making the
        // code's first window whole exposes that data, for a window more of code. (A
        // large .rodata could not be exposed in part: no section may straddle the
        // executable load's start.)
        let dso = Dso::new(Arrangement::RodataFirst, 2 * HP - 0x8000);
        let built = dso.build();
        let safe = plans(&dso, HP).1.shift.unwrap();
        assert_eq!((safe.exposed, safe.covered_code), (0, HP));
        let p = plans_with(&dso, HP, 0x1000).1.shift.unwrap();
        assert_eq!(p.covered_code, 2 * HP - 0x8000);
        let names: Vec<&str> = p.exposed_sections.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, [".rodata", ".eh_frame_hdr", OUTSIDE_SECTIONS, ".eh_frame"]);
        let (from, to) = (built.addr(".rodata"), built.addr(".eh_frame") + built.sec(".eh_frame").size);
        assert_eq!(p.exposed, to - from);
        assert_eq!(p.exposed_sections.iter().map(|(_, b)| b).sum::<u64>(), p.exposed);
        let x = exec_load(&p);
        assert_eq!((x.p_vaddr % HP, x.vend() % HP), (0, 0));
        // A byte less allowed: the plan that exposes nothing.
        let tight = plans_with(&dso, HP, p.exposed - 1).1.shift.unwrap();
        assert_eq!((tight.exposed, tight.covered_code), (0, HP));
    }

    #[test]
    fn the_address_map_moves_relocated_metadata_by_its_own_delta() {
        let map = AddrMap {
            relocated: Relocated { from: 0x2a8, to: 0x300, delta: 0x14658 },
            ..AddrMap::shift(0x1000, 0x9000, 0x20_0000)
        };
        assert_eq!((map.map(0x2a8), map.map(0x2ff), map.map(0x300)), (0x14900, 0x14957, 0x300));
        assert_eq!((map.map(0x1000), map.map(0x9000), map.map(0x9001)), (0x20_1000, 0x20_9000, 0x9001));
        assert!(map.moves(0x2c4) && !map.moves(0x2a7));
        // No shift, nothing moves (alignment-only plans).
        let none = AddrMap { dv: 0, ..map };
        assert!(!none.moves(0x2c4) && none.map(0x2c4) == 0x2c4);
    }

    #[test]
    fn a_table_without_room_after_it_is_displaced_and_says_so() {
        let dso = Dso::new(Arrangement::TextInFirst, 0x3000);
        let grown = |data: &[u8]| {
            let elf = Elf::parse(data).unwrap();
            let an = analyse(&elf).unwrap();
            candidates(&elf, &an, HP, 0).shift.unwrap()
        };
        let mut data = dso.build().data;
        let p = grown(&data);
        assert_eq!((p.phdr_table, p.phdr_table_displaced), (Some((64, 64)), false));
        assert!(p.map.relocated.delta > 0);
        // The note that made room, made a section that is no loader metadata, is where
        // the shift starts: nothing between the table and the split point can make room,
        // so the table goes behind what stays (here right after its old self), flagged.
        let elf = Elf::parse(&data).unwrap();
        let note = elf.section(crate::testelf::NOTE).unwrap();
        let at = (elf.ehdr.e_shoff + note.index as u64 * 64 + 4) as usize;
        let old_end = elf.ehdr.e_phoff + 56 * elf.phdrs.len() as u64;
        drop(elf);
        data[at..at + 4].copy_from_slice(&SHT_PROGBITS.to_le_bytes());
        let p = grown(&data);
        assert!(p.phdr_table_displaced);
        assert_eq!(p.map.relocated, Relocated::default());
        assert_eq!(p.phdr_table.unwrap().0, old_end);
    }

    #[test]
    fn code_that_refers_to_the_headers_cannot_shift() {
        let mut dso = Dso::new(Arrangement::SeparateCode, 0x3000);
        // lea rax, [rip + disp32] whose target is the ELF header at 0.
        let text = dso.build().addr(".text");
        dso.code = [0x48, 0x8d, 0x05].to_vec();
        dso.code.extend((0u64.wrapping_sub(text + 7) as u32).to_le_bytes());
        assert_eq!(plans(&dso, HP).1.shift.unwrap_err().reason, Reason::EhdrReference);

        let mut named = Dso::new(Arrangement::SeparateCode, 0x3000);
        named.symbols.push(("__ehdr_start", crate::testelf::NOTE));
        let e = plans(&named, HP).1.shift.unwrap_err();
        assert_eq!(e.reason, Reason::EhdrReference);
        assert!(e.detail.contains("__ehdr_start"), "{e}");
    }

    #[test]
    fn precheck_refuses_small_and_finished_code() {
        let data = Dso::new(Arrangement::SeparateCode, 0x3000).build().data;
        let elf = Elf::parse(&data).unwrap();
        let an = analyse(&elf).unwrap();
        assert_eq!(precheck(&an, HP, 0x4000).unwrap_err().reason, Reason::BelowThreshold);
        assert!(precheck(&an, HP, 0x3000).is_ok());
        let (_, out) = crate::transform_to_vec(&data, &crate::testelf::opts(crate::ModeChoice::Shift, HP)).unwrap();
        let done = Elf::parse(&out).unwrap();
        let e = precheck(&analyse(&done).unwrap(), HP, 0).unwrap_err();
        assert_eq!(e.reason, Reason::AlreadyAligned);
        // Placed (congruent, p_align of a huge page) but no whole window of code: a
        // reason of its own, not "already aligned" (the probe finds no window either).
        let mut placed = analyse(&elf).unwrap();
        let x = placed.exec;
        placed.loads[x].p_align = HP;
        assert_eq!(placed.loads[x].p_vaddr % HP, placed.loads[x].p_offset % HP);
        let e = precheck(&placed, HP, 0).unwrap_err();
        assert_eq!(e.reason, Reason::NoWholeWindow);
        assert!(e.detail.contains("no whole 2 MiB window"), "{e}");
        // Aligned for 64 KiB pages is not aligned for 2 MiB ones.
        let (_, small) =
            crate::transform_to_vec(&data, &crate::testelf::opts(crate::ModeChoice::Shift, 0x10000)).unwrap();
        assert!(precheck(&analyse(&Elf::parse(&small).unwrap()).unwrap(), HP, 0).is_ok());
    }
}
