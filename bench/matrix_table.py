"""`tools/bench matrix_table` (bench/README.md): the benchmark lives in
testkit.vm.matrix_table (the tests check its pieces without booting); see its docstring and
bench/README.md."""

from __future__ import annotations

import sys

from testkit.vm.matrix_table import main

if __name__ == "__main__":
    sys.exit(main())
