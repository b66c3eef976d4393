"""Ways of getting a command's code onto huge pages, side by side in one interleaved
run: `hugify try`'s comparison with more than one changed side (bench/speedup.py;
bench/README.md, "The ways").

`hugify try` (hugify.trial.session) compares the original files with hugify's copies.
A WaysTrial runs the same comparison, with the same parts, for any number of ways,
each a side of its own in the same rounds:

* the original files, twice per round (A and A2: the A/A floor), as in hugify try;
* ``hugify``: hugify's copies bound over the originals, their windows loaded as 2 MiB
  folios before each run (hugify try's file way);
* ``hugify-shared`` (root only): the copies on a tmpfs without huge pages, their code
  mapped from root's shared copies (hugify try's shared way);
* any way the caller describes with a Way, planned once the first run has found the
  objects under test: files shown over paths in its namespace (a peer's rewrite of the
  objects, another glibc's libraries), each object's either bound as it is or first
  copied to a file of the way's own (so that no other way's page cache state reaches
  it), and variables added to the command's environment (a preload library, a glibc
  tunable). Its files are evicted at the start; before each run they are read ahead
  like the originals (`readahead`) or left as the way's own runs left them
  (`as-left`: for a way whose own runs decide the folios its files are cached in,
  such as glibc's advice on a cold start, or a runtime that collapses them itself).

Rounds go in a balanced order (abtest.balanced_order). Every run is watched (WaySampler)
for which file of each object it mapped and how much of the object's code one process
had on huge pages: FilePmdMapped and ShmemPmdMapped of its mappings, and AnonHugePages
of anonymous executable mappings inside the object's span (its code copied there, as a
preload library does). A way leaves the rounds, its column saying why, when a run of
it behaves differently from the originals' (exit status, output, --compare-files) or
maps another way's files, and after its untimed run when that run had no code of the
objects on huge pages: it is reported as such, not timed as if it had them. The
figures per way are hugify try's: its CPU and wall time over the originals' per round,
median and 95 % interval (hugify.abtest), beside the A/A floor.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hugify import abtest, files, reasons
from hugify import prefetch as pf
from hugify.engine import GOOD_STATES
from hugify.kernel import Vma
from hugify.trial import report
from hugify.trial.cache import Cache, Usable
from hugify.trial.pagecache import PageCache, advise, cache_drops
from hugify.trial.session import Behaviour, Options, Trial, TryError, _sha256, first_difference
from hugify.trial.sharedway import Mounts
from hugify.trial.sides import Bind, Result, Side
from hugify.trial.watch import Sampler, of_inodes

HUGIFY, HUGIFY_SHARED = "hugify", "hugify-shared"
BUILT_IN = (HUGIFY, HUGIFY_SHARED)
READAHEAD, AS_LEFT = "readahead", "as-left"
#: A way's status: timed, or why not.
MEASURED, NO_HUGE_PAGES, DIFFERS, FAILED, UNAVAILABLE = (
    "measured",
    "no-huge-pages",
    "behaviour-differs",
    "failed",
    "unavailable",
)


class WayUnavailable(Exception):
    """A way cannot run here (its tool failed to build, needs root, ...): one line why."""


@dataclass(frozen=True)
class UnderTest:
    """An object the command loads with enough code: its original, and hugify's copy."""

    original: str
    hugified: Path


@dataclass
class Context:
    """What a way's plan is made from."""

    objects: list[UnderTest]
    scratch: Path  # a directory of the way's own, removed with the run
    env: dict[str, str]  # the command's environment
    #: The comparison's own mounts (root, in its own mount namespace; None otherwise):
    #: what a plan mounts there is seen by its side and detached at the end.
    mounts: Mounts | None


@dataclass
class Plan:
    """A way's side: what its namespace shows and what its runs' environment adds."""

    #: path -> a file shown there as it is
    binds: dict[str, Path] = field(default_factory=dict)
    #: path -> a file copied to one of the way's own, shown there
    copies: dict[str, Path] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    page_cache: str = READAHEAD  # or AS_LEFT
    #: original -> what the way runs of it ("rewritten by ...", "refused by ...: the original")
    objects: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Way:
    """A way a caller adds: its name, a line saying what it is, and its plan."""

    name: str
    what: str
    plan: Callable[[Context], Plan]


