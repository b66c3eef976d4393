"""The real-Debian-binaries corpus (tests/test_debian_corpus.py, bench/corpus.py):
which Debian packages (those of the release it runs on: 12, or 13 inside
tests/test_trixie.py), the policy hugify runs them under, one workload per package,
and the summary table.

The packages cover C (git, openssl, sqlite, systemd), C++ (LLVM, z3, ICU, gold,
libstdc++), hand-written assembly (x265), Rust (ripgrep), Go (age, docker) and
programs embedding Python (gdb with libpython3). Their archive binaries are
stripped, so the corpus policy transforms files without a symbol table (a package
build runs hugify before dh_strip), and its threshold is a quarter of the default so
that more files go through the rewriter.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.cache import cache_root
from testkit.cli import hugify
from testkit.recipes import CXX_WORKLOAD, debian_packages

LIB = "usr/lib/x86_64-linux-gnu"
POLICY = 'refuse_stripped = false\nthreshold = "256K"\n'


@dataclass(frozen=True)
class Workload:
    """A shell script, run in an empty directory once against the original tree and
    once against the transformed one (`{root}` in it and in `env` names the tree,
    `{data}` the inputs of prepare_inputs, `{lib}` the multiarch library directory);
    both runs must print the same. `uses` are the transformed files it must load:
    each is the program it runs or a library the dynamic loader maps (checked with
    LD_DEBUG=libs), so a workload cannot pass without them."""

    packages: tuple[str, ...]
    script: str
    uses: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    @property
    def used_files(self) -> set[str]:
        return {u.replace("{lib}", LIB) for u in self.uses}

    def used_inodes(self, root: Path) -> set[str]:
        """`uses` with symlinks resolved, as the tree report names files."""
        base = os.path.realpath(root)
        return {os.path.relpath(os.path.realpath(root / u), base) for u in self.used_files}


@dataclass(frozen=True)
class Release:
    """What a Debian release names by version: the packages with an ABI in their
    name, and the versioned files the workloads load."""

    ssl: str
    llvm: str
    llvm_lib: str
    icu: str
    x265: str
    gold: str  # the package with ld.gold and dwp
    systemd: str
    python: str
    stdcxx: str
    docker_cli: str  # the package with /usr/bin/docker


RELEASES = {
    "12": Release(
        ssl="libssl3",
        llvm="14",
        llvm_lib="libLLVM-14.so.1",
        icu="72",
        x265="199",
        gold="binutils-x86-64-linux-gnu",
        systemd="252",
        python="3.11",
        stdcxx="6.0.30",
        docker_cli="docker.io",
    ),
    "13": Release(
        ssl="libssl3t64",
        llvm="19",
        llvm_lib="libLLVM.so.19.1",
        icu="76",
        x265="215",
        gold="binutils-gold-x86-64-linux-gnu",
        systemd="257",
        python="3.13",
        stdcxx="6.0.33",
        docker_cli="docker-cli",
    ),
}


def running_release() -> Release:
    """The release of the system the tests run on (/etc/os-release)."""
    text = Path("/etc/os-release").read_text()
    m = re.search(r'^VERSION_ID="?(\d+)', text, re.M)
    assert m and m.group(1) in RELEASES, f"no corpus for this release: {m and m.group(1)}"
    return RELEASES[m.group(1)]


RELEASE = running_release()


def workload(
    packages: tuple[str, ...], script: str, uses: tuple[str, ...], env: tuple[tuple[str, str], ...] = ()
) -> Workload:
    """A Workload whose `{ssl}`, `{llvm}`, ... name the running release's versions."""

    def named(text: str) -> str:
        for field, value in vars(RELEASE).items():
            text = text.replace("{" + field + "}", value)
        return text

    return Workload(
        tuple(dict.fromkeys(map(named, packages))),
        named(script),
        tuple(map(named, uses)),
        tuple((k, named(v)) for k, v in env),
    )


LIBS = (("LD_LIBRARY_PATH", "{root}/{lib}"),)

