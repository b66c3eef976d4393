//! `hugify._core`: the Python face of hugify-core. Thin on purpose: it converts
//! options and reports, releases the GIL while the core works, and turns every
//! failure (including a panic) into `HugifyError` with a stable reason id.

mod fileio;

use fileio::{Failure, Input};
use hugify_core::arch::{ArchName, ARCH_NAMES};
use hugify_core::elf::Phdr;
use hugify_core::probe::{Probe, Windows};
use hugify_core::windows::WindowRun;
use hugify_core::{Error, ModeChoice, Options, PlanSummary, Reason, Report};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use std::os::unix::io::RawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

pyo3::create_exception!(
    _core,
    HugifyError,
    pyo3::exceptions::PyException,
    "A file was refused, invalid, or hit an internal error."
);

fn to_py_err(py: Python<'_>, e: &Error) -> PyErr {
    let err = HugifyError::new_err(e.to_string());
    let v = err.value(py);
    let _ = v.setattr("reason", e.reason.id());
    let _ = v.setattr("kind", e.kind().name());
    let _ = v.setattr("detail", e.detail.clone());
    err
}

/// The system's message for an I/O error, as Python's own OSError gives it ("No such
/// file or directory"), without the " (os error 2)" Rust's Display appends.
fn system_message(e: &std::io::Error) -> String {
    let text = e.to_string();
    match e.raw_os_error() {
        Some(n) => text.strip_suffix(&format!(" (os error {n})")).unwrap_or(&text).to_string(),
        None => text,
    }
}

fn failure_to_py(py: Python<'_>, f: Failure) -> PyErr {
    match f {
        Failure::Core(e) => to_py_err(py, &e),
        Failure::Io(path, e) => PyOSError::new_err((e.raw_os_error().unwrap_or(0), system_message(&e), path)),
    }
}

fn options(huge_page: u64, threshold: u64, mode: &str, exposure_limit: u64, page_size: u64) -> PyResult<Options> {
    let mode = match mode {
        "auto" => ModeChoice::Auto,
        "shift" => ModeChoice::Shift,
        "align" => ModeChoice::Align,
        m => return Err(PyValueError::new_err(format!("unknown mode {m:?} (auto, shift, align)"))),
    };
    Ok(Options { huge_page, threshold, mode, exposure_limit, page_size })
}

fn segments<'py>(py: Python<'py>, phdrs: &[Phdr]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for p in phdrs {
        let d = PyDict::new(py);
        d.set_item("type", p.p_type)?;
        d.set_item("flags", p.p_flags)?;
        d.set_item("offset", p.p_offset)?;
        d.set_item("vaddr", p.p_vaddr)?;
        d.set_item("filesz", p.p_filesz)?;
        d.set_item("memsz", p.p_memsz)?;
        d.set_item("align", p.p_align)?;
        list.append(d)?;
    }
    Ok(list)
}

fn window_runs<'py>(py: Python<'py>, runs: &[WindowRun]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for w in runs {
        let d = PyDict::new(py);
        d.set_item("offset", w.offset)?;
        d.set_item("vaddr", w.vaddr)?;
        d.set_item("len", w.len)?;
        list.append(d)?;
    }
    Ok(list)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn error_dict<'py>(py: Python<'py>, e: &Error) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("reason", e.reason.id())?;
    d.set_item("kind", e.kind().name())?;
    d.set_item("detail", &e.detail)?;
    Ok(d)
}

fn plan_dict<'py>(py: Python<'py>, p: &Result<PlanSummary, Error>) -> PyResult<Bound<'py, PyDict>> {
    match p {
        Err(e) => {
            let d = error_dict(py, e)?;
            d.set_item("ok", false)?;
            Ok(d)
        }
        Ok(s) => {
            let d = PyDict::new(py);
            d.set_item("ok", true)?;
            d.set_item("mode", s.mode.name())?;
            d.set_item("dv", s.dv)?;
            d.set_item("df", s.df)?;
            d.set_item("growth", s.growth)?;
            d.set_item("covered_code", s.covered_code)?;
            d.set_item("exposed_read_only", s.exposed)?;
            let sections = PyDict::new(py);
            for (name, bytes) in &s.exposed_sections {
                sections.set_item(name, bytes)?;
            }
            d.set_item("exposed_sections", sections)?;
            d.set_item("phdr_table_displaced", s.phdr_table_displaced)?;
            d.set_item("segments", segments(py, &s.phdrs)?)?;
            d.set_item("windows", window_runs(py, &s.windows)?)?;
            d.set_item("build_id", s.build_id.as_deref().map(hex))?;
            Ok(d)
        }
    }
}

