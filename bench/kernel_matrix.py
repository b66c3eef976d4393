#!/usr/bin/env python3
"""The full kernel x filesystem matrix (issue 20): every kernel of tests/vm_kernels.SUITES
(bookworm's, trixie's, trixie-backports' and sid's linux-image-amd64) on ext4, XFS and
btrfs, each booted under qemu on a real Debian 12 root (tests/vm_boot.py), measured by
the same guest driver as tests/test_kernel_matrix.py (tests/vm/guest_driver.py; the
suite boots a subset). Writes one JSON document (rows as tests/vm_matrix.row) for
bench/matrix_table.py, which regenerates docs/runtime.md's "Where it works" table.

Boots are cached by their inputs (a second run only boots what changed); a cold run is
about 12 TCG boots of a few minutes each. Must run as root (loop devices, chroot).

usage: bench/kernel_matrix.py [--out FILE] [--parallel N] [--only SUITE:FS ...]

--parallel boots N guests at once (each TCG guest keeps one host core busy).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from vm_boot import ACCEL, MEMORY_MIB, VmError, boot  # noqa: E402
from vm_kernels import KernelUnavailable  # noqa: E402
from vm_matrix import full_matrix, resolve, row  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "kernel_matrix.json")
    ap.add_argument("--parallel", type=int, default=1, help="guests booted at once (default 1)")
    ap.add_argument("--only", nargs="*", default=[], help="SUITE:FS pairs (default: the whole matrix)")
    args = ap.parse_args()
    pairs = [tuple(p.split(":", 1)) for p in args.only] or full_matrix()

    def measure(pair: tuple[str, str]) -> dict[str, Any]:
        suite, fs = pair
        try:
            b = boot(resolve(suite), fs)
        except (KernelUnavailable, VmError) as e:
            print(f"{suite} on {fs}: {e}", file=sys.stderr)
            return {"suite": suite, "fs": fs, "error": str(e)}
        print(f"{b.kernel.label} on {fs}: booted and measured in {b.seconds} s", file=sys.stderr)
        return row(b)

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
