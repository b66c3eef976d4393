"""bench/speedup.py --quick: every workload of the speedup benchmark prepares and runs
through `hugify try` (one round each, smallest inputs; none may be unavailable), so
that the benchmark cannot rot. The figures of a single round mean nothing; what is
checked is that each workload gives numbers or says why it could not, that each run
mapped its side's files (and no other), that the hugified iTLB program really ran on
huge pages, and that only the workload's own tree was hugified.

`--ways`: every way of getting code onto huge pages (hugify's two, the peers hugifyr and
iodlr, glibc 2.44's own advice, a relink) in one interleaved run of the iTLB program,
each seen with the huge pages it claims in its own processes' smaps; a peer that does
not build, or crashes, is a column that says so."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from bench.peers import ALL
from testkit.cache import cache_root
from testkit.peers import HUGIFYR_ARCHIVE
from testkit.recipes import build_itlb
from testkit.runtime import REPO, Programs, copy_programs, gives_large_folios, locked

#: The one way to start a benchmark (bench/README.md).
BENCH = str(REPO / "tools" / "bench")
WORKLOADS = {
    "clang", "clang-anon", "clang-shared", "gcc", "postgres", "python", "itlb", "itlb-anon", "itlb-shared", "node",
    "apache",
}  # fmt: skip
#: The huge pages each way claims, as its processes' smaps show them (the field of
#: hugify.trial.ways' report of an object).
CLAIMS = {
    "hugify": "file_pmd_mapped",
    "hugify-shared": "shmem_pmd_mapped",  # root's shared copies: a tmpfs's huge pages
    "hugifyr": "file_pmd_mapped",  # collapsed by tcollapse.so
    "iodlr": "anon_huge_pages",  # the code copied into anonymous memory
    "glibc-hugified": "file_pmd_mapped",
    "glibc-original": "file_pmd_mapped",
    "relink": "file_pmd_mapped",
    "relink-glibc": "file_pmd_mapped",
}


def test_the_benchmark_runs_through_tools_bench():
    """`tools/bench speedup`, started from another directory with only the system's
    directories on PATH (whose python3 lacks the development packages), runs the
    benchmark with the project's .venv."""
    res = subprocess.run(
        [BENCH, "speedup", "--help"],
        cwd="/",
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert res.returncode == 0, res.stderr
    # the usage line names the way it was started, not the file python -m runs
    assert res.stdout.startswith("usage: tools/bench speedup [-h]") and res.stderr == ""


@pytest.mark.slow
def test_quick_run_of_every_workload(built: Programs, tmp_path: Path):
    """hugify try keeps the benchmark's hugified copies under the test cache: whether their
    file-backed windows can be huge is that filesystem's and the kernel's answer, measured
    first on a hugified file there (without hugify), not assumed."""
    out = tmp_path / "speedup.json"
    with locked():  # it prefetches and measures the page cache, as the runtime tests do
        cache_root().mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache_root()) as probe:  # the filesystem of hugify try's copies
            large = gives_large_folios(copy_programs(built, Path(probe)).prog)
        res = subprocess.run(
            [BENCH, "speedup", "--quick", "--json", str(out)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=3600,
            check=False,
        )
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    results = doc["workloads"]
    assert set(results) == WORKLOADS
    # tools/setup-dev-env installs what every workload needs (g++-12, the Debian
    # archive's packages, a user to run postgres as): each one is measured here.
    assert {name: r["status"] for name, r in results.items()} == dict.fromkeys(WORKLOADS, "measured"), {
        name: r.get("reason") for name, r in results.items() if r["status"] != "measured"
    }
    for name, r in results.items():
        assert r["rounds"] == 1
        assert r["cpu"]["median"] > 0 and r["wall"]["median"] > 0, name
        assert r["cpu"]["ci95"] is None  # one round gives no interval, and says so
        assert r["verdict"] == "no-interval", (name, r["answer"])
        # Each side mapped only its own files (hugify try checks every run).
        assert r["problems"] == [], (name, r["problems"])
        used = [o for o in r["objects"] if o["copy"]]
        assert used, name
        for o in used:
            assert o["path"].startswith(f"{cache_root()}/"), (name, o["path"])  # the workload's tree
            assert o["seen"]["hugified"]["resident_code"] > 0, (name, o)
        assert all(o["reason"] == "excluded" for o in r["objects"] if not o["copy"]), name
        assert name in res.stdout
    itlb = results["itlb"]
    (obj,) = [o for o in itlb["objects"] if o["copy"]]
    assert obj["status"] == "transformed" and obj["mode"] == "shift"
    assert obj["seen"]["hugified"]["windows"] >= 16
    assert obj["seen"]["original"]["pmd_mapped"] == 0, obj
    if large:
        assert obj["seen"]["hugified"]["pmd_mapped"] > 0 and obj["seen"]["hugified"]["windows_huge"] > 0, obj
        assert obj["seen"]["hugified"]["windows_small"] == 0, obj
    else:  # nothing file-backed can be huge there: and nothing claims it is
        assert obj["seen"]["hugified"]["pmd_mapped"] == 0 and obj["seen"]["hugified"]["windows_huge"] == 0, obj
    # the anonymous-copy variant: its process held one anonymous huge page per window
    anon = results["itlb-anon"]
    (obj,) = [o for o in anon["objects"] if o["copy"]]
    assert anon["way"] == "anonymous" and anon["coverage"]["anonymous_held"] == obj["seen"]["hugified"]["windows"] * (
        2 << 20
    ), anon["coverage"]
    # the shared-copy variant: the copy is on a tmpfs without huge pages, so every huge
    # page its process mapped is one of root's shared copy, which holds every window once
    shared = results["itlb-shared"]
    (obj,) = [o for o in shared["objects"] if o["copy"]]
    windows = obj["seen"]["hugified"]["windows"]
    assert shared["way"] == "shared", shared["notes"]
    assert shared["coverage"]["shared_held"] >= windows * (2 << 20), shared["coverage"]
    assert obj["seen"]["hugified"]["pmd_mapped"] == windows * (2 << 20), obj
    assert obj["seen"]["hugified"]["windows_small"] == 0, obj
    # python has no whole window of code: the A/A control, plain copies
    python = results["python"]
    assert python["control"] and {o["status"] for o in python["objects"] if o["copy"]} == {"copied"}


def test_unknown_workload_is_a_usage_error():
    cmd = [BENCH, "speedup", "--only", "itlb,nosuch"]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    assert res.returncode == 2
    known = "clang, clang-anon, clang-shared, gcc, postgres, python, itlb, itlb-anon, itlb-shared, node, apache"
    assert f"unknown workload nosuch; known: {known}" in res.stderr
    cmd = [BENCH, "speedup", "--ways", "hugify,nosuch"]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    assert res.returncode == 2 and f"unknown way nosuch; known: {', '.join(ALL)}" in res.stderr


def _large_folios(built: Programs) -> bool:
    """Whether files in the test cache (where hugify try keeps its copies) get 2 MiB
    folios: that filesystem's and the kernel's answer, measured first on a hugified
    file there (without hugify), not assumed."""
    cache_root().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_root()) as probe:
        return gives_large_folios(copy_programs(built, Path(probe)).prog)


