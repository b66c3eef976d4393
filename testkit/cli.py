"""Running the hugify CLI of this checkout, and the programs it rewrote: the one way
the tests and benchmarks start `hugify` (`python -m hugify.cli` from the repository
root, the caller's environment unless `env` replaces it, a failure raises unless the
caller passes `check=False` and looks at the result itself), and the environment rpm
gives a build-root policy script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from testkit import REPO


def hugify(
    *args: str | Path, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs the hugify CLI (the package in this checkout) and returns the result."""
    cmd = [sys.executable, "-m", "hugify.cli", *map(str, args)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, check=False)
    if check and res.returncode != 0:
        raise AssertionError(f"hugify {' '.join(map(str, args))} -> {res.returncode}\n{res.stdout}\n{res.stderr}")
    return res


def transform(src: Path, dst: Path, *extra: str) -> dict[str, Any]:
    """Transforms with threshold 0 and returns the JSON report."""
    res = hugify("transform", "--json", "--threshold", "0", *extra, src, "-o", dst)
    return json.loads(res.stdout)


def run_program(
    path: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = (), runner: list[str] | None = None
) -> tuple[int, str, str]:
    """Runs a test program (through `runner`, e.g. qemu-user, for other architectures)."""
    full_env = {**os.environ, **(env or {})}
    cmd = [*(runner or []), str(path), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=300, check=False)
    return res.returncode, res.stdout, res.stderr


def rpm_env(build_dir: Path, **extra: str) -> dict[str, str]:
    """The environment rpm gives a build-root policy script (brp-hugify) while
    building foo-1.2-3.x86_64 in `build_dir`, its build root `build_dir`/root."""
    return {
        "PATH": os.environ["PATH"],
        "RPM_BUILD_ROOT": str(build_dir / "root"),
        "RPM_PACKAGE_NAME": "foo",
        "RPM_PACKAGE_VERSION": "1.2",
        "RPM_PACKAGE_RELEASE": "3",
        "RPM_ARCH": "x86_64",
        "RPM_BUILD_DIR": str(build_dir),
        **extra,
    }
