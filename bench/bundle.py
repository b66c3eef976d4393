"""bench/speedup.py --bundle DIR: the same measurement carried to another x86-64 Linux
machine, one with no network and no package manager (bench/README.md, "On another
machine").

What the measurement uses is found by running it: the quick measurement of the chosen
workloads and ways runs once here under strace, which writes down every file each of
its processes opened, executed or looked at (the interpreter, hugify and its runtime,
the workloads' unpacked packages and the system's libraries and data they use, the
peers' builds, glibc 2.44, hugify try's cached copies, mkfs.xfs, setpriv, sh, ...).
DIR/root gets those files at their paths, symbolic links as links, directories empty
but for what was used in them; the loader of each program too (the kernel opens it for
exec without a system call of the program's). Where the inputs are (the unpacked
packages, the peers' builds: bench/peers.py's Fixtures) goes to DIR/bundle.json, so
that the bundled benchmark looks for nothing in the archive and builds nothing.

DIR/run.sh, run as root on the other machine, enters a mount namespace of its own with
the bundle's own unshare (through the bundle's own loader), mounts /proc, /sys, /dev,
a /tmp and a /run in DIR/root, makes DIR/root the namespace's root (pivot_root: the
measurement makes namespaces of its own, copies of this one, whose /proc/PID/maps must
show the same paths as its own), and runs bench/speedup.py with the bundle's
interpreter, writing the JSON (the same as here) to the file it is given. Only the
machine's kernel and /bin/sh are used: what the measurement is about (huge pages,
filesystems, the CPU) is that machine's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from testkit import REPO

#: Not carried: the kernel's and the run's own (mounted or made afresh by run.sh, or by
#: the measurement in its scratch directories).
SKIP = ("/proc", "/sys", "/dev", "/run", "/tmp")
#: Not needed where the inputs are known (the bundled run asks no archive): apt's state.
APT = ("/var/lib/apt", "/var/cache/apt", "/etc/apt")
_STRING = re.compile(r'"((?:\\x[0-9a-f]{2})*)"')
_RESULT = re.compile(r"\) += (-?\d+|0x[0-9a-f]+)")
#: What run.sh runs of the bundle's own, through its own loader.
TOOLS = (
    "/usr/bin/unshare", "/usr/bin/mount", "/usr/bin/umount", "/usr/sbin/pivot_root", "/usr/sbin/chroot", "/usr/bin/env",
    "/usr/bin/rmdir", "/usr/bin/mkdir", "/usr/bin/id",
)  # fmt: skip
LOADER = "/lib64/ld-linux-x86-64.so.2"
LIBS = "/usr/lib/x86_64-linux-gnu"

RUN_SH = """\
#!/bin/sh
# hugify's bench/speedup.py, bundled on {date} from commit {commit} (bench/README.md,
# "On another machine"): the measurement of the workloads {only} with the ways {ways}.
#
# usage (as root): ./run.sh [OUT.json] [bench/speedup.py options, e.g. --min-rounds 10 --budget 900]
#
# It needs this machine's kernel (x86-64, a loop device and XFS for hugifyr's way) and
# /bin/sh; everything else comes from ./root, entered in a mount namespace of its own
# (nothing of the system's mount table changes). OUT.json: default ./speedup.json.
set -eu
case $0 in */*) here=${{0%/*}} ;; *) here=. ;; esac
here=$(cd "$here" && pwd)
root=$here/root
# the bundle's own programs, through its own loader: nothing of this machine's but /bin/sh
run() {{ "$root{loader}" --library-path "$root{libs}" "$root$@"; }}
if [ "${{HUGIFY_BUNDLE_INSIDE:-}}" != 1 ]; then
    [ "$(run /usr/bin/id -u)" = 0 ] || {{ echo "$0: run it as root (it mounts and pivots)" >&2; exit 1; }}
    out=${{1:-speedup.json}}
    case $out in /*) ;; *) out=$PWD/$out ;; esac
    [ $# -gt 0 ] && shift
    run /usr/bin/mkdir -p "${{out%/*}}"
    export HUGIFY_BUNDLE_INSIDE=1 HUGIFY_BUNDLE_OUT="$out"
    exec "$root{loader}" --library-path "$root{libs}" "$root/usr/bin/unshare" --mount --propagation private \\
        /bin/sh "$0" "$@"
fi
run /usr/bin/mount --bind "$root" "$root"  # a mount of its own, to become the namespace's root
run /usr/bin/mount -t proc proc "$root/proc"
run /usr/bin/mount --rbind /sys "$root/sys"
run /usr/bin/mount --rbind /dev "$root/dev"
run /usr/bin/mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
run /usr/bin/mount -t tmpfs -o mode=755 tmpfs "$root/run"
{carried}run /usr/bin/mount --bind "${{HUGIFY_BUNDLE_OUT%/*}}" "$root/bundle-out"
# The bundle becomes the root of this mount namespace (not a chroot inside it: the
# measurement's own namespaces, copies of this one, must show the same paths), the
# machine's tree at /.oldroot until it is detached.
cd "$root"
run /usr/sbin/pivot_root . .oldroot
exec /usr/sbin/chroot . /bin/sh -c 'umount -l /.oldroot && rmdir /.oldroot 2>/dev/null; exec "$@"' sh \\
    /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root PYTHONUTF8=1 \\
    PYTHONPATH={repo} {python} -m bench.speedup --in-bundle /bundle.json --only {only} --ways {ways} \\
    --json "/bundle-out/${{HUGIFY_BUNDLE_OUT##*/}}" "$@"