@pytest.mark.slow
def test_quick_run_of_every_way_on_the_itlb_program(built: Programs, tmp_path: Path):
    """`--ways all` on the iTLB program, one round: every way ran (its untimed run and,
    with huge pages, its round) and behaved as the originals did; each that is timed
    had the huge pages it claims in its own processes' smaps, of that kind only, in
    every run, and mapped its own file of the program; each that had none is reported
    as such, not timed."""
    out = tmp_path / "ways.json"
    with locked():
        large = _large_folios(built)
        res = subprocess.run(
            [BENCH, "speedup", "--quick", "--ways", "all", "--only", "itlb", "--json", str(out)],
            cwd=REPO, capture_output=True, text=True, timeout=1800, check=False,
        )  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    assert doc["options"]["ways"] == list(ALL)
    r = doc["workloads"]["itlb"]
    assert r["status"] == "measured", r.get("reason")
    assert r["rounds"] == 1 and r["noise_floor"]["cpu"]["median"] > 0
    assert r["problems"] == []  # the originals' runs mapped no way's file
    assert set(r["ways"]) == set(ALL)
    for name, w in r["ways"].items():
        assert w["status"] in ("measured", "no-huge-pages"), (name, w["status"], w["reason"])
        (obj,) = w["objects"].values()
        assert obj["mapped"] == ["own"], (name, obj)  # its own file of the program, no other way's
        if w["status"] == "measured":
            assert w["rounds"] == 1 and w["runs"] == 2 and w["cpu"]["median"] > 0, (name, w)
            assert w["runs_with_huge_pages"] == 2, (name, w)
            assert obj[CLAIMS[name]] > 0 and obj["huge"] == obj[CLAIMS[name]], (name, obj)
        else:
            assert w["runs"] == 1 and w["cpu"] is None and obj["huge"] == 0, (name, w)
        assert f"{name:16} " in res.stdout
    ways = r["ways"]
    # What gets its huge pages by itself wherever this suite runs (as root): root's shared
    # copies, hugifyr's collapse (on XFS), iodlr's anonymous copies.
    for name in ("hugify-shared", "hugifyr", "iodlr"):
        assert ways[name]["status"] == "measured", (name, ways[name]["reason"])
    assert ways["hugify"]["status"] == ("measured" if large else "no-huge-pages")
    (hugifyr,) = ways["hugifyr"]["objects"].values()
    assert hugifyr["runs"] == "rewritten by hugifyr"
    # ld.so advises only windows whose file offset and address agree: none of the
    # original's (a 4 KiB-aligned PIE); and a relink alone advises nothing
    assert ways["glibc-original"]["status"] == "no-huge-pages"
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    if "[always]" not in thp:
        assert ways["relink"]["status"] == "no-huge-pages"