fn report_dict<'py>(py: Python<'py>, r: &Report) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("arch", r.arch)?;
    d.set_item("kind", r.kind)?;
    d.set_item("layout", r.layout)?;
    d.set_item("linker", r.linker.clone())?;
    d.set_item("split", r.split)?;
    d.set_item("split_section", &r.split_section)?;
    d.set_item("code_bytes", r.code_bytes)?;
    d.set_item("exec_segment_size", r.exec_segment_size)?;
    d.set_item("covered_before", r.covered_before)?;
    d.set_item("windows_before", window_runs(py, &r.windows_before)?)?;
    d.set_item("huge_page", r.huge_page)?;
    d.set_item("exposure_limit", r.exposure_limit)?;
    d.set_item("page_size", r.page_size)?;
    d.set_item("page", r.page)?;
    d.set_item("segments", segments(py, &r.phdrs)?)?;
    d.set_item("build_id", r.build_id.as_deref().map(hex))?;
    let plans = PyDict::new(py);
    plans.set_item("shift", plan_dict(py, &r.shift)?)?;
    plans.set_item("align", plan_dict(py, &r.align)?)?;
    d.set_item("plans", plans)?;
    match &r.chosen {
        Ok(m) => {
            d.set_item("chosen", m.name())?;
            d.set_item("refusal", py.None())?;
        }
        Err(e) => {
            d.set_item("chosen", py.None())?;
            d.set_item("refusal", error_dict(py, e)?)?;
        }
    }
    Ok(d)
}

/// A file the core reads: an open descriptor (the caller's, borrowed for the call)
/// or a path.
#[derive(FromPyObject)]
enum Source {
    Fd(RawFd),
    Path(PathBuf),
}

impl Source {
    fn input(self, name: Option<String>) -> Input {
        match self {
            Source::Fd(fd) => Input::Fd(fd, name.unwrap_or_else(|| format!("<fd {fd}>"))),
            Source::Path(p) => Input::Path(p),
        }
    }
}

/// Runs `f` without the GIL, turning a panic into an internal error.
fn guarded<T: Send>(py: Python<'_>, f: impl FnOnce() -> Result<T, Failure> + Send) -> PyResult<T> {
    let r = py.detach(|| catch_unwind(AssertUnwindSafe(f)));
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(failure_to_py(py, e)),
        Err(payload) => Err(to_py_err(py, &fileio::panic_error(payload))),
    }
}

/// Reports a file's layout and both plans.
#[pyfunction]
#[pyo3(signature = (source, huge_page, threshold, mode="auto", exposure_limit=0, page_size=0))]
fn inspect<'py>(
    py: Python<'py>,
    source: Source,
    huge_page: u64,
    threshold: u64,
    mode: &str,
    exposure_limit: u64,
    page_size: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let opts = options(huge_page, threshold, mode, exposure_limit, page_size)?;
    let input = source.input(None);
    let report = guarded(py, || {
        let (_f, m) = fileio::map(&input)?;
        hugify_core::inspect(m.as_deref().unwrap_or(&[]), &opts).map_err(Failure::Core)
    })?;
    report_dict(py, &report)
}

/// Transforms the regular file open at descriptor `src` into `out`, a new empty file
/// open for reading and writing, and self-checks what it wrote. Descriptors, not
/// paths: the caller (hugify/files.py) opened both where no one could swap them and
/// renames the output into place. `src_name`, `out_name`: what errors call them.
/// `page_size`: the largest page size the output is to run with (0: the largest its
/// architecture's distribution kernels use).
#[pyfunction]
#[pyo3(signature = (src, out, huge_page, threshold, mode="auto", exposure_limit=0, page_size=0, *, src_name=None, out_name=None))]
#[allow(clippy::too_many_arguments)]
fn transform<'py>(
    py: Python<'py>,
    src: RawFd,
    out: RawFd,
    huge_page: u64,
    threshold: u64,
    mode: &str,
    exposure_limit: u64,
    page_size: u64,
    src_name: Option<String>,
    out_name: Option<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let opts = options(huge_page, threshold, mode, exposure_limit, page_size)?;
    let input = Source::Fd(src).input(src_name);
    let out_label = out_name.unwrap_or_else(|| format!("<fd {out}>"));
    let t = guarded(py, || fileio::transform_fd(&input, out, &out_label, &opts))?;
    let d = report_dict(py, &t.report)?;
    d.set_item("result", plan_dict(py, &Ok(t.summary().clone()))?)?;
    Ok(d)
}