def bind(file: Path, target: str) -> Bind:
    """A file of the benchmark's own shown at `target` in a side's namespace (the
    inode at its path now is the one the bind mount must show)."""
    return Bind(file, target, files.identity(os.stat(file)))


# --- watching ------------------------------------------------------------------------------


@dataclass
class Got:
    """What the runs of one way mapped of one object: the most of its code in one
    process at one time, per kind of huge page and in all."""

    mapped: set[str] = field(default_factory=set)  # "own", "foreign" (another way's file)
    file_pmd: int = 0
    shmem_pmd: int = 0
    anon_huge: int = 0
    huge: int = 0
    rss: int = 0

    def add(self, other: Got) -> None:
        self.mapped |= other.mapped
        for f in ("file_pmd", "shmem_pmd", "anon_huge", "huge", "rss"):
            setattr(self, f, max(getattr(self, f), getattr(other, f)))

    def as_json(self) -> dict[str, Any]:
        return {
            "mapped": sorted(self.mapped),
            "file_pmd_mapped": self.file_pmd,
            "shmem_pmd_mapped": self.shmem_pmd,
            "anon_huge_pages": self.anon_huge,
            "huge": self.huge,
            "resident_code": self.rss,
        }


class WaySampler(Sampler):
    """A timed run's watcher for one way: `own` (device, inode) -> the object it is a
    file of, for this way; `foreign`: the objects' files of the other ways."""

    def __init__(self, root: int, own: dict[tuple[int, int], str], foreign: dict[tuple[int, int], str]) -> None:
        super().__init__(root)
        self.files = {**{k: (v, "foreign") for k, v in foreign.items()}, **{k: (v, "own") for k, v in own.items()}}
        self.by_inode: dict[int, list[tuple[int, int]]] = {}
        for key in self.files:
            self.by_inode.setdefault(key[1], []).append(key)
        self.got: dict[str, Got] = {name: Got() for name, _ in self.files.values()}

    def _which(self, v: Vma) -> tuple[str, str] | None:
        keys = self.by_inode.get(v.inode, [])
        exact = [k for k in keys if k == (v.dev, v.inode)]
        if exact:
            return self.files[exact[0]]
        # btrfs: stat's st_dev is the subvolume's, maps shows the filesystem's
        return self.files[keys[0]] if len(keys) == 1 else None

    def look(self, pid: int) -> None:
        maps = of_inodes(pid, {*self.by_inode, 0})
        per: dict[str, Got] = {}
        spans: dict[str, tuple[int, int]] = {}
        for v, sizes in maps:
            if not v.inode:
                continue
            hit = self._which(v)
            if hit is None:
                continue
            name, kind = hit
            g = per.setdefault(name, Got())
            g.mapped.add(kind)
            lo, hi = spans.get(name, (v.start, v.end))
            spans[name] = (min(lo, v.start), max(hi, v.end))
            if v.executable:
                g.file_pmd += sizes.get("FilePmdMapped", 0)
                g.shmem_pmd += sizes.get("ShmemPmdMapped", 0)
                g.rss += sizes.get("Rss", 0)
        for v, sizes in maps:  # code copied into anonymous memory inside an object's span
            if v.inode or not v.executable or v.path.startswith("["):
                continue
            for name, (lo, hi) in spans.items():
                if lo <= v.start and v.end <= hi:
                    per[name].anon_huge += sizes.get("AnonHugePages", 0)
                    per[name].rss += sizes.get("Rss", 0)
        for name, g in per.items():
            g.huge = g.file_pmd + g.shmem_pmd + g.anon_huge
            self.got[name].add(g)


# --- the comparison ------------------------------------------------------------------------


