#!/usr/bin/env -S sh -c 'd=$(realpath "$0"); PYTHONPATH=${d%/*/*} exec python3 -m "bench.$(basename "$0" .py)" "$@"'
"""Started by its path or as `python -m bench.matrix_table`: the benchmark lives in
testkit.vm.matrix_table (the tests check its pieces without booting); see its docstring and
bench/README.md."""

from __future__ import annotations

import sys

import testkit.bench  # noqa: F401  (first: runs the benchmark with the project's .venv)
from testkit.vm.matrix_table import main

if __name__ == "__main__":
    sys.exit(main())