#: A way whose every run dies: a preload library that aborts the program.
CRASHER_C = "#include <stdlib.h>\n__attribute__((constructor)) static void die(void) { abort(); }\n"
#: The comparison with a failing peer beside hugify's way, as bench/speedup.py makes it.
DRIVER = """
import json, sys
from pathlib import Path
from hugify import abtest
from hugify.trial import session, ways
from bench import peers
program, crasher, out = sys.argv[1:]
policy = Path(out).with_name("policy.toml")
policy.write_text(f'include = ["{Path(program).parent}/**"]\\n')
def lacking(ctx):
    raise ways.WayUnavailable("it needs what this machine lacks")
opts = session.Options(
    argv=[program, "300"], env={"PATH": "/usr/bin:/bin"}, cwd=str(Path(out).parent),
    policy=session.try_policy(policy), limits=abtest.Limits(1, 1, 300, 0.02), cache_dir=Path(out).with_name("try"),
)
crashing = ways.Way("crasher", "aborts at start", lambda ctx: ways.Plan(env={"LD_PRELOAD": crasher}))
chosen = [ways.HUGIFY, *peers.ways(["hugifyr"]), crashing, ways.Way("lacking", "", lacking)]
Path(out).write_text(json.dumps(ways.run(opts, chosen)))
"""