"""


#: run.sh's lines for a checkout the fresh /tmp (or /run) would hide: bound back at its path.
CARRIED_SH = """\
run /usr/bin/mkdir -p "$root{repo}"
run /usr/bin/mount --bind "$root/{carried}{repo}" "$root{repo}"
"""


class BundleError(Exception):
    """The bundle cannot be made: one line why."""


def traced_paths(logs: list[Path]) -> set[str]:
    """The absolute paths of every successful call of strace -xx's logs (-ff: one file
    per process, so no call is split across lines)."""
    out: set[str] = set()
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            m = _RESULT.search(line)
            if not m or m[1].startswith("-"):
                continue
            for s in _STRING.findall(line[: m.start()]):
                path = bytes.fromhex(s.replace("\\x", "")).decode(errors="surrogateescape")
                if path.startswith("/"):
                    out.add(os.path.normpath(path))
    return out


def _interpreter(path: str) -> str | None:
    """The PT_INTERP of an ELF executable, or None."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return None
    if head != b"\x7fELF":
        return None
    res = subprocess.run(["readelf", "-lW", path], capture_output=True, text=True, check=False)
    m = re.search(r"\[Requesting program interpreter: (\S+)\]", res.stdout)
    return m[1] if m else None


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top + "/")


#: Where the bundle keeps a checkout that lies in a directory run.sh mounts afresh (a
#: clone in `mktemp -d`, under /tmp): run.sh binds it back at its path.
CARRIED = ".carried"


class Tree:
    """Files copied into the bundle's root at their paths; those of `carry` (the checkout,
    where it is under a skipped directory) below CARRIED."""

    def __init__(self, root: Path, skip: tuple[str, ...], carry: str | None = None) -> None:
        self.root, self.skip, self.carry = root, skip, carry
        self.done: set[str] = set()
        self.bytes = 0

    def _skipped(self, path: str) -> bool:
        if ".git" in path.split("/"):
            return True
        carried = self.carry is not None and _under(path, self.carry)
        return not carried and any(_under(path, s) for s in self.skip)

    def add(self, path: str) -> None:
        """`path` as it is here: a symbolic link as a link (and what it points to), a
        file copied, a directory made empty; first the directories it is in. What is
        written goes below directories the bundle made as such, never through a link
        (an absolute link would lead out of the bundle)."""
        path = os.path.normpath(path)
        if path in self.done or self._skipped(path) or not os.path.lexists(path):
            return
        self.done.add(path)
        parent = os.path.dirname(path)
        real = os.path.realpath(parent)
        if real != parent:  # a link among its directories: those links, then where it really is
            prefix = "/"
            for part in parent.split("/")[1:]:
                prefix = os.path.join(prefix, part)
                self.add(prefix)
            self.add(os.path.join(real, os.path.basename(path)))
            return
        if parent != path:
            self.add(parent)
        if self.carry is not None and _under(path, self.carry):
            dest = self.root / CARRIED / path.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)  # (the skipped directories above it)
        else:
            dest = self.root / path.lstrip("/")
        if os.path.islink(path):
            target = os.readlink(path)
            dest.symlink_to(target)
            self.add(os.path.join(parent, target))
        elif os.path.isdir(path):
            dest.mkdir(exist_ok=True)
            shutil.copystat(path, dest)
        elif os.path.isfile(path):
            shutil.copy2(path, dest)
            self.bytes += dest.stat().st_size
            interp = _interpreter(path)
            if interp:
                self.add(interp)