WORKLOADS = {
    "git": workload(
        ("git",),
        """G={root}/usr/bin/git; export GIT_EXEC_PATH={root}/usr/lib/git-core
        $G init -q -b main .; cp {data}/text.txt .; $G add text.txt
        export GIT_AUTHOR_DATE='2024-01-01T00:00:00Z' GIT_COMMITTER_DATE='2024-01-01T00:00:00Z'
        $G -c user.name=h -c user.email=h@example.org commit -qm first
        $G log --format='%H %s'; $G cat-file -p 'HEAD^{tree}'; $G grep -c hugify; $G --version""",
        ("usr/bin/git",),
    ),
    "perl": workload(
        ("perl-base",),
        """{root}/usr/bin/perl -e 'my %w; $w{$_}++ for map { split } <>;
        printf "%s %d\n", $_, $w{$_} for (sort { $w{$b} <=> $w{$a} || $a cmp $b } keys %w)[0..5];
        printf "%.12f\n", atan2(1, 1) * 4' {data}/text.txt""",
        ("usr/bin/perl",),
    ),
    "openssl": workload(
        ("{ssl}",),
        """openssl version; openssl dgst -sha256 -sha512 {data}/text.txt | sed 's|.*/||'
        openssl enc -aes-256-cbc -K 000102030405060708090a0b0c0d0e0f000102030405060708090a0b0c0d0e0f \
            -iv 0f0e0d0c0b0a09080706050403020100 -in {data}/text.txt | openssl dgst -sha256 -r
        openssl pkey -in {data}/ec.pem -pubout""",
        ("{lib}/libcrypto.so.3",),
        LIBS,
    ),
    "sqlite": workload(
        ("libsqlite3-0",),
        """python3 -c 'import sqlite3; db = sqlite3.connect(":memory:"); print(sqlite3.sqlite_version)
db.execute("create table w(word text)")
db.executemany("insert into w values (?)", [(w,) for w in open("{data}/text.txt").read().split()])
print(db.execute("select word, count(*) c from w group by word order by c desc, word limit 5").fetchall())'""",
        ("{lib}/libsqlite3.so.0",),
        LIBS,
    ),
    "z3": workload(
        ("libz3-4",),
        """python3 -c 'import ctypes as c; z = c.CDLL("{root}/{lib}/libz3.so.4")
z.Z3_mk_context.restype = z.Z3_mk_config.restype = c.c_void_p
z.Z3_eval_smtlib2_string.restype = c.c_char_p; z.Z3_eval_smtlib2_string.argtypes = [c.c_void_p, c.c_char_p]
ctx = z.Z3_mk_context(c.c_void_p(z.Z3_mk_config()))
print(z.Z3_eval_smtlib2_string(ctx, b"(declare-const x Int) (declare-const y Int) \
(assert (= (+ (* x x) (* y y)) 1105)) (assert (< 0 x y 25)) (check-sat) (get-value (x y))").decode())'""",
        ("{lib}/libz3.so.4",),
    ),
    "llvm": workload(
        ("libllvm{llvm}",),
        """/usr/lib/llvm-{llvm}/bin/llvm-objdump -d --no-show-raw-insn {data}/hello.o
        echo 'vpaddd %ymm1, %ymm2, %ymm3; lock xaddq %rax, (%rbx)' | /usr/lib/llvm-{llvm}/bin/llvm-mc -show-encoding""",
        ("{lib}/{llvm_lib}",),
        LIBS,
    ),
    "icu": workload(
        ("libicu{icu}",),
        """python3 -c 'import ctypes as c; i = c.CDLL("{root}/{lib}/libicui18n.so.{icu}")
i.ucol_open_{icu}.restype = c.c_void_p; err = c.c_int(0); col = c.c_void_p(i.ucol_open_{icu}(b"de", c.byref(err)))
def key(word):
    k = c.create_string_buffer(64)
    n = i.ucol_getSortKey_{icu}(col, c.create_string_buffer(word.encode("utf-16-le") + bytes(2)), -1, k, 64)
    return k.raw[:n]
print(sorted(["Zebra", "Äpfel", "apfel", "Straße", "Strasse", "Öl", "zz", "Ölung"], key=key), err.value)'""",
        ("{lib}/libicui18n.so.{icu}.1",),
        LIBS,  # its libicuuc too: the system may have none of that version
    ),
    "x265": workload(
        ("libx265-{x265}", "x265"),
        """x={root}/usr/bin/x265; $x --version 2>&1 | grep -o 'version [^ ]*'
        $x --input {data}/frames.yuv --input-res 64x64 --fps 25 --frames 6 --preset medium --pools none \
            --frame-threads 1 --no-wpp --no-info --log-level error -o /dev/stdout | sha256sum""",
        ("{lib}/libx265.so.{x265}",),
        LIBS,
    ),
    "binutils": workload(
        ("{gold}",),
        """{root}/usr/bin/x86_64-linux-gnu-ld.gold -pie -o hello --build-id=sha1 --eh-frame-hdr \
            -dynamic-linker /lib64/ld-linux-x86-64.so.2 {data}/crt/Scrt1.o {data}/crt/crti.o {data}/crt/crtbeginS.o \
            {data}/hello.o -L/usr/lib/x86_64-linux-gnu -lc {data}/crt/crtendS.o {data}/crt/crtn.o
        sha256sum hello; ./hello; out=$PWD; cd {data}/split
        {root}/usr/bin/x86_64-linux-gnu-dwp -e hello -o "$out/hello.dwp"; sha256sum "$out/hello.dwp" | cut -d' ' -f1""",
        ("usr/bin/x86_64-linux-gnu-ld.gold", "usr/bin/x86_64-linux-gnu-dwp"),
    ),
    "systemd": workload(
        ("libsystemd-shared",),
        """systemd-analyze timespan '1h 30min 5s' 2>&1 | tail -n 3
        systemd-analyze syscall-filter @basic-io; systemd-escape --path /srv/a-b/c""",
        ("{lib}/systemd/libsystemd-shared-{systemd}.so",),
        (("LD_LIBRARY_PATH", "{root}/{lib}/systemd"),),
    ),
    "ssh": workload(
        ("openssh-client",),
        """{root}/usr/bin/ssh -V 2>&1 | cut -d, -f1; {root}/usr/bin/ssh -G -p 2222 -l someone example.org | sort
        {root}/usr/bin/ssh-keygen -y -f {data}/id_ed25519; {root}/usr/bin/ssh-keygen -l -f {data}/id_ed25519.pub""",
        ("usr/bin/ssh",),
    ),
    "ripgrep": workload(
        ("ripgrep",),
        """r={root}/usr/bin/rg; $r --version | head -n 1; $r -n --sort path -e 'hugify [a-z]+' -e '^[0-9]{3}' {data}
        $r -c --pcre2 '(?<=page )cache' {data}/text.txt || true""",
        ("usr/bin/rg",),
    ),
    "age": workload(
        ("age",),
        """a={root}/usr/bin/age; $a --version; {root}/usr/bin/age-keygen -y {data}/age.key
        $a -r "$(sed -n 's/# public key: //p' {data}/age.key)" {data}/text.txt | $a -d -i {data}/age.key | sha256sum""",
        ("usr/bin/age", "usr/bin/age-keygen"),
    ),
    "docker": workload(
        ("docker.io", "{docker_cli}"),
        """{root}/usr/bin/docker --version; {root}/usr/bin/docker --help | head -n 20
        {root}/usr/sbin/dockerd --version; {root}/usr/sbin/dockerd --help | grep -c -- --""",
        ("usr/bin/docker", "usr/sbin/dockerd"),
    ),
    "gdb": workload(
        ("gdb", "libpython{python}"),
        r"""{root}/usr/bin/gdb -nx -batch -ex 'python print(sum(i * i for i in range(10000)))' \
            -ex 'info functions ^main$' -ex 'break main' -ex run -ex bt \
            -ex 'python print(gdb.selected_frame().name())' {data}/hello-g 2>&1 |
            grep -v -e '^\[' -e 'libthread_db' -e 'process [0-9]'""",
        ("usr/bin/gdb", "{lib}/libpython{python}.so.1.0"),
        LIBS,
    ),
    "libstdc++": workload(("libstdc++6",), "{data}/cxx", ("{lib}/libstdc++.so.{stdcxx}",), LIBS),
}
PACKAGES = sorted({p for w in WORKLOADS.values() for p in w.packages})

