"""The derived builds as a user gets them (issue 44, item 3's last sentence): installed
from the instance's suite into a clean root, each program runs a workload of its own
there and in a clean root of the archive's builds; the two outputs must be the same, and
in the suite's root, under the runtime installed from the suite (hugify-run), the code of
every hugified file the workload runs must be mapped with 2 MiB pages (FilePmdMapped in
the kernel's smaps equal to the executable load's size by readelf).

Both roots are made by mmdebstrap (minbase, trixie) on one XFS filesystem on a loop
device, which is mounted again before the workloads run: nothing of the roots is in the
page cache then, and the runtime reads each window the way it does on a user's disk. XFS
is where file-backed huge pages work on every kernel this project supports (large folios
since 6.x); the suite's root gets the suite's packages because a derived version sorts
above the archive's (`+hugify1`), with the suite's Release checked against the repository
key the signing worker made.

A workload is a shell script run in the root (chroot, in private mount and PID
namespaces with /proc, /sys and /dev); what it prints is what is compared, so it prints
only what the program computes (hashes of outputs, object ids, counts), never times or
paths that differ. It leaves the smaps of one long-lived process of the program in
/work/smaps, read while that process was alive.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit import debusine
from testkit.debian_repro import in_chroot
from testkit.debian_roots import MIRROR, mmdebstrap
from testkit.debusine import client
from testkit.debusine.deploy import Instance
from testkit.elf import exec_load, on_whole_windows
from testkit.runtime import loop_fs
from testkit.smaps import exec_mappings

#: The suite's archive as the builds see it, reached through the instance's web server.
SUITE_URL = f"http://deb.{debusine.FQDN}/debusine/{debusine.WORKSPACE}"
PROXY = f'Acquire::http::Proxy::deb.{debusine.FQDN} "http://{debusine.ADDRESS}/";'
#: The XFS image: two minbase roots with their programs (about 300 MB each) and the
#: workloads' files.
IMAGE_SIZE = 4 << 30


#: The head every workload starts with: a fixed environment, its input (the source's
#: upstream tarball) unpacked into /work/tree.
UNPACK = r"""
export HOME=/work/home TZ=UTC LC_ALL=C.UTF-8
mkdir -p "$HOME" /work/tree && cd /work/tree
tar -xf /work/input --strip-components=1
"""

#: Holds the command in $hold (reading its standard input) running while its smaps are
#: read: fed /work/feed, more than a pipe holds, so that the write returns only once the
#: program itself reads. Prints the digest of what it wrote.
HOLD = r"""
mkfifo /work/queue
eval "exec $hold" < /work/queue > /work/held &
exec 3> /work/queue
cat /work/feed >&3
cat /proc/$!/smaps > /work/smaps
exec 3>&-
wait $!
sha256sum < /work/held
"""

#: Git's own workload, on git's own upstream tree: import it, commit, change and commit
#: again, then what a developer's day runs (log with patches, grep, diff, blame, gc,
#: fsck, archive); fixed identities and dates make every object id the same on both
#: sides. Then `git cat-file --batch` held open, fed every object id.
GIT = (
    UNPACK
    + r"""
export GIT_CONFIG_NOSYSTEM=1
export GIT_AUTHOR_NAME=hugify GIT_AUTHOR_EMAIL=bench@hugify.invalid GIT_AUTHOR_DATE='2026-01-01T00:00:00+0000'
export GIT_COMMITTER_NAME=hugify GIT_COMMITTER_EMAIL=bench@hugify.invalid GIT_COMMITTER_DATE='2026-01-01T00:00:00+0000'
git init -q -b main . && git config pack.threads 1 && git config gc.auto 0
git add -A && git commit -q -m import
sed -i 's/static int/static  int/' *.c && git commit -q -a -m respace
git tag -a -m 'one tag' v1
git rev-parse HEAD HEAD^{tree} v1
git log -p --stat | sha256sum
git grep -n -e 'static  int' -- '*.c' | sha256sum
git diff --stat HEAD~1 | tail -n 1
git blame -s -- Makefile | sha256sum
git gc -q && git fsck --strict --no-progress --no-dangling && echo fsck ok
git count-objects -v | grep -E '^(count|in-pack|packs):'
git archive --format=tar --prefix=tree/ HEAD | sha256sum
git rev-list --objects --all | cut -d' ' -f1 > /work/feed
hold="git cat-file --batch"
"""
    + HOLD
)

#: ICU's own conversions and transforms (uconv, icu-devtools: libicuuc and libicui18n)
#: on ICU's own tree: each of its text files (test data in many scripts) round-tripped
#: through UTF-16 and GB 18030, their first 4 MB transliterated to ASCII and normalised
#: (bytes not UTF-8 left out), the converters and transforms listed; then a
#: transliteration of them held open.
ICU = (
    UNPACK
    + r"""
