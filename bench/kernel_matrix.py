"""The full kernel x filesystem matrix (issue 20): every kernel of testkit/vm/kernels.py's SUITES
(bookworm's, trixie's, trixie-backports' and sid's linux-image-amd64) on ext4, XFS and
btrfs, each booted under qemu on a real Debian 12 root (testkit/vm/boot.py), measured by
the same guest driver as tests/test_kernel_matrix.py (testkit/vm/guest/guest_driver.py; the
suite boots a subset). Writes one JSON document (rows as testkit.vm.matrix.row) for
bench/matrix_table.py, which regenerates docs/runtime-reference.md's "Where it works" table.

The way "glibc.elf.thp" boots each (kernel, filesystem) a second time, on the same root
with glibc 2.44 unpacked over it (testkit/vm/glibc_thp.py): cold starts with the tunable off,
in the environment and set system-wide, at the disk's default read_ahead_kb, 128 and
8192 (testkit/vm/guest/glibc_thp_guest.py); its results go to each row's "glibc_thp".

Boots are cached by their inputs (a second run only boots what changed); a cold run is
about 12 TCG boots of a few minutes each per way. Must run as root (loop devices, chroot).

usage: tools/bench kernel_matrix [--out FILE] [--parallel N] [--only SUITE:FS ...]
                              [--ways matrix,glibc.elf.thp]

--parallel boots N guests at once (each TCG guest keeps one host core busy). With only
some ways, rows carry only those ways' results: bench/matrix_table.py --json takes the
files of several runs and merges their rows per kernel and filesystem.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from testkit import REPO
from testkit.bench import parser
from testkit.vm.boot import ACCEL, MEMORY_MIB, VmError, boot
from testkit.vm.glibc_thp import glibc_thp_row, root_extra
from testkit.vm.kernels import KernelUnavailable
from testkit.vm.matrix import full_matrix, kernel_fields, resolve, row

WAYS = ("matrix", "glibc.elf.thp")


def main() -> int:
    ap = parser(__file__, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "kernel_matrix.json")
    ap.add_argument("--parallel", type=int, default=1, help="guests booted at once (default 1)")
    ap.add_argument("--only", nargs="*", default=[], help="SUITE:FS pairs (default: the whole matrix)")
    ap.add_argument("--ways", default=",".join(WAYS), help=f"which boots (default: {','.join(WAYS)})")
    args = ap.parse_args()
    pairs = [tuple(p.split(":", 1)) for p in args.only] or full_matrix()
    ways = args.ways.split(",")
    if not ways or set(ways) - set(WAYS):
        ap.error(f"--ways takes {', '.join(WAYS)}")
    glibc = root_extra() if "glibc.elf.thp" in ways else None

    def measure(pair: tuple[str, str]) -> dict[str, Any]:
        suite, fs = pair
        try:
            k = resolve(suite)
            out = row(boot(k, fs)) if "matrix" in ways else kernel_fields(k, fs)
            if glibc:
                b = boot(k, fs, extra=glibc)
                out["glibc_thp"] = glibc_thp_row(b.results) | {"boot_seconds": b.seconds}
        except (KernelUnavailable, VmError) as e:
            print(f"{suite} on {fs}: {e}", file=sys.stderr)
            return {"suite": suite, "fs": fs, "error": str(e)}
        print(f"{k.label} on {fs}: booted and measured", file=sys.stderr)
        return out

    # Boots share their inputs (kernels, initramfs, root images) through the cache's
    # locks, so threads only wait for each other where one builds what both need.
    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        results = list(pool.map(measure, pairs))
    rows = [r for r in results if "error" not in r]
    errors = [r for r in results if "error" in r]
    doc = {
        "date": datetime.date.today().isoformat(),
        "accel": ACCEL,
        "memory_mib": MEMORY_MIB,
        "ways": ways,
        "rows": rows,
        "errors": errors,
    }
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    tmp.replace(args.out)
    print(args.out)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
