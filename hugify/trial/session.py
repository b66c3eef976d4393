"""One `hugify try` comparison, from the command line to the figures (docs/try.md).

1. The command's program is found as a shell would; a setuid, setgid or
   file-capability program is refused (its privileges would not survive a user
   namespace, nor a copy).
2. The cache opens (its scratch directory holds everything the run writes); one
   another user could change is refused (hugify.trial.cache).
3. The originals' side starts in its namespace and runs the command once
   (hugify.trial.discover): a command that fails there is reported, not measured.
4. Each object it loaded with enough code goes through the cache (a copy made like
   `hugify tree` would, or found from an earlier run).
5. The hugified side starts with the copies bind-mounted over their originals.
6. The page cache is prepared (hugify.trial.pagecache). Where the copies' filesystem
   gives no 2 MiB folios, the hugified side maps its code from root's shared copies
   (hugify.trial.sharedway; root only), else runs with the runtime's anonymous copies
   (LD_AUDIT=libhugify-audit.so, HUGIFY_ANONYMOUS): said in the answer. --way picks
   one of the three.
7. Untimed runs: the originals twice, then the hugified side. Their exit statuses,
   outputs and --compare-files are compared, the two originals' first: a difference
   between them means the command is not deterministic; one between the originals
   and the hugified side only if further runs of the originals agree with the first,
   that they behave differently. Either stops the comparison. So does a command that
   takes too little CPU time to measure (too-short).
8. Rounds (hugify.abtest: A, A2, B in turn), each run watched (hugify.trial.watch),
   each round's behaviour compared as above, until the limits say stop, or a signal
   (SIGINT, SIGTERM, SIGHUP) does: the rounds made so far are reported, marked as
   stopped.
9. The figures, the coverage each side got, and an answer (hugify.trial.report).

Failures that stop it early are TryError: a reason id of the core's table and one
line.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hugify import _core, abtest, files, kernel, reasons, tree
from hugify import prefetch as pf
from hugify.engine import ENGINE_LIB, GOOD_STATES, UNSUPPORTED, Engine, engine_missing, runtime_file
from hugify.hugified import NotHugified, read_hugified
from hugify.policy import Policy
from hugify.trial import discover
from hugify.trial.cache import Cache, CacheError, Copy, UntrustedCache, Usable, default_root
from hugify.trial.pagecache import PageCache, cache_drops
from hugify.trial.sharedway import Mounts, SharedWayError
from hugify.trial.sides import Bind, NamespaceError, Result, Side
from hugify.trial.watch import RunSampler, Seen, Watched

AUDIT_LIB = "libhugify-audit.so"
MIB = 1 << 20
#: Less CPU time than this per run of the original files cannot be measured: such a run
#: is mostly the process's start and exit (exec, mapping and faulting in its files), in
#: which the two sides differ by how their files are cached rather than by what code on
#: huge pages does, and the watcher, looking every 25 ms, sees few of its runs (docs/try.md).
MIN_CPU_S = 0.02
#: Runs of the original files made to tell a non-deterministic command from one whose
#: hugified files behave differently, when the hugified side's first run differs.
CONFIRMING_RUNS = 2


class TryError(Exception):
    """The comparison stops: why (a reason id), in one line, and what was found so far."""

    def __init__(self, reason: str, detail: str, found: dict[str, Any] | None = None) -> None:
        super().__init__(f"{detail} ({reason})")
        self.reason, self.detail, self.found = reason, detail, found or {}


class Interrupted(Exception):
    """A signal stops the comparison (raised by the caller's signal handler): the
    rounds made so far are reported if there are any, else it goes on up."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass
class Options:
    argv: list[str]
    env: dict[str, str]
    cwd: str
    policy: Policy
    limits: abtest.Limits = field(default_factory=abtest.Limits)
    compare_files: list[str] = field(default_factory=list)
    cache_dir: Path | None = None
    way: str = "auto"  # auto | file | anonymous | shared
    #: The A/A control: the hugified side gets plain copies of the originals.
    control: bool = False
    jobs: int = 1
    progress: Callable[[str], None] = lambda text: None


def program_of(argv0: str, env: dict[str, str], cwd: str) -> str:
    """The file the command executes, found like a shell finds it; TryError if none."""
    if "/" in argv0:
        path = os.path.join(cwd, argv0)
        found = path if os.access(path, os.X_OK) else None
    else:
        found = shutil.which(argv0, path=env.get("PATH", os.defpath))
    if not found:
        raise TryError("command-failed", f"{argv0}: command not found")
    return os.path.realpath(found)


def try_policy(extra: Path | None) -> Policy:
    """The effective policy for the copies: the system's layers, then hugify try's
    own default (stripped files are transformed: installed files are stripped, and a
    package build runs hugify before they are), then `extra`. PolicyError if unusable."""
    from hugify import policy

    layers = policy.load(extra)
    own: dict[tuple[str, ...], policy.Setting] = {
        ("refuse_stripped",): policy.Setting(False, "hugify try (the installed files are stripped)")
    }
    at = len(layers.settings) - (1 if extra is not None else 0)
    layers.settings.insert(at, own)
    return policy.resolve(layers, for_build=False)


# --- one run -----------------------------------------------------------------------------


@dataclass
class Behaviour:
    """What the two sides must agree on, of one run."""

    status: int
    stdout: str  # sha256
    files: dict[str, str]  # --compare-files: path -> sha256, or "absent"

    def differences(self, other: Behaviour) -> list[str]:
        out = []
        if self.status != other.status:
            out.append(f"exit status {self.status} vs {other.status}")
        if self.stdout != other.stdout:
            out.append("standard output")
        out += [f"file {p}" for p in self.files if self.files[p] != other.files.get(p)]
        return out


def _sha256(path: str | Path) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except FileNotFoundError:
        return "absent"


def first_difference(a: Path, b: Path) -> str:
    """Where two outputs part: the first line that differs, cut to 160 characters."""
    la = a.read_bytes().decode(errors="replace").splitlines()
    lb = b.read_bytes().decode(errors="replace").splitlines()
    for i, (x, y) in enumerate(zip(la, lb, strict=False), 1):
        if x != y:
            return f"line {i}: {x[:160]!r} vs {y[:160]!r}"
    shorter = min(len(la), len(lb))
    return f"line {shorter + 1}: one output ends after {shorter} lines"


@dataclass
class Timed:
    """One timed run."""

    side: str  # abtest's label
    result: Result
    behaviour: Behaviour
    stdout: Path
    samples: int
    seen: dict[str, Seen]
    anon_held: int
    cache_dropped: bool


class _Runner:
    """Makes one timed run of a side: the page cache prepared, the run watched, its
    behaviour taken down."""

    def __init__(
        self,
        opts: Options,
        scratch: Path,
        pages: PageCache,
        watched: list[Watched],
        *,
        hp: int,
        scan: Engine | None,
        way: str,
    ) -> None:
        self.opts, self.scratch, self.pages, self.watched = opts, scratch, pages, watched
        self.hp, self.scan, self.way = hp, scan, way
        self.sides: dict[str, Side] = {}
        self.envs: dict[str, dict[str, str]] = {}
        self.program = ""
        self.made = 0

    def one(self, label: str) -> Timed:
        self.made += 1
        side = self.sides[label]
        changed = label == abtest.CHANGED
        self.pages.before(changed)
        sampler = RunSampler(
            side.pid,
            self.watched,
            self.hp,
            self.scan,
            anonymous=changed and self.way == "anonymous",
            shared=self.pages.shared_copies() if changed and self.way == "shared" else {},
        )
        out, err = self.scratch / f"{self.made}.stdout", self.scratch / f"{self.made}.stderr"
        drops = cache_drops()
        try:
            res = side.run(
                self.program,
                self.opts.argv,
                self.envs[label],
                self.opts.cwd,
                stdout=out,
                stderr=err,
                started=lambda _: sampler.start(),
            )
        finally:
            if sampler.is_alive():
                sampler.finish()
        files = {p: _sha256(os.path.join(self.opts.cwd, p)) for p in self.opts.compare_files}
        return Timed(
            label,
            res,
            Behaviour(res.status, _sha256(out), files),
            out,
            sampler.samples,
            sampler.seen,
            sampler.anon_held,
            cache_drops() != drops,
        )


# --- the comparison -----------------------------------------------------------------------


class Trial:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.found: dict[str, Any] = {"command": opts.argv, "cwd": opts.cwd, "notes": []}
        self.sides: dict[str, Side] = {}
        self.scratch: Path | None = None
        self.program = ""
        self.hp = kernel.pmd_size()
        self.mounts = Mounts()
        #: The shared copies' store is mounted (root, --way auto or shared): their budget.
        self.shared_budget: int | None = None

    def note(self, text: str) -> None:
        self.found["notes"].append(text)

    def run(self) -> dict[str, Any]:
        """The whole comparison; TryError when it stops early. Leaves nothing behind
        but the cache's entries."""
        opts = self.opts
        program = program_of(opts.argv[0], opts.env, opts.cwd)
        why = discover.privileged(os.stat(program), program)
        if why:
            raise TryError(
                "setuid-program",
                f"{program} is {why}: its privileges would not survive the private namespace, nor a copy",
            )
        self.found["program"] = self.program = program
        for name in (ENGINE_LIB, AUDIT_LIB, discover.RECORD_LIB):
            missing = engine_missing(name)
            if missing:
                raise TryError("no-engine", missing.removesuffix(" (no-engine)"))
        if opts.way == "shared" and os.geteuid() != 0:
            raise TryError(
                "try-shared", "only root makes shared copies: run hugify try as root, or give --way anonymous"
            )
        cache = Cache(opts.cache_dir or default_root(), opts.policy)
        try:
            # checked before anything is written or mounted there
            self.scratch = cache.open()
            if os.geteuid() == 0 and opts.way in ("auto", "shared"):
                try:
                    self.mounts.enter()  # the tmpfs mounts of the shared way are this run's own
                except SharedWayError as e:
                    if opts.way == "shared":
                        raise TryError("try-shared", str(e)) from None
                    self.note(f"no shared copies: {e}")
            with pf.session(str(self.scratch / "run")) as prefetcher:
                problem = prefetcher.system.problem(self.hp)
                if problem:
                    raise TryError("nothing-to-try", problem)
                return self._compare(cache, prefetcher)
        except UntrustedCache as e:
            raise TryError("try-cache-unsafe", str(e), self.found) from None
        except CacheError as e:
            raise TryError("try-cache", str(e), self.found) from None
        finally:
            for side in self.sides.values():
                side.close()
            self.mounts.close()
            if self.scratch:
                cache.remove_scratch(self.scratch)
            cache.close()

    def _side(self, name: str, binds: list[Bind]) -> Side:
        try:
            side = Side(name, binds)
        except NamespaceError as e:
            raise TryError("no-namespace", str(e), self.found) from None
        self.sides[name] = side
        return side

    def _compare(self, cache: Cache, prefetcher: pf.Prefetcher) -> dict[str, Any]:
        assert self.scratch is not None
        rdir = self.scratch / "run"
        rdir.mkdir()
        os.chmod(rdir, 0o755)  # the audit library takes shared copies only from a directory root's alone
        original = self._side("original", [])
        first = self._first_run(original)
        usable = self._copies(first, cache)
        if self.mounts.entered:
            # A command that runs processes as another user (a server started as
            # nobody) reaches the shared copies through the scratch directory: it may be
            # passed through, not listed. The copies are then made only of files every
            # user may read (hugify.shared: copy-private).
            os.chmod(self.scratch, 0o711)
            usable = self._shared_store(usable, rdir)
        hugified = self._side("hugified", [Bind(c.file, c.original, c.identity) for c in usable])
        pages = PageCache(prefetcher, usable, self.shared_budget)
        b_env = self._prepare(pages, prefetcher)
        watched = self._watched(usable)
        scan = prefetcher.engine if prefetcher.engine.has(Engine.PAGEMAP_SCAN) else None
        runner = _Runner(self.opts, self.scratch, pages, watched, hp=self.hp, scan=scan, way=self.found["way"])
        runner.sides = {abtest.ORIGINAL: original, abtest.ORIGINAL_AGAIN: original, abtest.CHANGED: hugified}
        runner.envs = {abtest.ORIGINAL: self.opts.env, abtest.ORIGINAL_AGAIN: self.opts.env, abtest.CHANGED: b_env}
        runner.program = self.program
        rounds, stopped, problems = self._rounds(runner, {c.original: c.source for c in usable})
        return self._result(rounds, stopped=stopped, problems=problems, pages=pages, watched=watched, cache=cache)

    def _first_run(self, original: Side) -> discover.FirstRun:
        opts = self.opts
        assert self.scratch is not None
        opts.progress("first run, recording what the command loads")
        try:
            first = discover.first_run(
                original, self.program, opts.argv, env=opts.env, cwd=opts.cwd, scratch=self.scratch
            )
        except OSError as e:
            raise TryError("command-failed", reasons.io_detail(e), self.found) from None
        self.found["first_run"] = {
            "status": first.result.status,
            "cpu_s": round(first.result.cpu, 4),
            "wall_s": round(first.result.wall, 4),
            "processes": first.processes,
            "objects": len(first.loaded),
        }
        if first.result.status != 0:
            tail = first.stderr.read_text(errors="replace").strip().splitlines()[-1:]
            said = f": {tail[0][:300]}" if tail else ""
            why = f"the command failed on the original files ({first.result.status_text}){said}"
            raise TryError("command-failed", why, self.found)
        for pid, comm in sorted(first.unreadable.items()):
            self.note(f"process {pid} ({comm}) could not be inspected (setuid, or another user's): not hugified")
        return first

    def _copies(self, first: discover.FirstRun, cache: Cache) -> list[Usable]:
        objects = self._select(first, cache)
        self.opts.progress(f"{len(objects)} object(s) over the threshold: making or finding their copies")
        if self.opts.control:
            assert self.scratch is not None
            copies = cache.plain_copies(objects, self.scratch)
        else:
            copies = cache.copies(objects, self.opts.jobs)
        self.found["objects"] = self._describe(first, copies)
        usable = Usable.of(copies)
        if not usable:
            raise TryError("nothing-to-try", self._nothing(copies, first), self.found)
        return usable

    def _shared_store(self, usable: list[Usable], rdir: Path) -> list[Usable]:
        """Root's shared copies' store, mounted before the hugified side starts
        (hugify.trial.sharedway); with --way shared, the copies moved onto a tmpfs
        without huge pages first. The objects under test, where the hugified side will
        find them."""
        assert self.scratch is not None
        try:
            if self.opts.way == "shared":
                moved = self.mounts.plain(self.scratch / "plain", [c.file for c in usable])
                usable = [
                    replace(c, file=f, identity=files.identity(os.stat(f))) for c, f in zip(usable, moved, strict=True)
                ]
            self.shared_budget = self.mounts.store(rdir, [os.stat(c.file).st_size for c in usable])
        except (SharedWayError, OSError) as e:
            why = reasons.io_detail(e) if isinstance(e, OSError) else str(e)
            if self.opts.way == "shared":
                raise TryError("try-shared", why, self.found) from None
            self.note(f"no shared copies: {why}")
        return usable

    def _prepare(self, pages: PageCache, prefetcher: pf.Prefetcher) -> dict[str, str]:
        """The page cache, and the hugified side's way and environment."""
        assert self.scratch is not None
        prepared = pages.start(skip=[s.pid for s in self.sides.values()])
        for path, why in prepared.kept.items():
            self.note(f"{path} is left in the page cache as it is ({why})")
        self.found["page_cache"] = {
            "evicted": prepared.evicted,
            "kept": prepared.kept,
            "processes_not_checked": prepared.unseen,
        }
        self.found["prefetched"] = {
            path: {"windows": len(t.windows), "huge": t.count(*GOOD_STATES), "states": _states(t)}
            for path, t in prepared.windows.items()
        }
        way = self.found["way"] = self._way(prepared.windows, prefetcher, pages)
        env = dict(self.opts.env)
        if way in ("shared", "anonymous"):  # through the audit library, in the run's own runtime directory
            audit = runtime_file(AUDIT_LIB)
            assert audit is not None
            env = discover.with_audit(env, audit) | {
                "HUGIFY_PERF_MAP": "0",  # no /tmp/perf-PID.map: nothing outside the cache
                "HUGIFY_RUNTIME_DIR": str(self.scratch / "run"),
            }
            if way == "anonymous":
                env["HUGIFY_ANONYMOUS"] = "always" if self.opts.way == "anonymous" else "1"
        return env

    def _rounds(
        self, runner: _Runner, before: dict[str, files.Version]
    ) -> tuple[list[dict[str, Timed]], str, list[str]]:
        """The untimed runs, then rounds until the limits (or a signal) say stop."""
        opts = self.opts
        opts.progress("untimed runs: the original files twice, then the hugified ones")
        warm = {label: runner.one(label) for label in (abtest.ORIGINAL, abtest.ORIGINAL_AGAIN, abtest.CHANGED)}
        self._check_behaviour(warm, runner)
        self._check_measurable(warm)
        rounds: list[dict[str, Timed]] = []
        start = time.monotonic()
        try:
            while True:
                runs = {label: runner.one(label) for label in abtest.order(len(rounds))}
                self._check_behaviour(runs, runner)
                changed = [c for c in before if _version(c) != before[c]]
                if changed:
                    why = f"{changed[0]} changed during the comparison (did the command rebuild it?): its copy is stale"
                    raise TryError("files-changed", why, self.found)
                rounds.append(runs)
                problems = self._check_mappings(runs)
                if problems:
                    return rounds, "a run used the other side's files", problems
                stopped = opts.limits.stop(_ratios(rounds, abtest.CHANGED, "cpu"), time.monotonic() - start)
                if stopped:
                    return rounds, stopped, []
                opts.progress(self._progress(rounds, time.monotonic() - start))
        except Interrupted as e:
            if not rounds:
                raise
            name = signal.Signals(e.signum).name
            self.found["interrupted"] = name
            return rounds, f"by {name} after {len(rounds)} round(s)", []

    # --- choosing -----------------------------------------------------------------------

    def _select(self, first: discover.FirstRun, cache: Cache) -> list[str]:
        """The loaded objects worth a copy: ELF files with an executable segment at
        least the policy's threshold, not privileged, not the cache's own."""
        out = []
        skipped = self.found.setdefault("skipped", {})
        seen_inodes: set[tuple[int, int]] = set()
        for path in sorted(first.loaded):
            try:
                st = os.stat(path)
            except OSError:
                continue  # gone since (a temporary program)
            if path.startswith(str(cache.root) + "/") or not os.path.isfile(path):
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen_inodes:
                continue
            seen_inodes.add(key)
            with files.Directory.open(Path(path).parent, follow=True) as d:
                probed = tree.probe(d, Path(path).name)
            if probed is None:
                continue
            why = discover.privileged(st, path)
            exec_load = probed["exec_load"]
            if why:
                skipped[path] = f"{why}: not copied"
            elif exec_load is None or exec_load["memsz"] < self.opts.policy.threshold:
                size = exec_load["memsz"] if exec_load else 0
                skipped[path] = f"below-threshold: {size / MIB:.1f} MiB of code"
            else:
                out.append(path)
        return out

    def _describe(self, first: discover.FirstRun, copies: list[Copy]) -> list[dict[str, Any]]:
        out = []
        for c in copies:
            o = c.outcome
            out.append(
                {
                    "path": c.original,
                    "names": sorted(first.loaded[c.original].names - {c.original}),
                    "status": o["status"],
                    "reason": o.get("reason"),
                    "detail": o.get("detail", ""),
                    "mode": o.get("mode"),
                    "code_bytes": o.get("code_bytes"),
                    "covered_code": o.get("covered_code"),
                    "growth": o.get("growth"),
                    "copy": str(c.path) if c.path else None,
                    "cached": not c.made,
                    "sha256": c.sha256,
                }
            )
        return out

    def _nothing(self, copies: list[Copy], first: discover.FirstRun) -> str:
        if not copies:
            n = len(first.loaded)
            return (
                f"none of the {n} object(s) the command loaded has {self.opts.policy.threshold / MIB:.0f} MiB of "
                "code or more (the policy's threshold)"
            )
        reasons = sorted({f"{c.outcome.get('reason') or c.status}" for c in copies})
        return f"none of the {len(copies)} object(s) over the threshold could be hugified ({', '.join(reasons)})"

    def _watched(self, usable: list[Usable]) -> list[Watched]:
        out = []
        for c in usable:
            so, sc = os.stat(c.original), os.stat(c.file)
            fd = os.open(c.file, os.O_RDONLY | os.O_CLOEXEC)
            try:
                windows = read_hugified(fd, self.hp, str(c.file)).offsets
            except NotHugified:
                windows = ()
            finally:
                os.close(fd)
            out.append(Watched(c.original, (so.st_dev, so.st_ino), (sc.st_dev, sc.st_ino), windows))
        return out

    def _way(self, first: dict[str, pf.Target], prefetcher: pf.Prefetcher, pages: PageCache) -> str:
        """How the hugified side gets its huge pages: from the copies' page cache
        (file); where that cache cannot hold 2 MiB folios, from root's shared copies
        (shared), else from the runtime's anonymous copies."""
        made = {p: o for p, o in pages.shared.outcomes.items() if o.state != "none"}
        original = pages.original_of()
        for path, o in pages.shared.outcomes.items():
            if o.state == "none" and (made or self.opts.way == "shared"):
                self.note(f"{original.get(path, path)}: no shared copy: {o.detail} ({o.reason})")
        if self.opts.way == "shared":
            if not made:
                none = next(iter(pages.shared.outcomes.values()), None)
                why = f"{none.detail} ({none.reason})" if none else "no window of the copies wants one"
                raise TryError("try-shared", f"no shared copy could be made: {why}", self.found)
            return "shared"
        if self.opts.way != "auto":
            return self.opts.way
        windows = [w for t in first.values() for w in t.windows]
        if windows and all(w.state == UNSUPPORTED for w in windows):
            why = next(iter(prefetcher.unable_fs.values()), "the filesystem gives no 2 MiB folios")
            if made:
                self.note(f"the copies cannot be 2 MiB folios ({why}): the hugified side maps its code from root's "
                          "shared copies")  # fmt: skip
                return "shared"
            refused = next(iter(pages.shared.outcomes.values()), None)
            if self.shared_budget is not None and refused is not None:
                self.note(f"no shared copies: {refused.detail} ({refused.reason})")
            self.note(
                f"the copies cannot be 2 MiB folios ({why}): the hugified side uses the runtime's anonymous copies"
            )
            return "anonymous"
        return "file"

    # --- checking -----------------------------------------------------------------------

    def _check_behaviour(self, runs: dict[str, Timed], runner: _Runner) -> None:
        """The runs agree: the originals' first (else the command is not
        deterministic), then the hugified side with the originals (else, once
        CONFIRMING_RUNS more runs of the originals agree with the first, the hugified
        files behave differently)."""
        a = runs[abtest.ORIGINAL]
        if abtest.ORIGINAL_AGAIN in runs:
            self._deterministic(a, runs[abtest.ORIGINAL_AGAIN])
        b = runs[abtest.CHANGED]
        diff = a.behaviour.differences(b.behaviour)
        if diff:
            for _ in range(CONFIRMING_RUNS):
                again = runner.one(abtest.ORIGINAL_AGAIN)
                self._deterministic(a, again)
            where = self._where(diff, a, b)
            self.found["difference"] = {"what": diff, "where": where.removeprefix("; ")}
            raise TryError(
                "behaviour-differs",
                f"the hugified files behave differently: the runs differ in {', '.join(diff)}{where} "
                "(original vs hugified)",
                self.found,
            )
        for t in runs.values():  # compared: not needed any more
            t.stdout.unlink(missing_ok=True)
            t.stdout.with_suffix(".stderr").unlink(missing_ok=True)

    def _deterministic(self, a: Timed, again: Timed) -> None:
        """TryError (not-deterministic) where two runs on the original files differ."""
        diff = a.behaviour.differences(again.behaviour)
        if diff:
            raise TryError(
                "not-deterministic",
                f"two runs on the original files differ in {', '.join(diff)}{self._where(diff, a, again)}: "
                "the behaviour of the hugified files cannot be compared",
                self.found,
            )

    def _check_measurable(self, warm: dict[str, Timed]) -> None:
        """TryError (too-short) for a command whose untimed runs on the original files
        took less than MIN_CPU_S of CPU time (their median)."""
        cpu = statistics.median(warm[label].result.cpu for label in (abtest.ORIGINAL, abtest.ORIGINAL_AGAIN))
        if cpu < MIN_CPU_S:
            raise TryError(
                "too-short",
                f"the command takes {cpu * 1000:.1f} ms of CPU time on the original files, less than the "
                f"{MIN_CPU_S * 1000:.0f} ms hugify try can measure: its runs are mostly the start and exit of its "
                "processes; measure a longer command (more work per run, or a loop of it in a shell script)",
                self.found,
            )

    @staticmethod
    def _where(diff: list[str], a: Timed, b: Timed) -> str:
        return f"; standard output at {first_difference(a.stdout, b.stdout)}" if "standard output" in diff else ""

    def _check_mappings(self, runs: dict[str, Timed]) -> list[str]:
        """Each run used its side's files: the hugified side never an original, the
        originals' never a copy."""
        problems = []
        for label, t in runs.items():
            wrong = "original" if label == abtest.CHANGED else "copy"
            for name, s in t.seen.items():
                if wrong in s.mapped:
                    side = "hugified" if label == abtest.CHANGED else "original"
                    problems.append(f"a run of the {side} side mapped the {wrong} of {name}")
        return problems

    # --- the result ---------------------------------------------------------------------

    def _progress(self, rounds: list[dict[str, Timed]], elapsed: float) -> str:
        cpu, aa = _ratios(rounds, abtest.CHANGED, "cpu"), _ratios(rounds, abtest.ORIGINAL_AGAIN, "cpu")
        if not cpu:
            return f"round {len(rounds)}: no CPU time measured yet"
        ci, floor = abtest.bootstrap(cpu), abtest.bootstrap(aa)
        text = f"round {len(rounds)}: CPU {abtest.percent(statistics.median(cpu))}"
        if ci and floor:
            c = abtest.change
            text += f" [{c(ci[0])}, {c(ci[1])}], A/A [{c(floor[0])}, {c(floor[1])}]"
        return f"{text}; {elapsed:.0f} s of {self.opts.limits.budget:.0f} s"

    def _result(
        self,
        rounds: list[dict[str, Timed]],
        *,
        stopped: str,
        problems: list[str],
        pages: PageCache,
        watched: list[Watched],
        cache: Cache,
    ) -> dict[str, Any]:
        seen: dict[str, dict[str, Seen]] = {"original": {}, "hugified": {}}
        verified = {"original": [0, 0], "hugified": [0, 0]}  # [runs seen mapping their files, runs]
        anon_held = 0
        dropped = 0
        for r in rounds:
            for label, t in r.items():
                side = "hugified" if label == abtest.CHANGED else "original"
                mine = "copy" if side == "hugified" else "original"
                for name, s in t.seen.items():
                    seen[side].setdefault(name, Seen()).add(s)
                verified[side][1] += 1
                verified[side][0] += any(mine in s.mapped for s in t.seen.values())
                anon_held = max(anon_held, t.anon_held)
                dropped += t.cache_dropped
        objects = self.found["objects"]
        for o in objects:
            h, a = seen["hugified"].get(o["path"]), seen["original"].get(o["path"])
            w = next((x for x in watched if x.name == o["path"]), None)
            if h is None or a is None or w is None:
                continue
            o["seen"] = {
                "hugified": {"pmd_mapped": h.pmd, "resident_code": h.rss, "windows": len(w.windows),
                             "windows_huge": len(h.huge), "windows_small": len(h.small)},
                "original": {"pmd_mapped": a.pmd, "resident_code": a.rss},
            }  # fmt: skip
        per_round = [
            {
                "order": list(r),
                **{f"{label}_cpu_s": round(t.result.cpu, 4) for label, t in r.items()},
                **{f"{label}_wall_s": round(t.result.wall, 4) for label, t in r.items()},
                **{f"{label}_samples": t.samples for label, t in r.items()},
            }
            for r in rounds
        ]
        cpu, wall = _ratios(rounds, abtest.CHANGED, "cpu"), _ratios(rounds, abtest.CHANGED, "wall")
        aa_cpu, aa_wall = _ratios(rounds, abtest.ORIGINAL_AGAIN, "cpu"), _ratios(rounds, abtest.ORIGINAL_AGAIN, "wall")
        leftovers = sum(t.result.leftovers for r in rounds for t in r.values())
        if leftovers:
            self.note(f"the command left {leftovers} process(es) running after it exited: killed after each run")
        if pages.loaded_again:
            self.note(
                f"{pages.loaded_again} window(s) were prefetched again before a run (another process dropped them)"
            )
        if dropped:
            self.note(f"the page cache was dropped by another process during {dropped} run(s)")
        return {
            **self.found,
            "hugify_try": 1,
            "control": self.opts.control,
            "rounds": len(rounds),
            "stopped": stopped,
            "cpu": abtest.ratio_summary(cpu) if cpu else None,
            "wall": abtest.ratio_summary(wall) if wall else None,
            "noise_floor": {
                "cpu": abtest.ratio_summary(aa_cpu) if aa_cpu else None,
                "wall": abtest.ratio_summary(aa_wall) if aa_wall else None,
            },
            "original_cpu_s": statistics.median(r[abtest.ORIGINAL].result.cpu for r in rounds),
            "original_wall_s": statistics.median(r[abtest.ORIGINAL].result.wall for r in rounds),
            "coverage": {
                "hugified_pmd_mapped": sum(s.pmd for s in seen["hugified"].values()),
                "original_pmd_mapped": sum(s.pmd for s in seen["original"].values()),
                "anonymous_held": anon_held if self.found.get("way") == "anonymous" else None,
                "shared_held": pages.shared.held if self.found.get("way") == "shared" else None,
            },
            "verified_runs": {side: {"seen": v[0], "runs": v[1]} for side, v in verified.items()},
            "per_round": per_round,
            "problems": problems,
            "cache": {"root": str(cache.root), "bytes": cache.size()},
            "limits": self.opts.limits.as_json(),
            "hugify_version": _core.VERSION,
        }


def _ratios(rounds: list[dict[str, Timed]], label: str, what: str) -> list[float]:
    """Per round: the run `label`'s CPU or wall time over the original's (rounds where
    the original's took no measurable time left out: the kernel counts CPU time in
    ticks for short processes)."""
    out = []
    for r in rounds:
        base = getattr(r[abtest.ORIGINAL].result, what)
        if base > 0:
            out.append(getattr(r[label].result, what) / base)
    return out


def _version(path: str) -> files.Version | None:
    """The file's version now (None where it is gone): not the one its copy was made
    from once renamed over, rewritten or given other permissions."""
    try:
        return files.version(os.stat(path))
    except OSError:
        return None


def _states(t: pf.Target) -> dict[str, int]:
    out: dict[str, int] = {}
    for w in t.windows:
        out[w.state] = out.get(w.state, 0) + 1
    return out


def run(opts: Options) -> dict[str, Any]:
    """The comparison (see the module's docstring); TryError when it stops early."""
    return Trial(opts).run()
