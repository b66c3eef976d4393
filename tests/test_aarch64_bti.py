"""aarch64 branch protection: a shared library built with -mbranch-protection=standard
carries BTI and PAC GNU properties, and qemu-user's loader then enforces BTI on its
pages (an indirect branch to anything but a landing pad traps). The rewritten library
must keep both properties and still run.

Debian 12's crt objects have no BTI marking, so the library is linked without them
(-nostartfiles); otherwise the linker drops the property (or, forced, the program
traps in crti's _init)."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import HP, hugify, readelf_loads, run_program

CC = "aarch64-linux-gnu-gcc"
RUNNER = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]
GEN_CODE = Path(__file__).parent / "programs" / "gen_code.py"

LIB_EXTRA = """
#include "lib_gen.h"
long lib_dispatch(long);
long lib_entry(long seed) { return lib_dispatch(seed) ^ (long)lib_table[3](seed); }
"""
MAIN = """
#include <stdio.h>
long lib_entry(long);
int main(int argc, char **argv) { printf("%ld\\n", lib_entry(argc)); return 0; }
"""


def _properties(path: Path) -> list[str]:
    out = subprocess.run(["readelf", "-nW", str(path)], capture_output=True, text=True, check=True).stdout
    return [line.split("Properties:")[1].strip() for line in out.splitlines() if "AArch64 feature" in line]


@pytest.fixture(scope="module")
def bti_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("bti")
    subprocess.run([sys.executable, str(GEN_CODE), "lib", "1400", "2", str(work)], check=True)
    (work / "lib_extra.c").write_text(LIB_EXTRA)
    (work / "main.c").write_text(MAIN)
    sources = ["lib_gen0.c", "lib_gen1.c", "lib_table.c", "lib_extra.c"]
    flags = ["-O2", "-fPIC", "-mbranch-protection=standard"]
    compile_jobs = [[CC, *flags, "-c", s, "-o", f"{s}.o"] for s in sources]
    with ThreadPoolExecutor(max_workers=2) as pool:
        for job in [pool.submit(subprocess.run, cmd, cwd=work, check=True) for cmd in compile_jobs]:
            job.result()
    objs = [f"{s}.o" for s in sources]
    subprocess.run([CC, "-shared", "-nostartfiles", "-o", "libbti.so", *objs], cwd=work, check=True)
    subprocess.run([CC, "-O2", "-o", "prog", "main.c", "-L.", "-lbti"], cwd=work, check=True)
    return work


def test_bti_pac_library_keeps_its_properties_and_runs(bti_build: Path, tmp_path: Path) -> None:
    orig = bti_build / "libbti.so"
    assert _properties(orig) == ["AArch64 feature: BTI, PAC"]
    new_dir = tmp_path / "new"
    new_dir.mkdir()
    new = new_dir / "libbti.so"
    hugify("transform", orig, "-o", new, "--mode", "shift")

    assert _properties(new) == _properties(orig)
    code = [seg for seg in readelf_loads(new) if seg.flags == "RE"]
    assert len(code) == 1 and code[0].vaddr % HP == 0 and code[0].offset % HP == 0, code
    phdrs = subprocess.run(["readelf", "-lW", str(new)], capture_output=True, text=True, check=True).stdout
    assert "GNU_PROPERTY" in phdrs

    prog = bti_build / "prog"
    before = run_program(prog, env={"LD_LIBRARY_PATH": str(bti_build)}, runner=RUNNER)
    after = run_program(prog, env={"LD_LIBRARY_PATH": str(new_dir)}, runner=RUNNER)
    assert before[0] == 0, before
    assert after == before