find . -type f -name '*.txt' | LC_ALL=C sort | head -n 1500 > /work/files
wc -l < /work/files
while read -r f; do
    uconv -f utf-8 -t utf-16le --callback skip "$f" | uconv -f utf-16le -t gb18030 --callback skip
done < /work/files | sha256sum
while read -r f; do cat "$f"; done < /work/files | head -c 4000000 > /work/feed
uconv -c -x 'Any-Latin; Latin-ASCII' < /work/feed | sha256sum
uconv -c -x 'Any-NFKD' < /work/feed | sha256sum
uconv -l | sha256sum
uconv -L | sha256sum
hold="uconv -c -x Any-Latin"
"""
    + HOLD
)

#: Ruby's compiler and parser on Ruby's own library (libruby: every lib/**/*.rb compiled
#: to instructions and parsed by Ripper, digests of both), JSON round trips and integer
#: work; then an interpreter held open reading the file list.
RUBY = (
    UNPACK
    + r"""
ruby -e '
require "ripper"; require "digest"; require "json"
files = Dir["lib/**/*.rb"].sort
puts files.size
iseq = Digest::SHA256.new
sexp = Digest::SHA256.new
files.each do |f|
  src = File.read(f)
  begin
    iseq << RubyVM::InstructionSequence.compile(src, f).disasm
  rescue SyntaxError
    iseq << "syntax error in #{f}"
  end
  sexp << Ripper.sexp(src).inspect
end
puts iseq.hexdigest, sexp.hexdigest
data = files.map { |f| { name: f, size: File.size(f), lines: File.foreach(f).count } }
puts Digest::SHA256.hexdigest(JSON.generate(JSON.parse(JSON.generate(data))))
puts (1..200_000).map { |i| (i * 2_654_435_761) % 1_000_003 }.sort.each_slice(1000).sum { |s| s.sum }
'
find . -type f -name '*.rb' | LC_ALL=C sort > /work/feed
hold="ruby -e 'n = 0; STDIN.each_line { |l| n += l.bytesize }; puts n'"
"""
    + HOLD
)


@dataclass(frozen=True)
class Workload:
    #: Installed in both roots (the program, and what the script uses besides minbase).
    packages: tuple[str, ...]
    script: str


#: By source name: the sources of the batch whose programs run a workload of their own.
WORKLOADS = {
    "git": Workload(("git", "xz-utils"), GIT),
    "icu": Workload(("icu-devtools",), ICU),
    "ruby3.3": Workload(("ruby3.3", "xz-utils"), RUBY),
}


def orig_tarball(dsc: Path) -> Path:
    """The upstream tarball beside a source's .dsc (the workload's input)."""
    (orig,) = [p for p in sorted(dsc.parent.glob("*.orig.tar.*")) if not p.name.endswith(".asc")]
    return orig


def suite_sources(key: bytes, dest: Path) -> Path:
    """The suite as a deb822 sources file with its key in it (Signed-By): apt reads it
    the same way during mmdebstrap's setup (which uses the host's trusted keys, not the
    root's) and in the root afterwards."""
    armoured = "".join(f" {line or '.'}\n" for line in key.decode().strip().splitlines())
    dest.write_text(
        f"Types: deb\nURIs: {SUITE_URL}\nSuites: {debusine.REPO_SUITE}\nComponents: main\nSigned-By:\n{armoured}"
    )
    return dest