/// Transforms bytes in memory (tests and fuzzing): returns (report, output bytes).
#[pyfunction]
#[pyo3(signature = (data, huge_page, threshold, mode="auto", exposure_limit=0, page_size=0))]
fn transform_bytes<'py>(
    py: Python<'py>,
    data: &[u8],
    huge_page: u64,
    threshold: u64,
    mode: &str,
    exposure_limit: u64,
    page_size: u64,
) -> PyResult<(Bound<'py, PyDict>, Bound<'py, PyBytes>)> {
    let opts = options(huge_page, threshold, mode, exposure_limit, page_size)?;
    let (t, out) = guarded(py, || hugify_core::transform_to_vec(data, &opts).map_err(Failure::Core))?;
    let d = report_dict(py, &t.report)?;
    d.set_item("result", plan_dict(py, &Ok(t.summary().clone()))?)?;
    Ok((d, PyBytes::new(py, &out)))
}

fn probe_dict<'py>(py: Python<'py>, p: &Probe) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("arch", p.arch.map(|a| a.name))?;
    d.set_item("is64", p.is64)?;
    d.set_item("kind", p.kind.map(|k| k.name()))?;
    d.set_item("has_symtab", p.has_symtab)?;
    d.set_item("build_id", p.build_id.as_deref().map(hex))?;
    let exec = p.exec_load().map(|x| segments(py, std::slice::from_ref(x))).transpose()?;
    d.set_item("exec_load", exec.map(|l| l.get_item(0)).transpose()?)?;
    d.set_item("code_size", p.code_size())?;
    d.set_item("loads", segments(py, &p.loads)?)?;
    d.set_item("fixed", p.fixed)?;
    d.set_item("problem", p.problem.as_ref().map(|e| error_dict(py, e)).transpose()?)?;
    Ok(d)
}

/// A probed file's facts for one huge-page size ([`Windows`]).
fn windows_dict<'py>(py: Python<'py>, w: &Windows) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("huge_page", w.huge_page)?;
    d.set_item("runs", window_runs(py, &w.runs)?)?;
    d.set_item("code_size", w.code_size)?;
    d.set_item("huge_bytes", w.huge_bytes())?;
    d.set_item("state", w.state().name())?;
    d.set_item("manifest_span", w.manifest_span())?;
    let thp = PyDict::new(py);
    thp.set_item("advised", w.glibc_thp.advised)?;
    thp.set_item("header", w.glibc_thp.header)?;
    thp.set_item("read_ahead_limit", w.glibc_thp.read_ahead_limit)?;
    d.set_item("glibc_thp", thp)?;
    Ok(d)
}

/// A load as [`segments`] gave it. Its `p_paddr` is not there and plays no part in
/// windows: the virtual address stands in.
fn load_of(s: &Bound<'_, PyAny>) -> PyResult<Phdr> {
    let u = |key: &str| s.get_item(key)?.extract::<u64>();
    let (p_type, p_flags) = (s.get_item("type")?.extract()?, s.get_item("flags")?.extract()?);
    let (p_offset, p_vaddr, p_filesz, p_memsz, p_align) =
        (u("offset")?, u("vaddr")?, u("filesz")?, u("memsz")?, u("align")?);
    Ok(Phdr { p_type, p_flags, p_offset, p_vaddr, p_paddr: p_vaddr, p_filesz, p_memsz, p_align })
}

/// The header facts of an ELF executable or shared object (None for any other
/// file), without planning and for no huge-page size (`windows` gives a size's).
/// The file (a path, or a descriptor the caller opened) is read without readahead,
/// so that probing never caches code pages as small folios.
#[pyfunction]
fn probe<'py>(py: Python<'py>, source: Source) -> PyResult<Option<Bound<'py, PyDict>>> {
    let input = source.input(None);
    let p = guarded(py, || {
        let (_f, m) = fileio::map(&input)?;
        if let Some(m) = &m {
            // Only advice: a failure costs readahead, not correctness.
            let _ = m.advise(memmap2::Advice::Random);
        }
        Ok(hugify_core::probe::probe(m.as_deref().unwrap_or(&[])))
    })?;
    p.map(|p| probe_dict(py, &p)).transpose()
}