@dataclass
class _Column:
    """One way in the run."""

    name: str
    what: str
    status: str = MEASURED
    reason: str | None = None
    side: Side | None = None
    env: dict[str, str] = field(default_factory=dict)
    before: Callable[[], None] = lambda: None
    #: original -> the file of it this way's runs must map (device, inode)
    own: dict[str, tuple[int, int]] = field(default_factory=dict)
    shared: PageCache | None = None  # hugify-shared: its shared copies are its own too
    shared_of: dict[str, str] = field(default_factory=dict)  # its copy -> the original
    objects: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    got: dict[str, Got] = field(default_factory=dict)
    runs: int = 0
    runs_huge: int = 0
    dropped: int = 0  # runs during which another process dropped the page cache

    def drop(self, status: str, reason: str) -> None:
        self.status, self.reason = status, reason


@dataclass
class _Run:
    result: Result
    behaviour: Behaviour
    stdout: Path
    got: dict[str, Got]


def _identity(path: str | Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


class WaysTrial(Trial):
    """The comparison of the module's docstring: the original files and `ways` (built-in
    names of BUILT_IN, or Ways)."""

    def __init__(self, opts: Options, ways: list[str | Way]) -> None:
        root = os.geteuid() == 0
        # root's comparison runs in a mount namespace of its own (the shared way's
        # store, the mounts a plan makes); hugify try's shared way makes it so
        opts.way = "shared" if root else "file"
        super().__init__(opts)
        self.ways = ways
        self.columns: dict[str, _Column] = {}
        self.file_pages: PageCache | None = None
        self.made = 0
        #: What the originals' runs mapped of the objects (an original whose code the
        #: kernel happens to map huge is said).
        self.original_got: dict[str, Got] = {}
        self.problems: list[str] = []

    def _compare(self, cache: Cache, prefetcher: pf.Prefetcher) -> dict[str, Any]:
        assert self.scratch is not None
        rdir = self.scratch / "run"
        rdir.mkdir()
        os.chmod(rdir, 0o755)  # the audit library takes shared copies only from a directory root's alone
        if HUGIFY_SHARED in self.ways:
            # A command that runs processes as another user (a server started as
            # nobody) reaches the shared copies through the scratch directory: it may be
            # passed through, not listed or read (what it holds is root's alone).
            os.chmod(self.scratch, 0o711)
        original = self._side("original", [])
        first = self._first_run(original)
        usable = self._copies(first, cache)
        originals = [c.original for c in usable]
        self.file_pages = PageCache(prefetcher, usable)
        for way in self.ways:
            name = way if isinstance(way, str) else way.name
            col = self.columns[name] = _Column(name, _BUILT_IN_WHAT.get(name, "") if isinstance(way, str) else way.what)
            try:
                if way == HUGIFY:
                    self._hugify(col, usable)
                elif way == HUGIFY_SHARED:
                    self._hugify_shared(col, usable, rdir, prefetcher)
                elif isinstance(way, Way):
                    self._planned(col, way, usable)
                else:
                    raise WayUnavailable(f"no such way: {way}")
            except WayUnavailable as e:
                col.drop(UNAVAILABLE, str(e))
            except OSError as e:
                col.drop(FAILED, reasons.io_detail(e))
            except TryError as e:
                col.drop(FAILED, f"{e.detail} ({e.reason})")
        self.found.pop("way", None)  # the shared way's, set by hugify try's preparation
        prepared = self.file_pages.start(skip=[s.pid for s in self.sides.values()])
        for path, why in prepared.kept.items():
            self.note(f"{path} is left in the page cache as it is ({why})")
        self.found["prefetched"] = {
            path: {"windows": len(t.windows), "huge": t.count(*GOOD_STATES)} for path, t in prepared.windows.items()
        }
        foreign = self._all_files(originals)
        rounds, stopped = self._way_rounds(foreign, originals)
        return self._ways_result(rounds, stopped)

    # --- the ways' sides ----------------------------------------------------------------

    def _hugify(self, col: _Column, usable: list[Usable]) -> None:
        col.side = self._side(col.name, [bind(c.file, c.original) for c in usable])
        col.env = dict(self.opts.env)
        pages = self.file_pages
        assert pages is not None
        col.before = lambda: pages.before(True)
        col.own = {c.original: _identity(c.file) for c in usable}
        col.objects = {c.original: f"hugify's copy, {c.file}" for c in usable}

    def _hugify_shared(self, col: _Column, usable: list[Usable], rdir: Path, prefetcher: pf.Prefetcher) -> None:
        if not self.mounts.entered:
            raise WayUnavailable("root's shared copies are root's to make (run as root)")
        moved = self._shared_store(list(usable), rdir)  # TryError where it cannot be had
        pages = PageCache(prefetcher, moved, self.shared_budget)
        col.env = self._prepare(pages, prefetcher)  # the shared way's environment, its copies made
        col.side = self._side(col.name, [bind(c.file, c.original) for c in moved])
        col.before = lambda: pages.before(True)
        col.own = {c.original: _identity(c.file) for c in moved}
        col.shared = pages
        col.shared_of = {str(c.file): c.original for c in moved}
        col.objects = {c.original: f"hugify's copy on a tmpfs without huge pages, {c.file}" for c in moved}

    def _planned(self, col: _Column, way: Way, usable: list[Usable]) -> None:
        assert self.scratch is not None
        home = self.scratch / "ways" / way.name
        home.mkdir(parents=True)
        ctx = Context(
            [UnderTest(c.original, c.file) for c in usable],
            home,
            dict(self.opts.env),
            self.mounts if self.mounts.entered else None,
        )
        plan = way.plan(ctx)
        shown = dict(plan.binds)
        try:
            for n, (target, source) in enumerate(sorted(plan.copies.items())):
                d = home / "copies" / str(n)
                d.mkdir(parents=True)
                own = d / Path(target).name
                shutil.copyfile(source, own)
                os.chmod(own, os.stat(source).st_mode & 0o555)
                shown[target] = own
        except OSError as e:
            raise WayUnavailable(f"cannot copy its files: {reasons.io_detail(e)}") from None
        originals = [c.original for c in usable]
        mine = [shown[o] for o in originals if o in shown]
        advise(mine, os.POSIX_FADV_DONTNEED)  # brought in by its own runs
        col.side = self._side(way.name, [bind(f, t) for t, f in sorted(shown.items())])
        col.env = {**self.opts.env, **plan.env}
        plain = [o for o in originals if o not in shown]
        if plan.page_cache == READAHEAD:
            col.before = lambda: advise([*mine, *plain], os.POSIX_FADV_WILLNEED)
        col.own = {o: _identity(shown.get(o, o)) for o in originals}
        col.objects = {o: plan.objects.get(o, f"{shown[o]}" if o in shown else "the original") for o in originals}
        col.notes = plan.notes

    def _all_files(self, originals: list[str]) -> dict[tuple[int, int], str]:
        """Every way's file of every object, and the originals: (device, inode) -> object."""
        out = {_identity(o): o for o in originals}
        for col in self.columns.values():
            out.update({key: o for o, key in col.own.items()})
        return out

    # --- the runs -----------------------------------------------------------------------

    def _one(self, label: str, foreign: dict[tuple[int, int], str], originals: list[str]) -> _Run:
        """One run of a way (abtest's labels A and A2: the originals)."""
        assert self.scratch is not None and self.file_pages is not None
        self.made += 1
        if label in (abtest.ORIGINAL, abtest.ORIGINAL_AGAIN):
            side, env = self.sides["original"], self.opts.env
            self.file_pages.before(False)
            own = {_identity(o): o for o in originals}
            col = None
        else:
            col = self.columns[label]
            assert col.side is not None
            side, env = col.side, col.env
            col.before()
            own = {key: o for o, key in col.own.items()}
            if col.shared is not None:
                own.update({key: col.shared_of[c] for key, c in col.shared.shared_copies().items()})
        sampler = WaySampler(side.pid, own, {k: v for k, v in foreign.items() if k not in own})
        out, err = self.scratch / f"w{self.made}.stdout", self.scratch / f"w{self.made}.stderr"
        drops = cache_drops()
        try:
            res = side.run(
                self.program, self.opts.argv, env, self.opts.cwd, stdout=out, stderr=err,
                started=lambda _: sampler.start(),
            )  # fmt: skip
        finally:
            if sampler.is_alive():
                sampler.finish()
        files = {p: _sha256(os.path.join(self.opts.cwd, p)) for p in self.opts.compare_files}
        if col is None:
            for name, g in sampler.got.items():
                self.original_got.setdefault(name, Got()).add(g)
                if "foreign" in g.mapped:
                    self.problems.append(f"a run of the originals mapped another way's file of {name}")
        else:
            col.runs += 1
            col.runs_huge += any(g.huge for g in sampler.got.values())
            col.dropped += cache_drops() != drops
            for name, g in sampler.got.items():
                col.got.setdefault(name, Got()).add(g)
        return _Run(res, Behaviour(res.status, _sha256(out), files), out, sampler.got)

    def _active(self) -> list[_Column]:
        return [c for c in self.columns.values() if c.status == MEASURED]

    def _judge(self, col: _Column, run: _Run, a: _Run, *, untimed: bool) -> None:
        """Drops the way from the rounds where its run differs from the originals', used
        another way's files, or (its untimed run) had no code on huge pages."""
        diff = a.behaviour.differences(run.behaviour)
        if diff:
            why = f"its run differs from the originals' in {', '.join(diff)}"
            if "standard output" in diff:
                why += f"; standard output at {first_difference(a.stdout, run.stdout)}"
            if run.result.status != 0:
                tail = run.stdout.with_suffix(".stderr").read_text(errors="replace").strip().splitlines()[-1:]
                why += f" ({run.result.status_text}{': ' + tail[0][:200] if tail else ''})"
            col.drop(DIFFERS, why)
            return
        foreign = sorted(o for o, g in run.got.items() if "foreign" in g.mapped)
        if foreign:
            col.drop(FAILED, f"a run mapped another way's file of {foreign[0]}")
            return
        if untimed and not any(g.huge for g in run.got.values()):
            col.drop(NO_HUGE_PAGES, "its untimed run had none of the objects' code on huge pages")

    def _way_rounds(
        self, foreign: dict[tuple[int, int], str], originals: list[str]
    ) -> tuple[list[dict[str, _Run]], str]:
        opts = self.opts
        opts.progress("untimed runs: the original files twice, then each way")
        a, again = (self._one(label, foreign, originals) for label in (abtest.ORIGINAL, abtest.ORIGINAL_AGAIN))
        self._same_on_originals(a, again)
        for col in self._active():
            self._judge(col, self._one(col.name, foreign, originals), a, untimed=True)
        self._forget(a, again)
        rounds: list[dict[str, _Run]] = []
        start = time.monotonic()
        while self._active():
            labels = [abtest.ORIGINAL, abtest.ORIGINAL_AGAIN, *(c.name for c in self._active())]
            runs = {label: self._one(label, foreign, originals) for label in abtest.balanced_order(labels, len(rounds))}
            self._same_on_originals(runs[abtest.ORIGINAL], runs[abtest.ORIGINAL_AGAIN])
            for col in self._active():
                self._judge(col, runs[col.name], runs[abtest.ORIGINAL], untimed=False)
            rounds.append(runs)
            self._forget(*runs.values())
            elapsed = time.monotonic() - start
            why = [opts.limits.stop(_ratios(rounds, c.name, "cpu"), elapsed) for c in self._active()]
            if all(why):  # every way's interval is narrow enough, or the limits are reached
                return rounds, next((w for w in why if w and not w.startswith("95 %")), str(why[0]))
            opts.progress(f"round {len(rounds)} of {len(labels)} runs; {elapsed:.0f} s of {opts.limits.budget:.0f} s")
        return rounds, "no way left to time"

    def _same_on_originals(self, a: _Run, again: _Run) -> None:
        diff = a.behaviour.differences(again.behaviour)
        if diff:
            where = (
                f"; standard output at {first_difference(a.stdout, again.stdout)}" if "standard output" in diff else ""
            )
            raise TryError(
                "not-deterministic",
                f"two runs on the original files differ in {', '.join(diff)}{where}: the ways cannot be compared",
                self.found,
            )

    @staticmethod
    def _forget(*runs: _Run) -> None:
        for r in runs:
            r.stdout.unlink(missing_ok=True)
            r.stdout.with_suffix(".stderr").unlink(missing_ok=True)

    # --- the result ---------------------------------------------------------------------

    def _ways_result(self, rounds: list[dict[str, _Run]], stopped: str) -> dict[str, Any]:
        aa_cpu, aa_wall = _ratios(rounds, abtest.ORIGINAL_AGAIN, "cpu"), _ratios(rounds, abtest.ORIGINAL_AGAIN, "wall")
        floor = {
            "cpu": abtest.ratio_summary(aa_cpu) if aa_cpu else None,
            "wall": abtest.ratio_summary(aa_wall) if aa_wall else None,
        }
        ways: dict[str, Any] = {}
        for col in self.columns.values():
            cpu, wall = _ratios(rounds, col.name, "cpu"), _ratios(rounds, col.name, "wall")
            entry: dict[str, Any] = {
                "what": col.what,
                "status": col.status,
                "reason": col.reason,
                "rounds": sum(col.name in r for r in rounds),
                "cpu": abtest.ratio_summary(cpu) if cpu and col.status == MEASURED else None,
                "wall": abtest.ratio_summary(wall) if wall and col.status == MEASURED else None,
                "objects": {
                    o: {"runs": what, **col.got.get(o, Got()).as_json()} for o, what in sorted(col.objects.items())
                },
                "huge": sum(g.huge for g in col.got.values()),
                "runs": col.runs,
                "runs_with_huge_pages": col.runs_huge,
                "runs_with_cache_dropped": col.dropped,
                "notes": col.notes,
            }
            if entry["cpu"]:
                verdict, _ = report.answer(
                    {
                        "cpu": entry["cpu"],
                        "noise_floor": floor,
                        "coverage": {"hugified_pmd_mapped": entry["huge"]},
                        "limits": {"target": self.opts.limits.target},
                    }
                )
                entry["verdict"] = verdict
            ways[col.name] = entry
        per_round = [
            {
                "order": list(r),
                **{f"{label}_cpu_s": round(t.result.cpu, 4) for label, t in r.items()},
                **{f"{label}_wall_s": round(t.result.wall, 4) for label, t in r.items()},
            }
            for r in rounds
        ]
        return {
            **self.found,
            "hugify_try_ways": 1,
            "rounds": len(rounds),
            "stopped": stopped,
            "noise_floor": floor,
            "original_cpu_s": statistics.median(r[abtest.ORIGINAL].result.cpu for r in rounds) if rounds else None,
            "original_wall_s": statistics.median(r[abtest.ORIGINAL].result.wall for r in rounds) if rounds else None,
            "ways": ways,
            "originals": {o: g.as_json() for o, g in sorted(self.original_got.items())},
            "problems": sorted(set(self.problems)),
            "per_round": per_round,
            "limits": self.opts.limits.as_json(),
        }


_BUILT_IN_WHAT = {
    HUGIFY: "hugify's copies, their windows loaded as 2 MiB folios in their page cache",
    HUGIFY_SHARED: "hugify's copies on a tmpfs without huge pages, their code mapped from root's shared copies",
}


def _ratios(rounds: list[dict[str, _Run]], label: str, what: str) -> list[float]:
    """Per round that ran `label`: its CPU or wall time over the original's (rounds
    where the original's took no measurable time left out)."""
    out = []
    for r in rounds:
        base = getattr(r[abtest.ORIGINAL].result, what)
        if label in r and base > 0:
            out.append(getattr(r[label].result, what) / base)
    return out


def run(opts: Options, ways: list[str | Way]) -> dict[str, Any]:
    """The comparison of the module's docstring; TryError when it stops early (the
    command fails or is not deterministic on the original files, nothing to try)."""
    return WaysTrial(opts, ways).run()
