"""The Rust core (bindings/src/lib.rs): what each entry returns, so that mypy checks
every layer against the core rather than against dicts of anything."""

from os import PathLike
from typing import Literal, TypedDict

VERSION: str
DEFAULT_HUGE_PAGE: int
DEFAULT_THRESHOLD: int

class HugifyError(Exception):
    reason: str
    kind: str
    detail: str

class Segment(TypedDict):
    type: int
    flags: int
    offset: int
    vaddr: int
    filesz: int
    memsz: int
    align: int

class WindowRun(TypedDict):
    """Whole huge-page windows of one executable load (core/src/windows.rs)."""

    offset: int
    vaddr: int
    len: int

class Refusal(TypedDict):
    reason: str
    kind: str
    detail: str

class PlanRefused(Refusal):
    ok: Literal[False]

class Plan(TypedDict):
    ok: Literal[True]
    mode: str
    dv: int
    df: int
    #: Of the file written, once transformed.
    growth: int
    covered_code: int
    #: Bytes that were not executable and become executable (core/src/exposure.rs):
    #: planned, or once transformed measured in the output; 0 unless exposure_limit allows.
    exposed_read_only: int
    #: Where they lie: section name (or "(bytes outside sections)") -> bytes.
    exposed_sections: dict[str, int]
    #: The program header table had to grow and nothing after it could make room at
    #: e_phoff: it lies in a gap between sections, where dwz and eu-strip zero it.
    phdr_table_displaced: bool
    segments: list[Segment]
    windows: list[WindowRun]
    build_id: str | None

class Plans(TypedDict):
    shift: Plan | PlanRefused
    align: Plan | PlanRefused

class Report(TypedDict):
    arch: str
    kind: str
    layout: str
    linker: str | None
    split: int
    split_section: str
    code_bytes: int
    exec_segment_size: int
    covered_before: int
    windows_before: list[WindowRun]
    huge_page: int
    #: Bytes per file allowed to become executable that were not (0 unless opted in).
    exposure_limit: int
    #: The largest base page size the output runs with (the policy's, or the
    #: architecture's largest), and the one exposure is measured in for this file (the
    #: largest up to that modulo which its loads are congruent).
    page_size: int
    page: int
    segments: list[Segment]
    build_id: str | None
    plans: Plans
    chosen: str | None
    refusal: Refusal | None

class Transformed(Report):
    result: Plan

class GlibcThp(TypedDict):
    """What glibc's loader does by itself under glibc.elf.thp=1 (core/src/glibc_thp.rs)."""

    #: Bytes of the windows in loads ld.so advises (MADV_HUGEPAGE).
    advised: int
    #: Of them, the window holding the ELF header (read with it: never cold).
    header: int
    #: The largest read_ahead (bytes) up to which the kernel's reads for the other loads'
    #: faults at start-up stay out of the other advised windows (0: none); None when
    #: nothing read then reaches them, or there are none.
    read_ahead_limit: int | None

class Probe(TypedDict):
    """Header facts of an ELF executable or shared object, for no huge-page size
    (core/src/probe.rs, Probe)."""

    arch: str | None
    is64: bool
    kind: str | None
    has_symtab: bool | None
    build_id: str | None
    exec_load: Segment | None
    code_size: int
    #: The PT_LOAD headers, from which `windows` gives the facts for a huge-page size.
    loads: list[Segment]
    #: Whether the loader puts them at their link-time addresses (ET_EXEC).
    fixed: bool
    #: Why the rest could not be read.
    problem: Refusal | None

class Windows(TypedDict):
    """A probed file's facts for one huge-page size (core/src/probe.rs, Probe::windows)."""

    huge_page: int
    #: The whole huge-page windows at congruent offsets.
    runs: list[WindowRun]
    code_size: int
    huge_bytes: int
    #: whole | partial | none: how much of the code is on huge pages as the file is.
    state: Literal["whole", "partial", "none"]
    #: The manifest's (offset, size), docs/manifest.md.
    manifest_span: tuple[int, int] | None
    glibc_thp: GlibcThp

def inspect(
    source: int | str | PathLike[str],
    huge_page: int,
    threshold: int,
    mode: str = "auto",
    exposure_limit: int = 0,
    page_size: int = 0,
) -> Report: ...
def transform(
    src: int,
    out: int,
    huge_page: int,
    threshold: int,
    mode: str = "auto",
    exposure_limit: int = 0,
    page_size: int = 0,
    *,
    src_name: str | None = None,
    out_name: str | None = None,
) -> Transformed:
    """Descriptors: `src` a regular file open for reading, `out` a new empty file open
    for reading and writing (hugify/files.py opens both and renames `out` into place).
    `page_size`: the largest page size the output is to run with (0: the largest the
    architecture's distribution kernels use); exposure is measured in such pages."""

def transform_bytes(
    data: bytes, huge_page: int, threshold: int, mode: str = "auto", exposure_limit: int = 0, page_size: int = 0
) -> tuple[Transformed, bytes]: ...
def probe(source: int | str | PathLike[str]) -> Probe | None: ...
def debug_file_build_id(source: int | str | PathLike[str]) -> str | None:
    """The build-id of a separate debug file, from its notes (its program headers are
    the stripped file's, so `probe` refuses it); HugifyError for damaged headers."""

def windows(probe: Probe, huge_page: int) -> Windows:
    """The probe's facts for a huge-page size, from its loads: any number of sizes, one
    read of the file."""

def reasons() -> list[tuple[str, str, str]]: ...
def arch_names() -> list[tuple[str, list[str]]]: ...
def canonical_arch(name: str) -> str | None: ...
def default_huge_pages() -> list[tuple[str, int]]: ...
def default_page_sizes() -> list[tuple[str, int]]: ...
def min_page_sizes() -> list[tuple[str, int]]: ...