def make_root(target: Path, packages: tuple[str, ...], suite: Path | None) -> None:
    """A minbase trixie root with `packages`, from the archive alone or from the archive
    and the suite (its sources file: suite_sources)."""
    mirrors = [f"deb {MIRROR} trixie main"]
    args = ["--variant=minbase", f"--include={','.join(packages)}"]
    if suite is not None:
        mirrors.append(str(suite))
        args.append(f"--aptopt={PROXY}")
    res = mmdebstrap(target, *args, suite="trixie", mirrors=mirrors)
    if res.returncode != 0:
        raise RuntimeError(f"mmdebstrap of {target.name} failed:\n{res.stdout[-4000:]}")


def installed_versions(root: Path, packages: tuple[str, ...]) -> dict[str, str]:
    out = subprocess.run(
        ["dpkg-query", f"--admindir={root / 'var/lib/dpkg'}", "-W", *packages],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split("\t", 1) for line in out.splitlines())


def run_in(root: Path, script: str, runtime: bool) -> subprocess.CompletedProcess[str]:
    """The workload in `root`, as root, with its own /proc (its PID namespace), /sys and
    /dev; under the root's own hugify-run when `runtime`."""
    inner = ["/usr/bin/hugify-run", "/bin/sh", "-euc", script] if runtime else ["/bin/sh", "-euc", script]
    argv = in_chroot(root, *inner, sys=True, pid=True)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800, check=False)


def code_mappings(root: Path) -> dict[str, dict[str, int]]:
    """The workload's long-lived process: each executable file mapping's size, the
    kernel's FilePmdMapped, and (for a file hugify moved) its executable load's size by
    readelf, which is what must be PMD-mapped."""
    out: dict[str, dict[str, int]] = {}
    for path, m in exec_mappings((root / "work/smaps").read_text()).items():
        f = root / path.lstrip("/")
        entry = {"size": m.size, "file_pmd": m.pmd}
        try:
            x = exec_load(f)
        except (AssertionError, subprocess.CalledProcessError):  # not one executable load: not hugify's
            x = None
        if x is not None and on_whole_windows(x):
            entry["whole_windows"] = x.filesz
        out[path] = entry
    return out


def side(root: Path, workload: Workload, input_file: Path, runtime: bool) -> dict[str, Any]:
    (root / "work").mkdir()
    shutil.copyfile(input_file, root / "work/input")
    res = run_in(root, workload.script, runtime)
    out: dict[str, Any] = {
        "status": res.returncode,
        "output": res.stdout,
        "output_sha256": hashlib.sha256(res.stdout.encode()).hexdigest(),
        "stderr_tail": res.stderr[-2000:],
        "versions": installed_versions(root, workload.packages),
    }
    out["mappings"] = code_mappings(root) if (root / "work/smaps").exists() else {}
    return out


def run_installed(instance: Instance, work: Path, source: str, dsc: Path) -> dict[str, Any]:
    """The workload of `source` in a root of the suite's packages (under the runtime) and
    in one of the archive's: both outputs, the suite root's code mappings, and whether
    it holds (same output, status 0, every hugified file mapped on whole windows)."""
    workload = WORKLOADS[source]
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    suite = suite_sources(client.repository_public_key(instance), work / f"{debusine.REPO_SUITE}.sources")

    def make_roots(mnt: Path) -> None:
        make_root(mnt / "archive", workload.packages, None)
        make_root(mnt / "suite", (*workload.packages, "hugify"), suite)

    # Mounted again once the roots are made: nothing of them is left in the page cache.
    with loop_fs(work, "xfs", size=IMAGE_SIZE, fill=make_roots) as mnt:
        archive_root, suite_root = mnt / "archive", mnt / "suite"
        archive = side(archive_root, workload, orig_tarball(dsc), runtime=False)
        derived = side(suite_root, workload, orig_tarball(dsc), runtime=True)
    moved = {p: m for p, m in derived["mappings"].items() if "whole_windows" in m}
    out = {
        "archive": archive,
        "suite": derived,
        "same_output": archive["output"] == derived["output"],
        "hugified_mapped": {p: m["file_pmd"] == m["whole_windows"] for p, m in moved.items()},
    }
    out["ok"] = bool(
        archive["status"] == 0
        and derived["status"] == 0
        and out["same_output"]
        and moved
        and all(out["hugified_mapped"].values())
    )
    return out
