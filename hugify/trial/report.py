"""The answer of `hugify try`: one line a person can act on, the figures as text, a
terminal plot of the per-round ratios, and the same plot as an SVG file (written by
hand: no plotting library)."""

from __future__ import annotations

import shlex
from html import escape
from typing import Any

from hugify.abtest import change, percent, percent_interval

MIB = 1 << 20


def mib(n: float | None) -> str:
    return f"{(n or 0) / MIB:.1f} MiB"


def interval(r: dict[str, Any] | None) -> str:
    """A ratio_summary as "median [low, high]"."""
    if not r:
        return "-"
    ci = r["ci95"]
    return f"{r['median']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{r['median']:.3f} [no interval]"


def huge_bytes(result: dict[str, Any]) -> int:
    """Code the hugified side had on huge pages (the most in one process at one time,
    summed over the objects), or held in anonymous copies."""
    cov = result["coverage"]
    return int(cov["anonymous_held"] if result.get("way") == "anonymous" else cov["hugified_pmd_mapped"])


#: The verdicts that are no answer about the command, and their reason ids: the
#: method could not measure it (exit status 8).
FAILED = {"unmeasurable": "runs-unseen", "control-failed": "control-failed"}


def answer(result: dict[str, Any]) -> tuple[str, str]:
    """(verdict, one line): gain, loss, no-gain, no-huge-pages or no-interval; for
    the A/A control, control-passed or control-failed; unmeasurable where the watcher
    saw too few of the hugified side's runs to tell what they ran on."""
    cpu, floor = result["cpu"], result["noise_floor"]["cpu"]
    huge = huge_bytes(result)
    seen = result.get("verified_runs", {}).get("hugified", {"seen": 0, "runs": 0})
    if 2 * seen["seen"] < seen["runs"]:
        return (
            "unmeasurable",
            f"cannot measure: the watcher saw {seen['seen']} of the hugified side's {seen['runs']} runs use its "
            "copies (its processes live too briefly to be watched, or load none of them), so what they ran on "
            f"cannot be told ({FAILED['unmeasurable']})",
        )
    if not cpu or not cpu["ci95"]:
        return "no-interval", "one round gives no interval: give --min-rounds 2 or more"
    lo, hi = cpu["ci95"]
    flo, fhi = floor["ci95"] if floor and floor["ci95"] else (1.0, 1.0)
    if result.get("control"):
        interval = f"CPU time [{change(lo)}, {change(hi)}] % (A/A noise floor [{change(flo)}, {change(fhi)}] %)"
        if lo <= 1 <= hi:
            return "control-passed", f"A/A control: {interval}: no difference claimed where nothing differs"
        return (
            "control-failed",
            f"A/A control: {interval}: the interval excludes 0 where nothing differs but the files' inodes; on this "
            f"machine, for this command, results of that size are not evidence ({FAILED['control-failed']})",
        )
    # a difference is claimed only outside 1 and clear of the A/A floor's interval
    faster, slower = hi < 1 and hi < flo, lo > 1 and lo > fhi
    if not huge:
        return (
            "no-huge-pages",
            "no gain possible as measured: the hugified side ran no code on huge pages "
            f"(way: {result.get('way')}; see the notes and `hugify status`)",
        )
    on_huge = f"{mib(huge)} of code on huge pages"
    if faster:
        return "gain", f"CPU time {percent_interval(cpu)} with {on_huge}: hugified files make this command faster here"
    if slower:
        return "loss", f"CPU time {percent_interval(cpu)} with {on_huge}: hugified files make this command slower here"
    more = ""
    if cpu["half_width"] is not None and cpu["half_width"] > result["limits"]["target"]:
        more = "; a longer --budget or a quieter machine would narrow the interval"
    floor_text = f" (A/A noise floor [{change(flo)}, {change(fhi)}] %)" if floor else ""
    return "no-gain", f"no gain shown: CPU time [{change(lo)}, {change(hi)}] %{floor_text} with {on_huge}{more}"


def _round_ratios(result: dict[str, Any], what: str = "cpu") -> tuple[list[float], list[float]]:
    """Per round: hugified/original and original/original (A2/A)."""
    b, aa = [], []
    for r in result["per_round"]:
        a = r[f"A_{what}_s"]
        if a > 0:
            b.append(r[f"B_{what}_s"] / a)
            aa.append(r[f"A2_{what}_s"] / a)
    return b, aa