HELLO = '#include <stdio.h>\nint main(void) { puts("hello from a gold-linked PIE"); return 0; }\n'


def corpus() -> Path:
    """The unpacked packages (cached under the test cache)."""
    return debian_packages(CORPUS, PACKAGES)


def prepare_inputs(original: Path, data: Path) -> None:
    """The workloads' inputs, made with the system's tools (and the original age-keygen)."""
    data.mkdir(parents=True, exist_ok=True)

    def sh(*cmd: str, cwd: Path = data) -> str:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True).stdout

    words = ["hugify", "page", "cache", "folio", "huge", "TLB", "segment", "Größe"]
    lines = [f"{n:03d} " + " ".join(words[(n * k) % len(words)] for k in range(1, 9)) for n in range(2000)]
    (data / "text.txt").write_text("\n".join(lines) + "\n")
    (data / "hello.c").write_text(HELLO)
    sh("gcc", "-O2", "-fPIE", "-c", "hello.c", "-o", "hello.o")
    sh("gcc", "-O0", "-g", "hello.c", "-o", "hello-g")
    (data / "split").mkdir(exist_ok=True)
    sh("gcc", "-gdwarf-4", "-gsplit-dwarf", "../hello.c", "-o", "hello", cwd=data / "split")
    (data / "crt").mkdir(exist_ok=True)
    for name in ("Scrt1.o", "crti.o", "crtbeginS.o", "crtendS.o", "crtn.o"):
        shutil.copy(sh("gcc", f"-print-file-name={name}").strip(), data / "crt" / name)
    (data / "cxx.cc").write_text(CXX_WORKLOAD)
    sh("g++", "-O2", "-pthread", "cxx.cc", "-o", "cxx")
    sh("openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "ec.pem")
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "corpus", "-f", "id_ed25519")
    sh(str(original / "usr/bin/age-keygen"), "-o", "age.key")
    # Six 64x64 4:2:0 frames of a moving gradient, for the encoder.
    frames = bytearray()
    for f in range(6):
        frames += bytes((x + y + 4 * f) & 0xFF for y in range(64) for x in range(64))
        frames += bytes((128 + x - y) & 0xFF for _ in range(2) for y in range(32) for x in range(32))
    (data / "frames.yuv").write_bytes(frames)