def prepare(dest: Path, only: list[str], ways: list[str]) -> dict[str, Any]:
    """Makes the bundle in `dest` (empty or new); what it holds."""
    if dest.exists() and any(dest.iterdir()):
        raise BundleError(f"{dest} is not empty")
    if not shutil.which("strace"):
        raise BundleError("strace is not installed (tools/setup-dev-env installs it)")
    dest.mkdir(parents=True, exist_ok=True)
    dest = dest.resolve()
    with tempfile.TemporaryDirectory(prefix="hugify-bundle-") as tmp:
        logs, fixtures, out = Path(tmp) / "trace", Path(tmp) / "fixtures.json", Path(tmp) / "quick.json"
        logs.mkdir()
        trace = ["strace", "-f", "-ff", "-qq", "-xx", "-s", "65536", "-e", "trace=%file", "-e", "signal=none"]
        measure = [sys.executable, "-m", "bench.speedup", "--quick", "--only", ",".join(only), "--ways", ",".join(ways)]
        measure += ["--json", str(out), "--fixtures-out", str(fixtures)]
        print(f"bundle: the quick measurement under strace: {' '.join(measure[1:])}", file=sys.stderr, flush=True)
        res = subprocess.run([*trace, "-o", str(logs / "t"), *measure], cwd=REPO, check=False)
        if res.returncode != 0 or not fixtures.exists():
            raise BundleError(f"the quick measurement under strace failed (exit status {res.returncode})")
        quick = json.loads(out.read_text())
        paths = traced_paths(sorted(logs.iterdir()))
        known = json.loads(fixtures.read_text())
    from testkit.cache import cache_root

    skip = (*SKIP, *APT, str(cache_root() / "glibc-thp"), str(dest), str(Path(tempfile.gettempdir())))
    carry = str(REPO) if any(_under(str(REPO), s) for s in skip) else None
    tree = Tree(dest / "root", skip, carry)
    (dest / "root").mkdir()
    for p in (*SKIP, "/bundle-out", "/.oldroot"):
        (dest / "root" / p.lstrip("/")).mkdir(exist_ok=True)
    try_cache = f"{cache_root() / 'speedup-try'}/"
    for path in sorted(paths):
        if not path.startswith(try_cache):
            tree.add(path)
        elif not path.removeprefix(try_cache).startswith("."):  # not a comparison's scratch: an entry, whole
            entry = try_cache + path.removeprefix(try_cache).split("/")[0]
            for f in Path(entry).glob("*"):
                tree.add(str(f))
    for path in _stdlib():
        tree.add(path)
    for tool in (*TOOLS, LOADER, "/bin/sh"):
        tree.add(tool)
        tree.add(os.path.realpath(tool))
    for tool in TOOLS:
        for lib in _needed(tool):
            tree.add(lib)
    commit = quick["machine"].get("commit")
    manifest = {
        "hugify_speedup_bundle": 1,
        "fixtures": known,
        "only": only,
        "ways": ways,
        "prepared": {**quick["machine"], "files": len(tree.done), "bytes": tree.bytes},
    }
    (dest / "root" / "bundle.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    (dest / "bundle.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    script = RUN_SH.format(
        date=quick["machine"]["date"], commit=commit, only=",".join(only), ways=",".join(ways),
        loader=LOADER, libs=LIBS, repo=REPO, python=sys.executable,
        carried=CARRIED_SH.format(repo=REPO, carried=CARRIED) if carry else "",
    )  # fmt: skip
    (dest / "run.sh").write_text(script)
    os.chmod(dest / "run.sh", 0o755)
    return manifest


#: Parts of Python's standard library no benchmark imports.
STDLIB_UNUSED = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages", "dist-packages"}


def _stdlib() -> list[str]:
    """The interpreter's standard library, whole (but STDLIB_UNUSED): what one code path
    imports and the traced run did not take (a codec for another locale) is there too."""
    out = []
    for key in ("stdlib", "platstdlib"):
        base = Path(sysconfig.get_paths()[key])
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if d not in STDLIB_UNUSED and not d.startswith("config-")]
            out += [os.path.join(dirpath, f) for f in filenames]
    return out


def _needed(program: str) -> list[str]:
    """The shared libraries `program` loads here (ldd's paths)."""
    res = subprocess.run(["ldd", program], capture_output=True, text=True, check=False)
    return re.findall(r"=> (/\S+)", res.stdout)