def terminal_plot(result: dict[str, Any], width: int = 60, height: int = 9) -> list[str]:
    """The per-round CPU-time ratios: `o` hugified/original, `.` original/original
    (the A/A floor), `*` both in one cell, `-` no change."""
    b, aa = _round_ratios(result)
    if not b:
        return []
    values = [*b, *aa, 1.0]
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.05 or 0.01
    lo, hi = lo - pad, hi + pad
    per = -(-len(b) // width)  # rounds per column
    cols = -(-len(b) // per)
    grid = [[" "] * cols for _ in range(height)]

    def row(v: float) -> int:
        return min(height - 1, max(0, round((hi - v) / (hi - lo) * (height - 1))))

    one = row(1.0)
    for c in range(cols):
        grid[one][c] = "-"
    for i, (x, y) in enumerate(zip(b, aa, strict=True)):
        c = i // per
        for v, mark in ((y, "."), (x, "o")):
            cell = grid[row(v)][c]
            grid[row(v)][c] = "*" if cell in ".o" and cell != mark else mark
    lines = []
    for i, cells in enumerate(grid):
        v = hi - (hi - lo) * i / (height - 1)
        label = "0 %" if i == one else percent(v) if i in (0, height - 1) else ""
        lines.append(f"  {label:>9} |{''.join(cells)}")
    span = f"rounds 1-{len(b)}" + (f", {per} per column" if per > 1 else "")
    lines.append(f"  {'':>9} +{'-' * cols}")
    lines.append(f"  {'':>9}  {span}; o hugified/original, . original/original (A/A), * both")
    return lines


def text(result: dict[str, Any]) -> str:
    """The report for people (the answer last)."""
    out = [f"hugify try: {shlex.join(result['command'])}"]
    objects = result.get("objects", [])
    used = [o for o in objects if o["copy"]]
    for o in used:
        cov = o.get("seen", {})
        h, a = cov.get("hugified", {}), cov.get("original", {})
        windows = f", {h.get('windows_huge', 0)}/{h.get('windows', 0)} windows seen huge" if h else ""
        seen = f"; seen {mib(h.get('pmd_mapped'))} PMD-mapped (original {mib(a.get('pmd_mapped'))})" if h else ""
        how = f"{o['status']} ({o['mode']})" if o.get("mode") else o["status"]
        cached = ", cached" if o["cached"] else ""
        out.append(f"  {o['path']}: {how}{cached}{windows}{seen}")
    for o in objects:
        if not o["copy"]:
            out.append(f"  {o['path']}: {o['status']} ({o.get('reason')}): {o.get('detail')}")
    skipped = result.get("skipped", {})
    if skipped:
        out.append(f"  {len(skipped)} more object(s) not tried (below the threshold, or privileged)")
    way = result.get("way")
    if result.get("control"):
        side = "plain copies of the originals (--control: an A/A run)"
    else:
        side = {
            "file": "the copies' page cache in 2 MiB folios",
            "shared": "root's shared copies on a huge-page tmpfs (the copies' own filesystem gives no 2 MiB folios)",
        }.get(str(way), "the runtime's anonymous copies")
    out.append(f"  the hugified side: {side}")
    out.append(
        f"  {result['rounds']} rounds of 3 runs (stopped: {result['stopped']}); "
        f"original: {result['original_cpu_s']:.3f} s CPU, {result['original_wall_s']:.3f} s wall (medians)"
    )
    floor = result["noise_floor"]
    out.append(f"  {'':11} {'hugified / original':26} {'A/A noise floor':26}")
    out.append(f"  {'CPU time':11} {interval(result['cpu']):26} {interval(floor['cpu']):26}")
    out.append(f"  {'wall time':11} {interval(result['wall']):26} {interval(floor['wall']):26}")
    cov = result["coverage"]
    hugified, original = mib(cov["hugified_pmd_mapped"]), mib(cov["original_pmd_mapped"])
    line = f"  code on huge pages: hugified {hugified}, original {original} (the most in one process at one time)"
    if way == "anonymous":
        line += f"; anonymous copies held {mib(cov['anonymous_held'])}"
    if way == "shared" and cov.get("shared_held") is not None:
        line += f"; shared copies held {mib(cov['shared_held'])} (once, whatever the number of processes)"
    out.append(line)
    v = result["verified_runs"]
    short = any(x["seen"] < x["runs"] for x in v.values())
    out.append(
        f"  runs seen using their own files: hugified {v['hugified']['seen']}/{v['hugified']['runs']}, "
        f"original {v['original']['seen']}/{v['original']['runs']}"
        + (" (the others loaded none of them, or were too short to watch)" if short else "")
    )
    out += terminal_plot(result)
    out += [f"  problem: {p}" for p in result.get("problems", [])]
    out += [f"  note: {n}" for n in result.get("notes", [])]
    cache = result["cache"]
    out.append(f"  cache: {cache['root']}, {mib(cache['bytes'])} (hugify try --clear-cache empties it)")
    stopped = (
        f"(stopped by {result['interrupted']}: {result['rounds']} round(s) only) " if result.get("interrupted") else ""
    )
    out.append(f"answer: {stopped}{answer(result)[1]}")
    return "\n".join(out) + "\n"


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def svg(result: dict[str, Any]) -> str:
    """The per-round CPU-time ratios as a scatter plot with both intervals."""
    b, aa = _round_ratios(result)
    w, h, left, right, top, bottom = 720, 380, 70, 20, 60, 50
    values = [*b, *aa, 1.0]
    for r in (result["cpu"], result["noise_floor"]["cpu"]):
        if r and r["ci95"]:
            values += r["ci95"]
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.08 or 0.01
    lo, hi = lo - pad, hi + pad
    n = max(len(b), 1)

    def x(i: float) -> float:
        return left + (w - left - right) * (i + 0.5) / n

    def y(v: float) -> float:
        return top + (h - top - bottom) * (hi - v) / (hi - lo)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{left}" y="20" font-size="14">hugify try: {escape(_cut(shlex.join(result["command"]), 90))}</text>',
        f'<text x="{left}" y="40">{escape(_cut(answer(result)[1], 110))}</text>',
    ]
    for r, fill in ((result["noise_floor"]["cpu"], "#dddddd"), (result["cpu"], "#c6dbef")):
        if r and r["ci95"]:
            y0, y1 = y(r["ci95"][1]), y(r["ci95"][0])
            parts.append(
                f'<rect x="{left}" y="{y0:.1f}" width="{w - left - right}" height="{max(y1 - y0, 1):.1f}" '
                f'fill="{fill}" opacity="0.8"/>'
            )
    one = f"{y(1.0):.1f}"
    parts.append(f'<line x1="{left}" x2="{w - right}" y1="{one}" y2="{one}" stroke="black" stroke-dasharray="4 3"/>')
    for k in range(5):
        v = lo + (hi - lo) * k / 4
        parts.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{escape(percent(v))}</text>')
        parts.append(f'<line x1="{left - 3}" x2="{left}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="black"/>')
    parts.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{h - bottom}" stroke="black"/>')
    parts.append(f'<line x1="{left}" x2="{w - right}" y1="{h - bottom}" y2="{h - bottom}" stroke="black"/>')
    for i in sorted({0, n - 1, *range(0, n, max(1, n // 8))}):
        parts.append(f'<text x="{x(i):.1f}" y="{h - bottom + 16}" text-anchor="middle">{i + 1}</text>')
    parts.append(f'<text x="{(left + w - right) / 2}" y="{h - 12}" text-anchor="middle">round</text>')
    parts.append(
        f'<text transform="translate(16 {(top + h - bottom) / 2}) rotate(-90)" text-anchor="middle">'
        "CPU time vs original</text>"
    )
    for i, v in enumerate(aa):
        parts.append(f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="3.5" fill="none" stroke="#777777"/>')
    for i, v in enumerate(b):
        parts.append(f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="3.5" fill="#1f5fa8"/>')
    lx, ly = w - right - 250, top + 12
    parts += [
        f'<circle cx="{lx}" cy="{ly}" r="3.5" fill="#1f5fa8"/>',
        f'<text x="{lx + 8}" y="{ly + 4}">hugified / original (band: 95 % interval)</text>',
        f'<circle cx="{lx}" cy="{ly + 16}" r="3.5" fill="none" stroke="#777777"/>',
        f'<text x="{lx + 8}" y="{ly + 20}">original / original: A/A noise floor</text>',
        "</svg>",
    ]
    return "\n".join(parts) + "\n"
