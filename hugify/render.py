"""Human-readable reports: the plan summary and a picture of the loadable segments
against huge-page windows, before and after, in the spirit of Figure 3 of the
Hugifier paper."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hugify import _core
from hugify.sizes import human

if TYPE_CHECKING:
    from hugify.rewrite import Rewritten

PT_LOAD = 1
PF_X, PF_W = 1, 2
#: Characters per window, finest first: the finest with which every window fits the
#: width is taken; where none does, the coarsest, and the middle windows are elided.
WINDOW_CHARS = (8, 4, 2)
#: The width of a picture's line when the terminal's is unknown (not a terminal).
DEFAULT_WIDTH = 80


def _loads(segments: Sequence[_core.Segment]) -> list[_core.Segment]:
    return [s for s in segments if s["type"] == PT_LOAD]


def _kind(seg: _core.Segment) -> str:
    if seg["flags"] & PF_X:
        return "X"
    if seg["flags"] & PF_W:
        return "W"
    return "R"


def picture(
    segments: list[_core.Segment], runs: list[_core.WindowRun], hp: int, label: str, width: int = DEFAULT_WIDTH
) -> list[str]:
    """Two lines at most `width` columns wide: the segments per window (R, X, W, '.' for
    nothing), and '^' under every window that can be a huge page (the core's windows).
    Each window gets 8, 4 or 2 characters, as many as let every window fit; where
    even 2 do not, the windows in the middle are elided."""
    loads = _loads(segments)
    end = max((s["vaddr"] + s["memsz"] for s in loads), default=0)
    nwin = max(1, -(-end // hp))
    room = max(width - 10, 24)  # the label (8) and the bars around the windows
    chars = next((c for c in WINDOW_CHARS if nwin * (c + 1) <= room), WINDOW_CHARS[-1])
    windows = list(range(nwin))
    if nwin * (chars + 1) > room:
        gap = f" …{nwin} windows… "  # the most a count of the elided windows can need
        half = max(1, (room - len(gap)) // (chars + 1) // 2)
        windows = [*windows[:half], -1, *windows[-half:]]
    huge = {w for run in runs for w in range(run["vaddr"] // hp, (run["vaddr"] + run["len"]) // hp)}
    step = hp // chars
    top, bottom = [], []
    for w in windows:
        if w < 0:
            top.append(f" …{nwin - len(windows) + 1} windows… ")
            bottom.append(" " * len(top[-1]))
            continue
        cells = []
        for c in range(chars):
            lo, hi = w * hp + c * step, w * hp + (c + 1) * step
            best, best_len = ".", 0
            for s in loads:
                overlap = min(hi, s["vaddr"] + s["memsz"]) - max(lo, s["vaddr"])
                if overlap > best_len:
                    best, best_len = _kind(s), overlap
            cells.append(best)
        top.append("".join(cells))
        bottom.append(("^" if w in huge else " ") * chars)
    return [f"{label:<8}|" + "|".join(top) + "|", (" " * 9 + " ".join(bottom)).rstrip()]


def exposure_text(plan: _core.Plan, limit: int) -> str:
    """What a plan makes executable that was not (", 172 B made executable that was not:
    .rodata 64 B, … (exposure_limit 4.0 KiB)"), or "" when nothing."""
    if not plan["exposed_read_only"]:
        return ""
    where = ", ".join(f"{name} {human(n)}" for name, n in plan["exposed_sections"].items())
    return f", {human(plan['exposed_read_only'])} made executable that was not: {where} (exposure_limit {human(limit)})"


def displaced_text(plan: _core.Plan) -> str:
    """A warning when a plan's program header table leaves e_phoff, or ""."""
    if not plan.get("phdr_table_displaced"):
        return ""
    return "; program headers moved off e_phoff into a gap between sections (dwz and eu-strip would zero them)"


def _plan_line(name: str, plan: _core.Plan | _core.PlanRefused, code: int, chosen: str | None, limit: int) -> str:
    mark = "  <- chosen" if name == chosen else ""
    if plan["ok"] is False:
        return f"    {name:<6} not possible: {plan['detail']} ({plan['reason']})"
    cover = 100.0 * plan["covered_code"] / code if code else 0.0
    shared = exposure_text(plan, limit)
    return (
        f"    {name:<6} dv={plan['dv']:#x} df={plan['df']:#x} growth {human(plan['growth'])}, "
        f"code on huge pages {cover:.1f}%{shared}{displaced_text(plan)}{mark}"
    )


def inspect_text(path: str, r: _core.Report, width: int = DEFAULT_WIDTH) -> str:
    """The report `hugify inspect` prints for one file; its picture as wide as `width`."""
    hp = r["huge_page"]
    code = r["code_bytes"]
    linker = f", linked by {r['linker']}" if r["linker"] else ""
    lines = [
        f"{path}: {r['arch']} {r['kind']}, {r['layout']} layout{linker}",
        f"  code {human(code)} in an executable segment of {human(r['exec_segment_size'])}; "
        f"split point {r['split']:#x} ({r['split_section']})",
    ]
    before = 100.0 * r["covered_before"] / code if code else 0.0
    lines.append(f"  huge pages of {human(hp)}: {before:.1f}% of the code today")
    limit = r["exposure_limit"]
    lines.append(_plan_line("shift", r["plans"]["shift"], code, r["chosen"], limit))
    lines.append(_plan_line("align", r["plans"]["align"], code, r["chosen"], limit))
    if r["refusal"]:
        ref = r["refusal"]
        lines.append(f"  refused: {ref['detail']} ({ref['reason']})")
    lines.append("  windows of " + human(hp) + " (R read-only, X executable, W writable, ^ huge page):")
    lines += [f"  {line}".rstrip() for line in picture(r["segments"], r["windows_before"], hp, "before", width - 2)]
    after = r["plans"]["shift" if r["chosen"] == "shift" else "align"]
    if r["chosen"] and after["ok"] is True:
        lines += [f"  {line}".rstrip() for line in picture(after["segments"], after["windows"], hp, "after", width - 2)]
    return "\n".join(lines)


def transform_line(path: str, r: Rewritten) -> str:
    """One line saying what `hugify transform` did."""
    res = r["result"]
    code = r["code_bytes"]
    cover = 100.0 * res["covered_code"] / code if code else 0.0
    dropped = r.get("dropped_signatures")
    note = f"; dropped the stale signature {', '.join(dropped)} (re-sign it)" if dropped else ""
    return (
        f"{path}: transformed ({res['mode']}): dv={res['dv']:#x} df={res['df']:#x}, "
        f"growth {human(res['growth'])}, code on huge pages {cover:.1f}%"
        f"{exposure_text(res, r['exposure_limit'])}{displaced_text(res)}{note}"
    )
