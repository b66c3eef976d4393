//! hugify-core: rewrites position-independent ELF files so that their code lives on
//! whole huge-page windows of its own, repairing every address that moved.
//!
//! Pure functions over byte slices: [`inspect`] reports the layout and both plans,
//! [`transform`] produces the output as [`Output`] pieces, [`verify`] re-parses an
//! output and checks the invariants before anyone relies on it. Reading, writing
//! and renaming files is the caller's business.

pub mod addr_map;
pub mod arch;
mod assemble;
mod cfi;
mod dwarf;
pub mod elf;
pub mod error;
pub mod exposure;
#[doc(hidden)]
pub mod fuzzing;
pub mod glibc_thp;
mod hazards;
pub mod layout;
mod leb;
pub mod output;
mod patch;
pub mod plan;
pub mod probe;
mod repair;
mod testelf;
mod verify;
pub mod windows;

use elf::names::{GNU_DEBUGDATA, STAB};
use elf::{Elf, Phdr};
pub use error::{Error, Kind, Reason, Result};
use layout::Analysis;
pub use output::Output;
use plan::{Mode, Plan};
use windows::{covered, huge_windows, WindowRun};

/// The default huge-page size: a PMD on x86-64 and on 4 KiB-page aarch64 ([`arch`]'s table).
pub use arch::DEFAULT_HUGE_PAGE;
/// The default executable-segment threshold (paper, section 4.3).
pub const DEFAULT_THRESHOLD: u64 = 1 << 20;

/// Which mode to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeChoice {
    /// Shift where it is safe, otherwise alignment only.
    Auto,
    /// Only the separation shift.
    Shift,
    /// Only alignment.
    Align,
}

/// Options of a run.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Huge-page size to align to (a power of two).
    pub huge_page: u64,
    /// Files whose executable segment is smaller are refused.
    pub threshold: u64,
    /// Which mode to use.
    pub mode: ModeChoice,
    /// Bytes per file that were not executable in the input ([`exposure`]) and may
    /// become executable: 0 unless a policy opts in, whatever the mode.
    pub exposure_limit: u64,
    /// The largest page size the output is to run with (a power of two; 0: the
    /// largest the architecture's distribution kernels use, [`arch::Rewriting::max_page`]):
    /// exposure is measured in such pages and loads stay congruent modulo them, as far
    /// as the input's are ([`layout::Analysis::page`]).
    pub page_size: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            huge_page: DEFAULT_HUGE_PAGE,
            threshold: DEFAULT_THRESHOLD,
            mode: ModeChoice::Auto,
            exposure_limit: 0,
            page_size: 0,
        }
    }
}

/// What one plan does, for reports.
#[derive(Clone, Debug)]
pub struct PlanSummary {
    /// The mode.
    pub mode: Mode,
    /// Virtual displacement of everything from the split point.
    pub dv: u64,
    /// File displacement of the code.
    pub df: u64,
    /// Output size minus input size: of the file written, once transformed; before
    /// that, of a trial layout without rewritten debug sections.
    pub growth: i64,
    /// Code bytes inside whole huge-page windows after the rewrite.
    pub covered_code: u64,
    /// Bytes that were not executable and become executable: planned (read-only
    /// data that shares the code's first window, a shift the exposure limit allows);
    /// once transformed, measured in the output by the self-check.
    pub exposed: u64,
    /// Where those bytes lie: section names (or a description of bytes outside
    /// sections) with their bytes.
    pub exposed_sections: Vec<(String, u64)>,
    /// Whether the program header table, which must grow, leaves e_phoff for a gap
    /// between sections behind what stays ([`plan::Plan::phdr_table_displaced`]):
    /// elfutils-based tools run after hugify (dwz, eu-strip) zero it there.
    pub phdr_table_displaced: bool,
    /// The whole huge-page windows after the rewrite.
    pub windows: Vec<WindowRun>,
    /// The program headers after the rewrite.
    pub phdrs: Vec<Phdr>,
    /// The build-id after the rewrite (one bit flipped), if the file has one.
    pub build_id: Option<Vec<u8>>,
}