@pytest.mark.slow
def test_a_peer_that_fails_to_build_or_crashes_is_a_column(built: Programs, tmp_path: Path):
    """A peer whose sources do not build (a hugifyr archive whose configure fails), a way
    whose runs crash (a preload library that aborts) and one that cannot run here are
    each reported with why, in a run that measures hugify's way beside them."""
    peers_dir = tmp_path / "peers"
    peers_dir.mkdir()
    configure = b"#!/bin/sh\necho 'configure: error: libelf is too old' >&2\nexit 1\n"
    with tarfile.open(peers_dir / HUGIFYR_ARCHIVE, "w:gz") as t:
        info = tarfile.TarInfo("hugifyr/configure")
        info.size, info.mode = len(configure), 0o755
        t.addfile(info, io.BytesIO(configure))
    (tmp_path / "crasher.c").write_text(CRASHER_C)
    crasher = tmp_path / "crasher.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", crasher, tmp_path / "crasher.c"], check=True)
    program = build_itlb(4096) / "itlb"
    out = tmp_path / "ways.json"
    # the failing build is cached where it hides no real one: a test cache of its own
    env = {**os.environ, "HUGIFY_PEERS": str(peers_dir), "HUGIFY_TEST_CACHE": str(tmp_path / "cache")}
    with locked():
        large = _large_folios(built)
        res = subprocess.run(
            [sys.executable, "-c", DRIVER, str(program), str(crasher), str(out)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
    assert res.returncode == 0, res.stderr
    r = json.loads(out.read_text())
    ways = r["ways"]
    assert ways["hugify"]["status"] == ("measured" if large else "no-huge-pages"), ways["hugify"]
    assert r["rounds"] == 1
    assert ways["hugifyr"]["status"] == "unavailable"
    assert ways["hugifyr"]["reason"] == (
        "peer-hugifyr failed to build: `configure` failed (exit status 1): configure: error: libelf is too old"
    ), ways["hugifyr"]["reason"]
    crash = ways["crasher"]
    assert crash["status"] == "behaviour-differs" and crash["runs"] == 1 and crash["cpu"] is None, crash
    assert "exit status 0 vs -6" in crash["reason"] and "killed by signal 6" in crash["reason"], crash["reason"]
    assert (ways["lacking"]["status"], ways["lacking"]["reason"]) == ("unavailable", "it needs what this machine lacks")


@pytest.mark.slow
def test_a_bundle_runs_the_measurement_from_its_own_root(built: Programs, tmp_path: Path):
    """`--bundle DIR` carries the measurement (here the iTLB program, hugify's way and
    iodlr's) to a machine without network or package manager: DIR/run.sh, given nothing
    but /bin/sh, runs it with DIR/root as its root, which holds the bundle's files and no
    other (no git there: the JSON's commit is the bundle's, not this checkout's), and
    writes the same JSON with the same ways measured."""
    bundle = tmp_path / "bundle"
    out = tmp_path / "out" / "speedup.json"
    cmd = [BENCH, "speedup", "--bundle", str(bundle), "--ways", "hugify,iodlr", "--only", "itlb"]
    with locked():
        large = _large_folios(built)
        made = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800, check=False)
        assert made.returncode == 0, made.stderr[-3000:]
        res = subprocess.run(
            [str(bundle / "run.sh"), str(out), "--quick"],
            cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=1800, check=False,
        )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    manifest = json.loads((bundle / "bundle.json").read_text())
    assert set(manifest["fixtures"]) == {"itlb", "peer:iodlr"}  # what these ways use, no more
    assert (manifest["only"], manifest["ways"]) == (["itlb"], ["hugify", "iodlr"])
    doc = json.loads(out.read_text())
    assert doc["bundle"] == manifest["prepared"] and doc["options"]["ways"] == ["hugify", "iodlr"]
    assert doc["machine"]["commit"] is None and manifest["prepared"]["commit"]
    r = doc["workloads"]["itlb"]
    assert r["status"] == "measured", r.get("reason")
    assert r["ways"]["hugify"]["status"] == ("measured" if large else "no-huge-pages")
    iodlr = r["ways"]["iodlr"]
    (obj,) = iodlr["objects"].values()
    assert iodlr["status"] == "measured" and obj["anon_huge_pages"] > 0, iodlr
    assert not any("bundle" in line for line in Path("/proc/mounts").read_text().splitlines())  # its mounts ended
