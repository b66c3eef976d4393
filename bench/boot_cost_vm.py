"""`tools/bench boot_cost_vm` (bench/README.md): the benchmark lives in
testkit.vm.boot_cost (the tests check its pieces without booting); see its docstring and
bench/README.md."""

from __future__ import annotations

import sys

from testkit.vm.boot_cost import main

if __name__ == "__main__":
    sys.exit(main())