/// Everything `inspect` reports about a file.
#[derive(Clone, Debug)]
pub struct Report {
    /// Architecture name.
    pub arch: &'static str,
    /// PIE, static-pie, shared object or executable.
    pub kind: &'static str,
    /// Layout class.
    pub layout: &'static str,
    /// Linker, when the file names it.
    pub linker: Option<String>,
    /// The split point.
    pub split: u64,
    /// The section at the split point.
    pub split_section: String,
    /// Code bytes (executable sections).
    pub code_bytes: u64,
    /// Size of the executable segment.
    pub exec_segment_size: u64,
    /// Code bytes inside whole huge-page windows before the rewrite.
    pub covered_before: u64,
    /// The whole huge-page windows before the rewrite.
    pub windows_before: Vec<WindowRun>,
    /// Program headers before the rewrite.
    pub phdrs: Vec<Phdr>,
    /// The build-id before the rewrite, if the file has one.
    pub build_id: Option<Vec<u8>>,
    /// The huge-page size planned for.
    pub huge_page: u64,
    /// The exposure limit planned with ([`Options::exposure_limit`]).
    pub exposure_limit: u64,
    /// The largest page size the output is to run with ([`Options::page_size`], 0
    /// resolved to the architecture's), and the one exposure is measured in for this
    /// file ([`layout::Analysis::page`]: smaller where its loads are congruent only so).
    pub page_size: u64,
    /// See `page_size`.
    pub page: u64,
    /// The shift plan, or why not.
    pub shift: Result<PlanSummary>,
    /// The alignment-only plan, or why not.
    pub align: Result<PlanSummary>,
    /// The plan chosen under the options, or why the file is refused.
    pub chosen: Result<Mode>,
}

/// A finished transformation.
pub struct Transformed {
    /// The report, with the chosen plan.
    pub report: Report,
    /// The output file.
    pub output: Output,
    plan: Plan,
    exposure_limit: u64,
    page_size: u64,
}

impl Transformed {
    /// The summary of the plan that was carried out.
    pub fn summary(&self) -> &PlanSummary {
        let ok = match self.plan.mode {
            Mode::Shift => &self.report.shift,
            Mode::Align => &self.report.align,
        };
        ok.as_ref().expect("the chosen plan succeeded")
    }
}

struct Planned<'e> {
    elf: Elf<'e>,
    an: Analysis,
    report: Report,
    shift: Option<Plan>,
    align: Option<Plan>,
}

/// Analyses and plans. With `all_plans` false (transforming), a file that fails the
/// prechecks is refused before any plan is made.
fn plan_file<'e>(data: &'e [u8], opts: &Options, all_plans: bool) -> Result<Planned<'e>> {
    if !opts.huge_page.is_power_of_two() || opts.huge_page < 4096 {
        return Err(Error::new(
            Reason::Internal,
            format!("huge-page size {:#x} is not a power of two >= 4096", opts.huge_page),
        ));
    }
    if opts.page_size != 0 && !opts.page_size.is_power_of_two() {
        return Err(Error::new(Reason::Internal, format!("page size {:#x} is not a power of two", opts.page_size)));
    }
    let elf = Elf::parse(data)?;
    let an = layout::analyse_for(&elf, opts.page_size)?;
    let pre = plan::precheck(&an, opts.huge_page, opts.threshold).and_then(|()| check_sections(&elf));
    if !all_plans {
        pre.clone()?;
    }
    let cands = plan::candidates(&elf, &an, opts.huge_page, opts.exposure_limit);
    let build_id = elf::notes::build_id(&elf)?.map(|(_, id)| id.to_vec());
    let summarise = |p: &Result<Plan>| -> Result<PlanSummary> {
        let plan = p.as_ref().map_err(Clone::clone)?;
        let size = assemble::lay_out(&elf, &an, plan, &vec![None; elf.shdrs.len()])?.size;
        Ok(PlanSummary {
            mode: plan.mode,
            dv: plan.map.dv,
            df: plan.df,
            growth: size as i64 - data.len() as i64,
            covered_code: plan.covered_code,
            exposed: plan.exposed,
            exposed_sections: plan.exposed_sections.clone(),
            phdr_table_displaced: plan.phdr_table_displaced,
            windows: huge_windows(&plan.phdrs, an.kind.fixed_addresses(), plan.huge_page),
            phdrs: plan.phdrs.clone(),
            build_id: build_id.clone().map(|mut id| {
                id[0] ^= repair::BUILD_ID_FLIP;
                id
            }),
        })
    };
    let (shift, align) = (summarise(&cands.shift), summarise(&cands.align));
    let chosen = pre.and_then(|()| choose(&an, opts.mode, &shift, &align));
    let x = an.exec_load();
    let windows_before = huge_windows(&elf.phdrs, an.kind.fixed_addresses(), opts.huge_page);
    let report = Report {
        arch: an.arch.name,
        kind: an.kind.name(),
        layout: an.layout.name(),
        linker: an.linker.clone(),
        split: an.split,
        split_section: an.split_section.clone(),
        code_bytes: an.code_bytes,
        exec_segment_size: x.p_memsz,
        covered_before: covered(&windows_before, an.exec_sections(&elf).map(|s| (s.sh_addr, s.vend()))),
        windows_before,
        phdrs: elf.phdrs.clone(),
        build_id,
        huge_page: opts.huge_page,
        exposure_limit: opts.exposure_limit,
        page_size: an.page_limit,
        page: an.page,
        shift,
        align,
        chosen,
    };
    Ok(Planned { shift: cands.shift.ok(), align: cands.align.ok(), elf, an, report })
}

