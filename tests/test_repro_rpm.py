"""rpm builds with hugify on are reproducible: the test package's spec
(tests/rpm/hugify-test.spec, a program and a library with more than 1 MiB of code)
built twice by rpmbuild with this checkout's macros (the macros.d file, so hugify runs
before find-debuginfo and its check after it), in two different build roots
(_buildrootdir: the tree %install fills and hugify rewrites) and at two different
times (the second under faketime, three days later), with rpm's own reproducibility
settings: SOURCE_DATE_EPOCH, build time and file times from it, a fixed build host.
The build directory (_builddir) is the same: the spec compiles with -g and no
-ffile-prefix-map, so its compiler output would differ with the build path whether
hugify runs or not. Every rpm's payload (rpm's PAYLOADDIGEST
and the cpio stream itself) must be identical, and hugify must have transformed the
program and the library in both.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest

from testkit import REPO
from testkit.cache import cached
from testkit.cli import write_launcher
from testkit.debian import files_key, tool_versions, tree_files
from testkit.rpm import BRP, MACROS

pytestmark = pytest.mark.slow

RPM_DIR = REPO / "tests" / "rpm"
EPOCH = "1700000000"
REPRODUCIBLE = (
    ("use_source_date_epoch_as_buildtime", "1"),
    ("clamp_mtime_to_source_date_epoch", "1"),
    ("_buildhost", "reproducible"),
)


def _build(work: Path, name: str, faketime: str | None) -> tuple[int, str]:
    top = work / "top"
    (work / "home").mkdir(exist_ok=True)
    wrapper = write_launcher(work / "hugify", REPO / "policy" / "policy.toml")
    cmd = ["rpmbuild", "-bb", "--define", f"_topdir {top}", "--define", f"hugify_test_src {RPM_DIR}"]
    cmd += ["--define", f"_buildrootdir {work / name / 'buildroot'}", "--define", f"_rpmdir {work / name / 'RPMS'}"]
    cmd += ["--load", str(MACROS), "--define", f"__hugify {wrapper}", "--define", f"__hugify_brp {BRP}"]
    for k, v in REPRODUCIBLE:
        cmd += ["--define", f"{k} {v}"]
    if faketime:
        cmd = ["faketime", faketime, *cmd]
    res = subprocess.run(
        [*cmd, str(RPM_DIR / "hugify-test.spec")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "HOME": str(work / "home"), "SOURCE_DATE_EPOCH": EPOCH},
        check=False,
    )
    return res.returncode, res.stdout


@pytest.fixture(scope="module")
def builds() -> Path:
    inputs = [*tree_files(RPM_DIR), ("macros", MACROS), ("brp", BRP)]
    inputs += [(str(p.relative_to(REPO)), p) for p in sorted((REPO / "hugify").rglob("*.py"))]
    inputs.append(("core", REPO / "hugify" / "_core.abi3.so"))
    key = files_key(inputs, repr(REPRODUCIBLE), "buildrootdir", tool_versions("rpm", "debugedit", "gcc-12", "faketime"))

    def make(work: Path) -> None:
        for name, fake in (("first", None), ("second", "+3days")):
            rc, log = _build(work, name, fake)
            (work / f"{name}.log").write_text(log)
            assert rc == 0, log[-6000:]

    return cached("repro-rpm", key, make)


def payloads(rpms: Path) -> dict[str, tuple[str, str]]:
    """rpm name -> (PAYLOADDIGEST, sha256 of the cpio stream)."""
    out = {}
    for r in sorted(rpms.rglob("*.rpm")):
        digest = subprocess.run(
            ["rpm", "-qp", "--qf", "%{PAYLOADDIGEST}", str(r)], capture_output=True, text=True, check=True
        ).stdout
        cpio = subprocess.run(f"rpm2cpio {r}", shell=True, capture_output=True, check=True).stdout
        out[r.name] = (digest, hashlib.sha256(cpio).hexdigest())
    return out


def test_two_rpmbuild_runs_give_identical_payloads(builds: Path) -> None:
    first, second = payloads(builds / "first" / "RPMS"), payloads(builds / "second" / "RPMS")
    assert len(first) >= 2 and any("debuginfo" in n for n in first), first
    assert first == second
    for name in ("first", "second"):
        log = (builds / f"{name}.log").read_text()
        assert "hugify: hugify-test: 2 transformed" in log, log[-5000:]
        assert re.search(r"hugify: check: \S+: 3 hugified file\(s\) as hugify left them", log), log[-5000:]
