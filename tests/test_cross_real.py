"""Real Debian libraries of another architecture: libc6 and libstdc++6 for arm64,
fetched with apt-get download and unpacked with dpkg-deb, rewritten, and used by a
test program under qemu-aarch64."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from testkit import HP
from testkit.cli import hugify
from testkit.elf import readelf_loads
from testkit.recipes import CXX_WORKLOAD, debian_packages

PACKAGES = ["libc6:arm64", "libstdc++6:arm64", "libgcc-s1:arm64"]


@pytest.fixture(scope="session")
def arm64_root() -> Path:
    return debian_packages("debs-arm64", PACKAGES)


def _lib(root: Path, name: str) -> Path:
    """A library of the unpacked packages (libc6 still installs under /lib)."""
    for d in ("usr/lib/aarch64-linux-gnu", "lib/aarch64-linux-gnu"):
        if (root / d / name).exists():
            return (root / d / name).resolve()
    raise AssertionError(f"{name} is not in {root}")


def _run(root: Path, prog: Path, libdir: Path, debug: bool = False) -> subprocess.CompletedProcess[str]:
    """Runs `prog` under qemu with the unpacked packages as its root: its ld.so must
    come from the same glibc build as the libc.so.6 it loads."""
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "LD_LIBRARY_PATH": str(libdir)}
    if debug:
        env["LD_DEBUG"] = "libs"
    return subprocess.run(
        ["qemu-aarch64", "-L", str(root), str(prog)], capture_output=True, text=True, env=env, timeout=300, check=True
    )


def test_arm64_libc_and_libstdcxx_under_qemu(arm64_root: Path, tmp_path: Path) -> None:
    orig, new = tmp_path / "orig", tmp_path / "new"
    orig.mkdir()
    new.mkdir()
    # Worked from readelf: libc's executable load holds no whole 2 MiB window, so it is
    # shifted; libstdc++'s runs from 0 to 0x1fa0c5, which the 64 KiB pages it is linked
    # for (and aarch64's 64 KiB kernels map) round up to exactly one window: aligned in
    # place, its load grown to the window's end.
    for name, mode in (("libc.so.6", "shift"), ("libstdc++.so.6", "align")):
        src = _lib(arm64_root, name)
        (orig / name).write_bytes(src.read_bytes())
        report = json.loads(hugify("transform", "--json", src, "-o", new / name).stdout)
        assert report["arch"] == "aarch64" and report["result"]["mode"] == mode, report
        (x,) = [s for s in readelf_loads(new / name) if "E" in s.flags]
        assert x.vaddr % HP == 0 and x.offset % HP == 0 and x.memsz % HP == 0
    for d in (orig, new):
        (d / "libgcc_s.so.1").write_bytes(_lib(arm64_root, "libgcc_s.so.1").read_bytes())
    src = tmp_path / "w.cc"
    src.write_text(CXX_WORKLOAD)
    prog = tmp_path / "w"
    subprocess.run(["aarch64-linux-gnu-g++", "-O2", "-pthread", str(src), "-o", str(prog)], check=True)
    expected = _run(arm64_root, prog, orig).stdout
    assert "thrown matches=2 thread=42" in expected
    assert _run(arm64_root, prog, new).stdout == expected
    loaded = _run(arm64_root, prog, new, debug=True).stderr
    for name in ("libc.so.6", "libstdc++.so.6"):
        assert f"calling init: {new / name}" in loaded, loaded


def test_arm64_dynamic_loader_is_never_shifted(arm64_root: Path) -> None:
    """ld.so computes its own address with adrp: the byte probe must see it."""
    ldso = _lib(arm64_root, "ld-linux-aarch64.so.1")
    (r,) = json.loads(hugify("inspect", "--json", "--threshold", "0", ldso, check=False).stdout)
    assert r["plans"]["shift"]["reason"] == "ehdr-reference", r["plans"]["shift"]