/// Auto picks the plan that puts more code on huge pages; on a tie, alignment only,
/// which changes no address and grows the file less. A shift that makes read-only data
/// executable must gain more code bytes on huge pages than it exposes (libxul: 1.5 MiB
/// more code for 51 MiB of .rodata and .eh_frame is not worth it).
fn choose(an: &Analysis, choice: ModeChoice, shift: &Result<PlanSummary>, align: &Result<PlanSummary>) -> Result<Mode> {
    match (choice, shift, align) {
        (ModeChoice::Shift, Err(e), _) | (ModeChoice::Align, _, Err(e)) => Err(e.clone()),
        (ModeChoice::Shift, Ok(_), _) => Ok(Mode::Shift),
        (ModeChoice::Align, _, Ok(_)) => Ok(Mode::Align),
        (ModeChoice::Auto, Ok(s), Ok(a)) if a.covered_code + s.exposed >= s.covered_code => Ok(Mode::Align),
        (ModeChoice::Auto, Ok(_), _) => Ok(Mode::Shift),
        (ModeChoice::Auto, Err(_), Ok(_)) => Ok(Mode::Align),
        (ModeChoice::Auto, Err(_), Err(a)) if an.kind.fixed_addresses() => Err(a.clone()),
        (ModeChoice::Auto, Err(s), Err(a)) => {
            Err(Error::new(s.reason, format!("{}; alignment only: {}", s.detail, a.detail)))
        }
    }
}

/// Sections whose contents hold addresses hugify cannot repair, malformed annobin
/// notes (in either mode), and data past the last section that something might
/// locate by file offset.
fn check_sections(elf: &Elf) -> Result<()> {
    for s in &elf.shdrs {
        let n = s.name.as_str();
        if n == GNU_DEBUGDATA || n == STAB {
            return Err(Error::new(Reason::UnsupportedSection, format!("{n} holds addresses hugify cannot repair")));
        }
    }
    repair::check_build_attributes(elf)?;
    let class = elf.class;
    let mut end = elf.ehdr.e_shoff + elf.ehdr.shnum * class.shdr_size();
    end = end.max(elf.ehdr.e_phoff + elf.ehdr.phnum * class.phdr_size());
    end = elf.shdrs.iter().map(|s| s.fend()).fold(end, u64::max);
    end = elf.loads().map(Phdr::fend).fold(end, u64::max);
    if let Some(extra) = elf.data.get(end as usize..).filter(|t| t.iter().any(|&b| b != 0)) {
        return Err(Error::new(
            Reason::TrailingData,
            format!("{} bytes follow the last section at {end:#x}", extra.len()),
        ));
    }
    Ok(())
}

/// Reports the layout of `data` and what each mode would do.
pub fn inspect(data: &[u8], opts: &Options) -> Result<Report> {
    plan_file(data, opts, true).map(|p| p.report)
}

/// Transforms `data` under `opts`.
pub fn transform(data: &[u8], opts: &Options) -> Result<Transformed> {
    transform_planned(data, opts, |_| ())
}

/// Transforms `data` with the chosen plan as `adjust` leaves it: tests break the plan
/// there to show that the self-check does not take the plan's word.
fn transform_planned(data: &[u8], opts: &Options, adjust: impl FnOnce(&mut Plan)) -> Result<Transformed> {
    let planned = plan_file(data, opts, false)?;
    let mode = planned.report.chosen.clone()?;
    let mut plan = match mode {
        Mode::Shift => planned.shift,
        Mode::Align => planned.align,
    }
    .expect("a chosen plan exists");
    adjust(&mut plan);
    let ctx = repair::Ctx { elf: &planned.elf, an: &planned.an, plan: &plan };
    let elf_patches = repair::collect(&ctx)?;
    let debug = dwarf::repair(&planned.elf, &plan.map)?;
    // The debug edits can number millions: keep those vectors and add the few others.
    let mut patches = debug.patches;
    patches.append(elf_patches);
    let output = assemble::assemble(&planned.elf, &planned.an, &plan, patches, debug.replacements)?;
    // Rewritten debug sections (recompressed) change the size the trial layout gave.
    let mut report = planned.report;
    let chosen = match mode {
        Mode::Shift => &mut report.shift,
        Mode::Align => &mut report.align,
    };
    if let Ok(s) = chosen {
        s.growth = output.size as i64 - data.len() as i64;
    }
    Ok(Transformed { report, output, plan, exposure_limit: opts.exposure_limit, page_size: opts.page_size })
}