def copy_tree(src: Path, dst: Path) -> None:
    """A copy that keeps hardlinks, as a package build root has them."""
    subprocess.run(["cp", "-a", "--", str(src), str(dst)], check=True)


def expand(template: str, root: Path, data: Path) -> str:
    return template.replace("{root}", str(root)).replace("{data}", str(data)).replace("{lib}", LIB)


def run_workload(w: Workload, root: Path, data: Path, trace: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Runs the workload; with `trace`, the dynamic loader logs what it loads to
    files named trace.PID (stderr may be part of the workload's output)."""
    env = {**os.environ, "LC_ALL": "C.UTF-8"}
    env.update({k: expand(v, root, data) for k, v in w.env})
    if trace:
        env.update(LD_DEBUG="libs", LD_DEBUG_OUTPUT=str(trace))
    script = "set -e\n" + expand(w.script, root, data)
    with tempfile.TemporaryDirectory(prefix="hugify-workload-") as cwd:
        return subprocess.run(
            ["sh", "-c", script], capture_output=True, text=True, env=env, cwd=cwd, timeout=300, check=False
        )


def missing_files(w: Workload, root: Path, data: Path) -> set[str]:
    """The files of `uses` that the workload neither ran nor had mapped."""
    with tempfile.TemporaryDirectory(prefix="hugify-ld-debug-") as tmp:
        run_workload(w, root, data, trace=Path(tmp) / "trace")
        log = "".join(p.read_text(errors="replace") for p in Path(tmp).iterdir())
    seen = set(re.findall(r"calling init: (\S+)", log))
    seen |= set(re.findall(r"(/[^\s=]*/usr/s?bin/[\w.+-]+)", expand(w.script, root, data)))
    real = {os.path.realpath(p) for p in seen}
    return {u for u in w.used_files if os.path.realpath(root / u) not in real}


def transform_tree(root: Path, jobs: int) -> tuple[dict[str, Any], float]:
    """hugify tree over `root` under the corpus policy: its JSON report and wall time."""
    with tempfile.TemporaryDirectory(prefix="hugify-corpus-") as tmp:
        policy, report = Path(tmp) / "policy.toml", Path(tmp) / "report.json"
        policy.write_text(POLICY)
        start = time.perf_counter()
        hugify("tree", "--policy", policy, "--jobs", str(jobs), "--no-progress", "--report", report, root)
        seconds = time.perf_counter() - start
        return json.loads(report.read_text()), seconds


@dataclass
class Summary:
    elf_files: int
    eligible: int  # at or above the threshold
    transformed: int
    as_is: int  # listed without a rewrite: code on whole windows already
    refused: Counter[str]
    input_bytes: int  # of the transformed files, before
    growth: int
    median_coverage: float

    @property
    def share(self) -> float:
        """Of the files over the threshold, those whose code gets huge pages."""
        return (self.transformed + self.as_is) / self.eligible if self.eligible else 0.0

    def lines(self) -> list[str]:
        mib = 1 << 20
        refused = ", ".join(f"{r} {n}" for r, n in sorted(self.refused.items())) or "none"
        return [
            f"ELF files          {self.elf_files} in {len(PACKAGES)} packages,"
            f" {self.eligible} with code over the threshold",
            f"transformed        {self.transformed} of {self.eligible}, as-is {self.as_is}"
            f" ({100 * self.share:.1f} % get huge pages)",
            f"refused            {refused}",
            f"growth             {self.growth / mib:.1f} MiB over {self.input_bytes / mib:.1f} MiB"
            f" ({100 * self.growth / max(self.input_bytes, 1):.1f} %)",
            f"median coverage    {100 * self.median_coverage:.1f} % of code on huge pages",
        ]


def summarize(report: dict[str, Any], root: Path) -> Summary:
    """The figures of a `hugify tree` report over the transformed `root`."""
    files = report["files"]
    done = [f for f in files if f["status"] == "transformed"]
    as_is = sum(f["status"] == "as-is" for f in files)
    refused = Counter(f["reason"] for f in files if f["status"] == "skipped" and f["reason"] != "below-threshold")
    return Summary(
        elf_files=len(files),
        eligible=len(done) + as_is + sum(refused.values()),
        transformed=len(done),
        as_is=as_is,
        refused=refused,
        input_bytes=sum((root / f["path"].lstrip("/")).stat().st_size - f["growth"] for f in done),
        growth=sum(f["growth"] for f in done),
        median_coverage=statistics.median(f["coverage"] for f in done) if done else 0.0,
    )


#: The corpus's directory under the test cache.
CORPUS = "debian-corpus"


def parse_size(text: str) -> int:
    units = {"K": 10, "M": 20, "G": 30}
    return int(text[:-1]) << units[text[-1]] if text[-1] in units else int(text)


def hugified_tree(work: Path, manifest: Path | None = None) -> list[Path]:
    """A copy of the test corpus's unpacked packages (work/root), transformed by `hugify
    tree` (and its manifest written to `manifest`); the transformed files."""
    roots = sorted((cache_root() / CORPUS).glob("root-*"))
    if not roots:
        raise SystemExit(f"no corpus under {cache_root() / CORPUS}: run tests/test_debian_corpus.py once")
    root = work / "root"
    shutil.copytree(roots[-1], root, symlinks=True)
    policy = work / "policy.toml"
    policy.write_text("refuse_stripped = false\n")
    report = work / "report.json"
    more = ["--manifest", manifest] if manifest else []
    res = hugify("tree", "--policy", policy, "--report", report, *more, root, check=False)
    if res.returncode not in (0, 1):
        raise SystemExit(f"hugify tree failed:\n{res.stdout}{res.stderr}")
    files = json.loads(report.read_text())["files"]
    return sorted(root / f["path"].lstrip("/") for f in files if f["status"] == "transformed")
