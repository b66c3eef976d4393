"""The hugified copies of `hugify try`, made like a package build makes them and kept
by the content of their originals.

An entry is a directory ``SHA256-KEY`` under the cache's root: SHA256 of the
original's bytes, KEY of what decides the result (hugify's own code and the
effective policy). It holds ``outcome.json`` (what `hugify tree` would say of the file:
transformed, as-is, skipped or failed, with its reason) and, for the first two, the
copy, ``file``, read-only and without setuid bits. A file listed as-is is copied unchanged:
its windows are loaded as 2 MiB folios in the copy's page cache while the original
keeps the small folios the kernel's faults give it. Each entry is made in a
temporary directory and renamed into place whole, so a reader never sees half an
entry and an interrupted run leaves none (a later run removes the temporary
directories of runs that are gone). Entries are never changed, but their time says
when a run last used them: those of another hugify or another policy (another KEY)
go once unused for a day. The whole cache can be removed at any time.

The root: --cache-dir, else /var/cache/hugify/try for root, else
$XDG_CACHE_HOME/hugify/try (~/.cache/hugify/try). The run's scratch files (the
command's captured output, the first run's record) live in it too, and go at its end.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hugify import _core, files, reasons, tree
from hugify.policy import Policy

ROOT_CACHE = Path("/var/cache/hugify/try")
OUTCOME = "outcome.json"
COPY = "file"
#: Entries another hugify (or policy) made are removed once unused this long.
STALE_SECONDS = 86400


class CacheError(Exception):
    """The cache cannot be written; the message says where and why, in one line."""


def default_root() -> Path:
    if os.geteuid() == 0:
        return ROOT_CACHE
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg.startswith("/") else Path.home() / ".cache"
    return base / "hugify" / "try"


def code_key(policy: Policy) -> str:
    """What decides an entry besides the original's bytes: hugify's code (the
    package's modules and the core) and the policy's effective values."""
    h = hashlib.sha256(f"{_core.VERSION}\0{policy.digest()}\0".encode())
    package = Path(tree.__file__).resolve().parent
    for f in sorted([*package.glob("*.py"), Path(_core.__file__).resolve()]):
        h.update(f.name.encode() + b"\0")
        with f.open("rb") as fh:
            h.update(hashlib.file_digest(fh, "sha256").digest())
    return h.hexdigest()[:16]


def _fail(root: Path, e: OSError) -> CacheError:
    return CacheError(f"cannot write the cache of hugified copies in {root} ({reasons.io_detail(e, with_file=False)})")


@dataclass
class Copy:
    """What the cache holds for one original."""

    original: str
    sha256: str
    outcome: dict[str, Any]  # tree.FileReport's fields, for this original
    path: Path | None  # the copy (transformed or as-is), else None
    made: bool  # made by this run (not found in the cache)

    @property
    def status(self) -> str:
        return str(self.outcome["status"])


class Cache:
    def __init__(self, root: Path, policy: Policy) -> None:
        self.root = root
        self.policy = policy
        self.key = code_key(policy)

    def open(self) -> Path:
        """Checks that the root can be written and copies executed from it, and makes
        this run's scratch directory there; CacheError if not."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._remove_abandoned()
            scratch = Path(tempfile.mkdtemp(prefix=f".run-{os.getpid()}-", dir=self.root))
        except OSError as e:
            raise _fail(self.root, e) from None
        if os.statvfs(scratch).f_flag & os.ST_NOEXEC:
            shutil.rmtree(scratch, ignore_errors=True)
            raise CacheError(
                f"the cache of hugified copies, {self.root}, is on a filesystem mounted noexec: "
                "the copies of programs could not run; give --cache-dir elsewhere"
            )
        return scratch

    def _remove_abandoned(self) -> None:
        """Temporary directories of runs whose process is gone (interrupted hard), and
        entries of another hugify or policy (another KEY) unused for STALE_SECONDS."""
        now = time.time()
        for d in self.root.iterdir():
            kind, _, rest = d.name.partition("-")
            pid = rest.split("-")[0]
            if kind in (".new", ".run") and pid.isdigit() and not Path(f"/proc/{pid}").exists():
                shutil.rmtree(d, ignore_errors=True)
            elif not d.name.startswith(".") and not d.name.endswith(f"-{self.key}"):
                with contextlib.suppress(OSError):
                    if now - d.stat().st_mtime > STALE_SECONDS:
                        shutil.rmtree(d, ignore_errors=True)

    def copies(self, originals: list[str], jobs: int) -> list[Copy]:
        """The cached copy of each original, made where the cache has none (in
        parallel, `jobs` at a time); CacheError when the cache cannot take them.
        Originals that cannot be read are left out."""
        found: list[Copy] = []
        todo: list[tuple[str, str, Path, tree.Candidate]] = []
        works: list[Path] = []
        try:
            for original in originals:
                try:
                    with open(original, "rb") as f:
                        digest = hashlib.file_digest(f, "sha256").hexdigest()
                except OSError:
                    continue
                entry = self.root / f"{digest}-{self.key}"
                cached = self._read(original, digest, entry)
                if cached:
                    found.append(cached)
                    continue
                works.append(Path(tempfile.mkdtemp(prefix=f".new-{os.getpid()}-", dir=self.root)))
                todo.append((original, digest, works[-1], self._candidate(original, works[-1])))
            outcomes = self._transform([c for *_, c in todo], jobs)
            for (original, digest, work, _), outcome in zip(todo, outcomes, strict=True):
                found.append(self._store(original, digest, work, outcome))
        except OSError as e:
            raise _fail(self.root, e) from None
        finally:
            for work in works:
                shutil.rmtree(work, ignore_errors=True)
        return found

    def _read(self, original: str, digest: str, entry: Path) -> Copy | None:
        try:
            outcome = json.loads((entry / OUTCOME).read_text())
        except (OSError, ValueError):
            return None
        with contextlib.suppress(OSError):
            os.utime(entry)  # used: an entry's time says when it was last used
        copy = entry / COPY
        return Copy(original, digest, outcome, copy if copy.is_file() else None, made=False)

    def _candidate(self, original: str, work: Path) -> tree.Candidate:
        """The original copied into `work`, as `hugify tree` sees a file of a build root."""
        copy = work / COPY
        shutil.copyfile(original, copy)
        mode = stat.S_IMODE(os.stat(original).st_mode) & 0o755 | 0o600
        os.chmod(copy, mode)
        with files.Directory.open(work, follow=False) as d:
            probed = tree.probe(d, COPY)
        assert probed is not None  # the caller gives ELF files only
        # Named by the original (the policy's globs match installed paths), made of the copy.
        return tree.Candidate([original], [copy], probed, os.stat(copy))

    def _transform(self, candidates: list[tree.Candidate], jobs: int) -> list[tree.Outcome]:
        """`hugify tree`'s decision and work for each candidate, in place."""
        pol = self.policy
        opts = tree.Options(root=Path("/"), policy=pol)
        stripped_rule = pol.where("refuse_stripped") if pol.refuse_stripped else None
        work: list[tree.Job | tree.Outcome] = []
        with contextlib.ExitStack() as opened:
            for c in candidates:
                decision = tree.decide(c, opts)
                if isinstance(decision, tree.Outcome):
                    work.append(decision)
                    continue
                # The job replaces the copy in its own work directory, never the original:
                # its tree is that directory, its one name the copy's.
                root = opened.enter_context(files.Directory.open(c.files[0].parent, follow=False))
                copy = c._replace(paths=[c.files[0].name])
                work.append(tree.Job(copy, decision, False, stripped_rule, None, root=root))
            outcomes = [
                o._replace(paths=c.paths)
                for c, o in zip(candidates, tree.execute(work, jobs, lambda o: None), strict=True)
            ]
        for o in outcomes:
            if o.status == "failed" and o.reason == "io-error":
                raise CacheError(f"cannot write the cache of hugified copies in {self.root} ({o.detail})")
        return outcomes

    def _store(self, original: str, digest: str, work: Path, outcome: tree.Outcome) -> Copy:
        """Moves a finished entry into place (another run's, if it got there first)."""
        copy = work / COPY
        report = dict(outcome.as_json())
        keep = outcome.status in ("transformed", "as-is")
        if keep:
            os.chmod(copy, stat.S_IMODE(os.stat(copy).st_mode) & 0o555)
        else:
            copy.unlink()
        (work / OUTCOME).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        entry = self.root / f"{digest}-{self.key}"
        try:
            os.rename(work, entry)
        except OSError:
            cached = self._read(original, digest, entry)
            if cached is None:
                raise
            return cached
        final = entry / copy.name
        return Copy(original, digest, report, final if keep else None, made=True)

    def plain_copies(self, originals: list[str], scratch: Path) -> list[Copy]:
        """Byte-identical copies, in this run's scratch directory, of the originals the
        policy selects (the A/A control: the whole method with nothing hugified); not
        kept."""
        out = []
        opts = tree.Options(root=Path("/"), policy=self.policy)
        try:
            for n, original in enumerate(originals):
                with files.Directory.open(Path(original).parent, follow=True) as d:
                    probed = tree.probe(d, Path(original).name)
                assert probed is not None  # the caller gives ELF files only
                decision = tree.decide(tree.Candidate([original], [Path(original)], probed, os.stat(original)), opts)
                if isinstance(decision, tree.Outcome):
                    out.append(Copy(original, "", dict(decision.as_json()), None, made=False))
                    continue
                copy = scratch / f"plain-{n}"
                shutil.copyfile(original, copy)
                os.chmod(copy, stat.S_IMODE(os.stat(original).st_mode) & 0o555)
                with copy.open("rb") as f:
                    digest = hashlib.file_digest(f, "sha256").hexdigest()
                outcome = {"status": "copied", "reason": None, "detail": "a plain copy (--control)"}
                out.append(Copy(original, digest, outcome, copy, made=True))
        except OSError as e:
            raise _fail(self.root, e) from None
        return out

    def size(self) -> int:
        """Bytes the entries hold."""
        total = 0
        with contextlib.suppress(OSError):
            for d in self.root.iterdir():
                if not d.name.startswith("."):
                    total += sum(f.stat().st_size for f in d.iterdir())
        return total
