"""Human-readable reports: the plan summary and a picture of the loadable segments
against huge-page windows, before and after, in the spirit of Figure 3 of the
Hugifier paper."""

from __future__ import annotations

from typing import Any

from hugify.sizes import human

PT_LOAD = 1
PF_X, PF_W = 1, 2
WINDOW_CHARS = 8
MAX_WINDOWS = 20


def _loads(segments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in segments if s["type"] == PT_LOAD]


def _kind(seg: dict[str, Any]) -> str:
    if seg["flags"] & PF_X:
        return "X"
    if seg["flags"] & PF_W:
        return "W"
    return "R"


def _huge_windows(loads: list[dict[str, Any]], hp: int) -> set[int]:
    """Windows that lie wholly inside an executable load whose file offset is
    congruent to its address: those can be mapped with one huge page each."""
    out: set[int] = set()
    for s in loads:
        if not s["flags"] & PF_X or s["offset"] % hp != s["vaddr"] % hp:
            continue
        first = -(-s["vaddr"] // hp)
        last = (s["vaddr"] + s["memsz"]) // hp
        out.update(range(first, last))
    return out


def picture(segments: list[dict[str, Any]], hp: int, label: str) -> list[str]:
    """Two lines: the segments per window (R, X, W, '.' for nothing), and '^' under
    every window that can be a huge page."""
    loads = _loads(segments)
    end = max((s["vaddr"] + s["memsz"] for s in loads), default=0)
    nwin = max(1, -(-end // hp))
    windows = list(range(nwin))
    if nwin > MAX_WINDOWS:
        half = MAX_WINDOWS // 2
        windows = [*windows[:half], -1, *windows[-half:]]
    huge = _huge_windows(loads, hp)
    step = hp // WINDOW_CHARS
    top, bottom = [], []
    for w in windows:
        if w < 0:
            top.append(f" …{nwin - 2 * (MAX_WINDOWS // 2)} windows… ")
            bottom.append(" " * len(top[-1]))
            continue
        cells = []
        for c in range(WINDOW_CHARS):
            lo, hi = w * hp + c * step, w * hp + (c + 1) * step
            best, best_len = ".", 0
            for s in loads:
                overlap = min(hi, s["vaddr"] + s["memsz"]) - max(lo, s["vaddr"])
                if overlap > best_len:
                    best, best_len = _kind(s), overlap
            cells.append(best)
        top.append("".join(cells))
        bottom.append(("^" if w in huge else " ") * WINDOW_CHARS)
    return [f"{label:<8}|" + "|".join(top) + "|", " " * 9 + " ".join(bottom)]


def _plan_line(name: str, plan: dict[str, Any], code: int, chosen: str | None) -> str:
    mark = "  <- chosen" if name == chosen else ""
    if not plan["ok"]:
        return f"    {name:<6} not possible: {plan['detail']} ({plan['reason']})"
    cover = 100.0 * plan["covered_code"] / code if code else 0.0
    return (
        f"    {name:<6} dv={plan['dv']:#x} df={plan['df']:#x} growth {human(plan['growth'])}, "
        f"code on huge pages {cover:.1f}%{mark}"
    )


def inspect_text(path: str, r: dict[str, Any]) -> str:
    """The report `hugify inspect` prints for one file."""
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
    for name in ("shift", "align"):
        lines.append(_plan_line(name, r["plans"][name], code, r["chosen"]))
    if r["refusal"]:
        ref = r["refusal"]
        lines.append(f"  refused: {ref['detail']} ({ref['reason']})")
    lines.append("  windows of " + human(hp) + " (R read-only, X executable, W writable, ^ huge page):")
    lines += ["  " + line for line in picture(r["segments"], hp, "before")]
    if r["chosen"]:
        after = r["plans"][r["chosen"]]["segments"]
        lines += ["  " + line for line in picture(after, hp, "after")]
    return "\n".join(lines)


def transform_line(path: str, r: dict[str, Any]) -> str:
    """One line saying what `hugify transform` did."""
    res = r["result"]
    code = r["code_bytes"]
    cover = 100.0 * res["covered_code"] / code if code else 0.0
    dropped = r.get("dropped_signatures")
    note = f"; dropped the stale signature {', '.join(dropped)} (re-sign it)" if dropped else ""
    return (
        f"{path}: transformed ({res['mode']}): dv={res['dv']:#x} df={res['df']:#x}, "
        f"growth {human(res['growth'])}, code on huge pages {cover:.1f}%{note}"
    )
