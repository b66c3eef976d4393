"""Real Debian 12 binaries: a dozen packages with large programs and libraries, fetched
with apt-get download (versions as the archive has them), unpacked, and every ELF
program or library with at least 1 MiB of code transformed. Each is transformed and
passes eu-elflint with nothing new, or is refused with a reason; never reported as
invalid input, an I/O error or an internal error. Transformed programs that take
--version still run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from fixtures import debian_packages
from helpers import elflint, hugify

PACKAGES = [
    "git",
    "perl-base",
    "python3.11-minimal",
    "libssl3",
    "libsqlite3-0",
    "libz3-4",
    "libavcodec59",
    "libicu72",
    "libx265-199",
    "binutils-x86-64-linux-gnu",
    "libsystemd-shared",
    "openssh-client",
    "ripgrep",
]
RUNS = {"git": ["--version"], "perl": ["-v"], "python3.11": ["--version"], "ssh": ["-V"], "rg": ["--version"]}


@pytest.fixture(scope="module")
def corpus() -> Path:
    return debian_packages("debian-corpus", PACKAGES)


def _elf_dyn_files(root: Path) -> list[Path]:
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_symlink() or not p.is_file() or "/debug/" in str(p):
            continue
        with p.open("rb") as f:
            if f.read(4) != b"\x7fELF":
                continue
            f.seek(0)
            try:
                if ELFFile(f)["e_type"] == "ET_DYN":
                    out.append(p)
            except ELFError:
                continue
    return out


def test_debian_binaries_are_transformed_or_refused_with_a_reason(corpus: Path, tmp_path: Path) -> None:
    results: dict[str, str] = {}
    for src in _elf_dyn_files(corpus):
        name = str(src.relative_to(corpus))
        out = tmp_path / src.name
        res = hugify("transform", "--json", src, "-o", out, check=False)
        report = json.loads(res.stdout)
        if res.returncode == 0:
            assert elflint(out) - elflint(src) == set(), name
            results[name] = report["result"]["mode"]
            if src.name in RUNS:
                want = subprocess.run([str(src), *RUNS[src.name]], capture_output=True, text=True, check=False)
                got = subprocess.run([str(out), *RUNS[src.name]], capture_output=True, text=True, check=False)
                assert (got.returncode, got.stdout) == (want.returncode, want.stdout), name
            out.unlink()
        else:
            assert res.returncode == 4, (name, res.returncode, report)  # refused, never invalid/internal
            results[name] = report["error"]["reason"]
    transformed = [n for n, r in results.items() if r in ("shift", "align")]
    assert len(transformed) >= 12, results
    assert any(n.endswith("/git") for n in transformed), results
    assert "usr/bin/rg" in transformed, results  # Rust
