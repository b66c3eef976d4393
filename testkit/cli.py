"""Running the hugify CLI of this checkout, and the programs it rewrote: the one way
the tests and benchmarks start `hugify` (`python -m hugify.cli` from the repository
root, the caller's environment unless `env` replaces it, a failure raises unless the
caller passes `check=False` and looks at the result itself), its command line for
callers that start it themselves (`command`: under strace, in a shell, as another
user), the one `hugify` launcher written for tools that run it by name (rpmbuild,
dpkg-buildpackage, systemd units), and the environment rpm gives a build-root policy
script."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testkit import REPO


def command(*args: str | os.PathLike[str], python: str | os.PathLike[str] = sys.executable) -> list[str]:
    """The command line of the hugify CLI of the checkout it runs in (this one, from
    the repository root, or wherever PYTHONPATH names it). `python`: another
    interpreter (the system's /usr/bin/python3 for another user, who may not be able to
    enter the suite's .venv; `python3` inside a guest)."""
    return [str(python), "-m", "hugify.cli", *map(str, args)]


def hugify(
    *args: str | os.PathLike[str],
    check: bool = True,
    env: dict[str, str] | None = None,
    add_env: dict[str, str] | None = None,
    runner: Sequence[str | os.PathLike[str]] = (),
    python: str | os.PathLike[str] = sys.executable,
    stdin: str | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Runs the hugify CLI of this checkout from the repository root and returns the
    result. Its environment is `env` when given (the whole of it), else this process's;
    `add_env` adds to either. `runner` goes before the command (another user's:
    `setpriv ...`, `runuser -u USER --`; a measurement: `/usr/bin/time`, `strace`),
    `python` is the interpreter (`command`), `stdin` its input. A non-zero exit
    raises, unless the caller passes `check=False` to look at the result itself."""
    full = {**(os.environ if env is None else env), **(add_env or {})}
    argv = [*map(str, runner), *command(*args, python=python)]
    res = subprocess.run(
        argv, input=stdin, capture_output=True, text=True, env=full, cwd=REPO, timeout=timeout, check=False
    )
    if check and res.returncode != 0:
        raise AssertionError(f"hugify {' '.join(map(str, args))} -> {res.returncode}\n{res.stdout}\n{res.stderr}")
    return res


def write_launcher(
    path: Path,
    policy: str | os.PathLike[str] | None = None,
    python: str | os.PathLike[str] = sys.executable,
    repo: str | os.PathLike[str] = REPO,
) -> Path:
    """Writes at `path` an executable `hugify` that runs the CLI of the checkout at
    `repo` (this one) with `python` (`command`), HUGIFY_POLICY_PATH `policy` when given:
    what /usr/bin/hugify is to an installed hugify, for the tools that run `hugify` by
    name (rpmbuild's brp script, dpkg-buildpackage's dh_hugify, the systemd units).
    Written whole under another name and renamed, so that a tool running it meanwhile
    never finds half of it; left alone when it already says the same. Returns `path`."""
    settings = f"PYTHONPATH={shlex.quote(str(repo))} "
    if policy is not None:
        settings += f"HUGIFY_POLICY_PATH={shlex.quote(str(policy))} "
    text = f'#!/bin/sh\n{settings}exec {shlex.quote(str(python))} -m hugify.cli "$@"\n'
    if path.exists() and path.read_text() == text:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.chmod(0o755)
    tmp.replace(path)
    return path


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
