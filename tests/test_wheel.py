"""hugify as pip installs it: the wheel built from pyproject.toml by maturin (the dev
virtualenv's, tools/requirements-dev.txt), installed by pip into a fresh virtualenv,
and run from there, nothing of this checkout on the path.

What a pip install promises (docs/runtime.md, README): the CLI with the Rust core
(inspect, transform, tree, policy, explain) works; `prefetch` and `status`, which need
the C runtime's libhugify-engine.so that only `make install` or a distribution's
package installs, refuse in one line with the reason id `no-engine`, exit status 4.
The wheel is cached under the test cache by everything that goes into it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit import REPO
from testkit.cache import build_dir, building, cache_root, locked
from testkit.debian import cargo_target_held
from testkit.elf import hugified
from testkit.recipes import BY_NAME, build

slow = pytest.mark.slow
VERSION = next(
    line.split('"')[1] for line in (REPO / "Cargo.toml").read_text().splitlines() if line.startswith("version = ")
)


def _wheel_inputs() -> list[Path]:
    files = [REPO / n for n in ("pyproject.toml", "Cargo.toml", "Cargo.lock")]
    for d in ("core", "bindings", "hugify"):
        files += sorted(
            p
            for p in (REPO / d).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and "target" not in p.parts and not p.name.endswith(".so")
        )
    return files


def built_wheel() -> Path:
    """hugify's wheel, built once per inputs with `maturin build --release`."""
    maturin = Path(sys.executable).parent / "maturin"
    assert os.access(maturin, os.X_OK), f"maturin is missing at {maturin}: run tools/setup-dev-env"
    h = hashlib.sha256(subprocess.run([str(maturin), "--version"], capture_output=True, check=True).stdout)
    for p in _wheel_inputs():
        h.update(str(p.relative_to(REPO)).encode() + b"\0" + p.read_bytes() + b"\0")
    final = build_dir("wheel", "hugify", h.hexdigest()[:16])
    with locked(cache_root() / "wheel" / "build.lock"):
        if not (final / "done").exists():
            with building(final) as work:
                cmd = [str(maturin), "build", "--release", "--locked", "--out", str(work)]
                with cargo_target_held():  # the checkout's target directory, which it compiles into
                    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
                assert res.returncode == 0, res.stderr[-4000:]
                (work / "done").touch()
    (wheel,) = final.glob("hugify-*.whl")
    return wheel


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv (the system's Python 3) with the wheel installed by pip."""
    wheel = built_wheel()
    where = tmp_path_factory.mktemp("wheel") / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(where)], check=True)
    pip = [str(where / "bin" / "pip"), "install", "--no-index", "--disable-pip-version-check", "-q", str(wheel)]
    res = subprocess.run(pip, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    return where


def run(venv: Path, *args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The installed `hugify` script, with nothing of the checkout or the tests' setup around."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HUGIFY_", "PYTHON", "LD_"))}
    env["HUGIFY_STATE_DIR"] = str(cwd / "state")  # no rpm-discovered list of this host
    cmd = [str(venv / "bin" / "hugify"), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, check=False)


@slow
def test_pip_installed_package_is_the_wheels(venv: Path, tmp_path: Path) -> None:
    python = venv / "bin" / "python"
    res = subprocess.run(
        [str(python), "-c", "import hugify, hugify._core as c; print(hugify.__file__); print(c.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
        check=True,
    )
    site = venv / "lib"
    assert all(Path(p).is_relative_to(site) for p in res.stdout.split()), res.stdout
    assert run(venv, "--version", cwd=tmp_path).stdout.split() == ["hugify", VERSION]


@slow
def test_pip_installed_cli_transforms_with_its_own_core(venv: Path, tmp_path: Path) -> None:
    prog = build(BY_NAME["gcc-bfd"]) / "prog"
    out = tmp_path / "prog.hugified"
    res = run(venv, "transform", prog, "-o", out, cwd=tmp_path)
    assert res.returncode == 0 and "transformed (shift)" in res.stdout, res.stdout + res.stderr
    assert hugified(out) and not hugified(prog)
    libs = {**os.environ, "LD_LIBRARY_PATH": str(prog.parent)}  # its libhug.so
    before, after = (subprocess.run([str(p)], capture_output=True, env=libs, check=False) for p in (prog, out))
    assert (after.returncode, after.stdout) == (0, before.stdout) and before.returncode == 0
    policy = run(venv, "policy", "show", cwd=tmp_path)
    assert policy.returncode == 0 and "threshold = " in policy.stdout, policy.stderr
    explain = run(venv, "explain", "no-engine", cwd=tmp_path)
    assert explain.returncode == 0 and explain.stdout.startswith("no-engine (refused, exit status 4)")


@slow
def test_pip_installed_prefetch_and_status_refuse_without_the_engine_in_one_line(venv: Path, tmp_path: Path) -> None:
    """The wheel carries no C runtime: prefetch and status say so in one line, with the
    reason id and exit status 4, not a traceback (docs/runtime.md)."""
    (tmp_path / "manifest.d").mkdir()
    for cmd in (
        ["status"],
        ["status", "--json", "/bin/true"],
        ["prefetch", "/bin/true"],
        ["prefetch", "--all", "--manifest-dir", tmp_path / "manifest.d"],
    ):
        res = run(venv, *cmd, cwd=tmp_path)
        assert res.returncode == 4, (cmd, res.stdout, res.stderr)
        assert len(res.stderr.splitlines()) == 1 and res.stderr.rstrip().endswith("(no-engine)"), (cmd, res.stderr)
        assert "libhugify-engine.so is not installed" in res.stderr and res.stdout == "", (cmd, res.stdout)