/// Re-parses `out` (the bytes of `t.output`) and checks every invariant of the
/// transformation against the input, among them that no more bytes became
/// executable than the exposure limit allows. What did (measured, not planned) is
/// recorded in the summary of the plan carried out.
pub fn verify(input: &[u8], out: &[u8], t: &mut Transformed) -> Result<()> {
    let elf = Elf::parse(input)?;
    let an = layout::analyse_for(&elf, t.page_size)?;
    let measured = verify::check(&elf, &an, &t.plan, t.exposure_limit, out)?;
    let chosen = match t.plan.mode {
        Mode::Shift => &mut t.report.shift,
        Mode::Align => &mut t.report.align,
    };
    if let Ok(s) = chosen {
        s.exposed = measured.bytes;
        s.exposed_sections = measured.sections;
    }
    Ok(())
}

/// Transforms and self-checks in memory; the convenience entry for tests and fuzzing.
pub fn transform_to_vec(data: &[u8], opts: &Options) -> Result<(Transformed, Vec<u8>)> {
    let mut t = transform(data, opts)?;
    let out = t.output.to_vec(data);
    verify(data, &out, &mut t)?;
    Ok((t, out))
}

/// Transforms with the chosen plan changed by `adjust`, without the self-check: what
/// the self-check sees when the planner errs.
#[cfg(test)]
fn transform_broken(data: &[u8], opts: &Options, adjust: impl FnOnce(&mut Plan)) -> (Transformed, Vec<u8>) {
    let t = transform_planned(data, opts, adjust).expect("transforms");
    let out = t.output.to_vec(data);
    (t, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use testelf::{opts, run, Arrangement, Dso};

    fn refusal(data: &[u8], o: &Options) -> &'static str {
        transform(data, o).err().expect("refused").reason.id()
    }

    #[test]
    fn each_refusal_gives_its_reason() {
        let data = Dso::new(Arrangement::SeparateCode, 0x3000).build().data;
        let any = opts(ModeChoice::Auto, DEFAULT_HUGE_PAGE);
        assert_eq!(refusal(&data, &Options::default()), "below-threshold");
        let (_, out) = transform_to_vec(&data, &any).unwrap();
        assert_eq!(refusal(&out, &any), "already-aligned");

        let mut trailing = data.clone();
        trailing.extend(b"overlay");
        assert_eq!(refusal(&trailing, &any), "trailing-data");
        let mut zeros = data.clone();
        zeros.extend([0; 64]);
        assert!(transform(&zeros, &any).is_ok(), "zero padding at the end is no overlay");

        let mut stab = Dso::new(Arrangement::SeparateCode, 0x3000);
        stab.extra.push((".stab", vec![0; 12]));
        assert_eq!(refusal(&stab.build().data, &any), "unsupported-section");

        let mut headerless = data.clone();
        headerless[40..48].fill(0);
        headerless[60..64].fill(0);
        assert_eq!(refusal(&headerless, &any), "no-section-headers");
        let mut two = data.clone();
        two[64 + 56 * 2 + 4] |= 1; // PF_X on the read-only data's load
        assert_eq!(refusal(&two, &any), "multiple-exec-segments");
        assert_eq!(refusal(b"#!/bin/sh\n", &any), "not-elf");
        assert_eq!(refusal(&data[..100], &any), "truncated");
    }

    #[test]
    fn auto_takes_the_plan_that_covers_more_code() {
        let hp = 0x10000;
        let (_, t, _) = run(&Dso::new(Arrangement::SeparateCode, 0x30000), ModeChoice::Auto, hp);
        assert_eq!(t.summary().mode, Mode::Shift);
        let align = t.report.align.as_ref().unwrap();
        assert!(align.covered_code < t.summary().covered_code && t.summary().covered_code == 0x30000);

        // lld's layout: the read-only data before the code moves with it.
        let (_, t, _) = run(&Dso::new(Arrangement::RodataFirst, 0x30000), ModeChoice::Auto, hp);
        assert_eq!((t.summary().mode, t.report.layout), (Mode::Shift, "rodata-first"));
        assert_eq!(t.summary().covered_code, 0x30000);

        // Neither: both reasons in one line, the shift's id.
        let mut named = Dso::new(Arrangement::RodataFirst, 0x3000);
        named.symbols.push(("__ehdr_start", testelf::NOTE));
        let e = transform(&named.build().data, &opts(ModeChoice::Auto, hp)).err().expect("refused");
        assert_eq!(e.reason, Reason::EhdrReference);
        assert!(e.detail.contains("alignment only: no whole huge-page window"), "{e}");
    }

    #[test]
    fn no_mode_makes_read_only_data_executable_without_the_limit() {
        // lld's layout, 3 MiB of read-only data below the code.
        let lld = |code| {
            let mut dso = Dso::new(Arrangement::RodataFirst, code);
            dso.rodata_size = 3 << 20;
            dso.build().data
        };
        let (short, long) = (lld(0x3000), lld(0x280000));
        for mode in [ModeChoice::Auto, ModeChoice::Shift] {
            let o = opts(mode, DEFAULT_HUGE_PAGE);
            assert_eq!(transform(&short, &o).err().expect("refused").reason, Reason::NoGain, "{mode:?}");
            let (t, _) = transform_to_vec(&long, &o).unwrap();
            assert_eq!((t.summary().mode, t.summary().exposed), (Mode::Shift, 0), "{mode:?}");
            assert_eq!(t.summary().covered_code, DEFAULT_HUGE_PAGE);
        }
        // An align plan exposes nothing either (it has no window here).
        let o = opts(ModeChoice::Align, DEFAULT_HUGE_PAGE);
        assert_eq!(transform(&short, &o).err().expect("refused").reason, Reason::NoGain);
    }

    #[test]
    fn output_is_deterministic() {
        let data = Dso::new(Arrangement::TextInFirst, 0x3000).build().data;
        let o = opts(ModeChoice::Shift, DEFAULT_HUGE_PAGE);
        assert_eq!(transform_to_vec(&data, &o).unwrap().1, transform_to_vec(&data, &o).unwrap().1);
    }

    #[test]
    fn code_is_the_same_sections_for_its_bytes_and_its_coverage() {
        // A hugified file whose .text claims SHT_NOBITS: allocated and executable, but
        // with no bytes in the file, it is no code (Shdr::is_code) for the code bytes
        // and for the coverage alike. Counted by one and not the other, the coverage
        // was more than all the code.
        let data = Dso::new(Arrangement::SeparateCode, 0x30000).build().data;
        let (_, mut out) = transform_to_vec(&data, &opts(ModeChoice::Shift, 0x10000)).unwrap();
        let before = inspect(&out, &opts(ModeChoice::Auto, 0x10000)).unwrap();
        let elf = Elf::parse(&out).unwrap();
        let text = elf.section(".text").unwrap();
        let (at, size) = ((elf.ehdr.e_shoff + 64 * text.index as u64 + 4) as usize, text.sh_size);
        out[at..at + 4].copy_from_slice(&elf::consts::SHT_NOBITS.to_le_bytes());
        let r = inspect(&out, &opts(ModeChoice::Auto, 0x10000)).unwrap();
        assert!(before.covered_before >= size && before.code_bytes >= size);
        assert_eq!(r.code_bytes, before.code_bytes - size);
        assert_eq!(r.covered_before, before.covered_before - size);
    }

    #[test]
    fn inspect_reports_both_plans_and_todays_windows() {
        let data = Dso::new(Arrangement::SeparateCode, 0x30000).build().data;
        let r = inspect(&data, &opts(ModeChoice::Auto, 0x10000)).unwrap();
        assert_eq!((r.kind, r.layout, r.split_section.as_str()), ("shared-object", "separate-code", ".text"));
        assert_eq!((r.code_bytes, r.covered_before), (0x30000, 0));
        assert!(r.windows_before.is_empty(), "4 KiB p_align: no window today");
        assert_eq!(r.build_id.as_deref(), Some(&testelf::BUILD_ID[..]));
        let (shift, align) = (r.shift.unwrap(), r.align.unwrap());
        assert_eq!((shift.mode, align.mode, r.chosen.unwrap()), (Mode::Shift, Mode::Align, Mode::Shift));
        assert_eq!(align.dv, 0);
        assert_eq!(shift.windows.iter().map(|w| w.len).sum::<u64>(), 0x30000);
    }
}