/// The build-id (hex) of a separate debug file (objcopy --only-keep-debug, eu-strip
/// -f), from its note sections; None without one. Its program headers are those of
/// the stripped file it goes with, so `probe` refuses it.
#[pyfunction]
fn debug_file_build_id(py: Python<'_>, source: Source) -> PyResult<Option<String>> {
    let input = source.input(None);
    let id = guarded(py, || {
        let (_f, m) = fileio::map(&input)?;
        Ok(hugify_core::probe::debug_file_build_id(m.as_deref().unwrap_or(&[]))?)
    })?;
    Ok(id.as_deref().map(hex))
}

/// A probe's facts for a huge-page size, from the loads it read ([`Probe::windows`]):
/// any number of sizes, the file read once.
#[pyfunction]
fn windows<'py>(py: Python<'py>, probe: &Bound<'py, PyDict>, huge_page: u64) -> PyResult<Bound<'py, PyDict>> {
    let item =
        |key: &str| probe.get_item(key)?.ok_or_else(|| PyValueError::new_err(format!("not a probe: no {key:?}")));
    let loads = item("loads")?.try_iter()?.map(|s| load_of(&s?)).collect::<PyResult<Vec<Phdr>>>()?;
    windows_dict(py, &Windows::of(&loads, item("fixed")?.extract()?, huge_page))
}

/// Every architecture hugify can name: (canonical name, other spellings).
#[pyfunction]
fn arch_names() -> Vec<(&'static str, Vec<&'static str>)> {
    ARCH_NAMES.iter().map(|a| (a.name, a.aliases.to_vec())).collect()
}

/// The huge-page size a policy uses for each architecture the rewriter supports,
/// unless it sets one: (canonical name, bytes).
#[pyfunction]
fn default_huge_pages() -> Vec<(&'static str, u64)> {
    ARCH_NAMES.iter().filter_map(|a| Some((a.name, a.rewriting?.default_huge_page))).collect()
}

/// The page size a policy measures exposure in for each architecture the rewriter
/// supports, unless it sets one: the largest its distribution kernels use.
#[pyfunction]
fn default_page_sizes() -> Vec<(&'static str, u64)> {
    ARCH_NAMES.iter().filter_map(|a| Some((a.name, a.rewriting?.max_page))).collect()
}

/// The smallest page size of each architecture the rewriter supports.
#[pyfunction]
fn min_page_sizes() -> Vec<(&'static str, u64)> {
    ARCH_NAMES.iter().filter_map(|a| Some((a.name, a.rewriting?.min_page))).collect()
}

/// The canonical name of any spelling of an architecture (`amd64` -> `x86_64`).
#[pyfunction]
fn canonical_arch(name: &str) -> Option<&'static str> {
    ArchName::canonical(name)
}

/// Every reason: (id, kind, summary).
#[pyfunction]
fn reasons() -> Vec<(&'static str, &'static str, &'static str)> {
    Reason::ALL.iter().map(|r| (r.id(), r.kind().name(), r.summary())).collect()
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("HugifyError", m.py().get_type::<HugifyError>())?;
    m.add("VERSION", env!("CARGO_PKG_VERSION"))?;
    m.add("DEFAULT_HUGE_PAGE", hugify_core::DEFAULT_HUGE_PAGE)?;
    m.add("DEFAULT_THRESHOLD", hugify_core::DEFAULT_THRESHOLD)?;
    m.add_function(wrap_pyfunction!(inspect, m)?)?;
    m.add_function(wrap_pyfunction!(transform, m)?)?;
    m.add_function(wrap_pyfunction!(transform_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(reasons, m)?)?;
    m.add_function(wrap_pyfunction!(probe, m)?)?;
    m.add_function(wrap_pyfunction!(windows, m)?)?;
    m.add_function(wrap_pyfunction!(debug_file_build_id, m)?)?;
    m.add_function(wrap_pyfunction!(arch_names, m)?)?;
    m.add_function(wrap_pyfunction!(canonical_arch, m)?)?;
    m.add_function(wrap_pyfunction!(default_huge_pages, m)?)?;
    m.add_function(wrap_pyfunction!(default_page_sizes, m)?)?;
    m.add_function(wrap_pyfunction!(min_page_sizes, m)?)?;
    Ok(())
}
