"""The support half of the test suite and the benchmarks: what tests/ and bench/ both
import, as one package (never shipped: the wheel holds `hugify` only, the .deb and the
.rpm install from the wheel's file list).

Tests find it through pytest's `pythonpath` (pyproject.toml); benchmarks run as modules
of the checkout (`tools/bench NAME` runs `python -m bench.NAME` with the checkout on
PYTHONPATH), so no file edits `sys.path`.

Modules, each owning one thing:
- cli: running the hugify CLI and the programs it rewrote (one environment contract).
- elf: the ELF oracles (readelf, eu-elflint, pyelftools; never hugify._core).
- cache: the test cache, its lock and the one way a build lands in it.
- recipes: the test programs built from recipes, and their cache keys.
- rpm: the checkout's rpm macros and brp script as rpm is given them, macro expansion.
- smaps: the smaps oracle (one reader of /proc/PID/smaps).
- runtime: the runtime tests' programs, page-cache state and locks.
- shared: the shared-mapping (hugify-run --shared) test support.
- debian, debian_roots: Debian packages built for real, and clean Debian roots.
- corpus: real Debian binaries of the running release.
- annobin_notes: annobin build notes added to generated units.
- bench: timing child processes, interleaved repetitions, ratios (benchmarks).
- debusine: a debusine instance on this machine (docs/debusine.md; tools/debusine-deploy).
- vm: the qemu harness, host side (boot, kernels, matrix, aarch64, glibc_thp,
  boot_cost, matrix_table) and guest side (vm/guest: what runs inside the guests).
"""

from __future__ import annotations

from pathlib import Path

#: The checkout: testkit/ sits at its root.
REPO = Path(__file__).resolve().parent.parent
#: The huge page size the tests assume (x86-64 and arm64 with 4 KiB base pages).
HP = 2 << 20
