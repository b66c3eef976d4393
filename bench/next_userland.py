"""The integration tests on the next userland, whole: every test of testkit.trixie.TEST_FILES
(rpm, debhelper, the DWARF matrix, the Debian corpus, the repack oracle) run inside the
cached Debian 13 root, where tests/test_trixie.py runs all but test_debhelper's heavy
add-on builds. Prints pytest's last lines and the wall time; exits 1 when a test fails.

usage: tools/bench next_userland [-n WORKERS] [PYTEST_ARGS...]

About 11 minutes on 2 cores with the root and its test programs cached (the root is
made on first use: a few minutes and about 1 GiB of packages). Must run as root
(mounts and chroot in a private namespace).
"""

from __future__ import annotations

import sys
import time

from testkit.bench import parser
from testkit.trixie import TEST_FILES, run_inside, trixie_root


def main(argv: list[str] | None = None) -> int:
    ap = parser(__file__, description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--workers", type=int, default=2, help="pytest-xdist workers inside (default 2)")
    ap.add_argument("pytest_args", nargs="*", help="more arguments for pytest inside, e.g. -k NAME")
    args = ap.parse_args(argv)
    root = trixie_root()
    started = time.monotonic()
    res = run_inside(
        root,
        *("python3", "-m", "pytest", "-n", str(args.workers), "-q", "-rfE", "-p", "no:cacheprovider"),
        *args.pytest_args,
        *TEST_FILES,
    )
    print(res.stdout[-5000:], end="")
    if res.returncode != 0:
        print(res.stderr[-3000:], file=sys.stderr, end="")
    print(f"next_userland: {time.monotonic() - started:.0f} s on {root.name}")
    return 0 if res.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
