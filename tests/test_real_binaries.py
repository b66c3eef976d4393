"""Real Debian binaries that hugify did not build: rewritten copies must keep working
when a real program loads or runs them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from testkit import HP
from testkit.cli import hugify
from testkit.elf import readelf_loads
from testkit.recipes import CXX_WORKLOAD

LIBDIR = Path("/usr/lib/x86_64-linux-gnu")


def _rewrite(src: Path, dst: Path) -> dict[str, str]:
    res = hugify("transform", "--json", src, "-o", dst)
    import json

    return json.loads(res.stdout)["result"]


def _loaded_from(cmd: list[str], env: dict[str, str], name: str) -> list[str]:
    """The paths of `name` the dynamic loader initialised (LD_DEBUG=libs)."""
    res = subprocess.run(cmd, env={**env, "LD_DEBUG": "libs"}, capture_output=True, text=True, check=False)
    inits = [line.split("calling init:")[1].strip() for line in res.stderr.splitlines() if "calling init:" in line]
    return [p for p in inits if name in p]


def test_libstdcxx_under_a_real_program(tmp_path: Path) -> None:
    src = tmp_path / "w.cc"
    src.write_text(CXX_WORKLOAD)
    subprocess.run(["g++", "-O2", "-pthread", str(src), "-o", str(tmp_path / "w")], check=True)
    libs = tmp_path / "libs"
    libs.mkdir()
    assert _rewrite(LIBDIR / "libstdc++.so.6", libs / "libstdc++.so.6")["mode"] == "shift"
    expected = subprocess.run([tmp_path / "w"], capture_output=True, text=True, check=True).stdout
    env = {"LD_LIBRARY_PATH": str(libs)}
    got = subprocess.run([tmp_path / "w"], capture_output=True, text=True, env=env, check=True).stdout
    assert got == expected
    assert "thrown matches=2 thread=42" in got
    assert _loaded_from([str(tmp_path / "w")], env, "libstdc++") == [str(libs / "libstdc++.so.6")]


def test_libc_under_real_programs(tmp_path: Path) -> None:
    libs = tmp_path / "libs"
    libs.mkdir()
    assert _rewrite(LIBDIR / "libc.so.6", libs / "libc.so.6")["mode"] == "shift"
    env = {"LD_LIBRARY_PATH": str(libs), "LC_ALL": "C", "PATH": "/usr/bin:/bin"}
    workloads = [
        ["/usr/bin/sort", "-n", "/etc/services"],
        [
            "/usr/bin/python3",
            "-c",
            "import json, hashlib; print(json.dumps(sorted(hashlib.algorithms_available)))",
        ],
        ["/usr/bin/ls", "-la", "/usr/share/doc/libc6"],
        ["/bin/bash", "-c", "for i in $(seq 1 50); do echo $((i * i)); done | sha256sum"],
    ]
    for cmd in workloads:
        plain = subprocess.run(
            cmd, capture_output=True, text=True, env={k: env[k] for k in ("LC_ALL", "PATH")}, check=True
        )
        hugified = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        assert hugified.stdout == plain.stdout, cmd
    assert _loaded_from(["/usr/bin/true"], env, "libc.so") == [str(libs / "libc.so.6")]


def test_gdb_executable(tmp_path: Path) -> None:
    gdb = tmp_path / "gdb"
    result = _rewrite(Path("/usr/bin/gdb"), gdb)
    assert result["mode"] == "shift"
    (x,) = [seg for seg in readelf_loads(gdb) if "E" in seg.flags]
    assert x.vaddr % HP == 0 and x.memsz % HP == 0
    prog = tmp_path / "crash.c"
    prog.write_text("int f(int *p) { return *p; }\nint main(void) { return f(0); }\n")
    subprocess.run(["gcc", "-g", "-O0", str(prog), "-o", str(tmp_path / "crash")], check=True)
    cmd = ["-batch", "-ex", "run", "-ex", "bt", "-ex", "print 6*7", str(tmp_path / "crash")]
    plain = subprocess.run(["/usr/bin/gdb", *cmd], capture_output=True, text=True, check=True)
    hugified = subprocess.run([str(gdb), *cmd], capture_output=True, text=True, check=True)
    strip = lambda s: [line for line in s.splitlines() if "process" not in line]  # noqa: E731 (pids differ)
    assert strip(hugified.stdout) == strip(plain.stdout)
    assert "$1 = 42" in hugified.stdout and "in f (p=0x0)" in hugified.stdout


@pytest.mark.parametrize("name", ["ld-linux-x86-64.so.2"])
def test_dynamic_loader_is_never_shifted(name: str, tmp_path: Path) -> None:
    """ld.so finds its own headers pc-relatively: shifting it would break every program."""
    shutil.copy(LIBDIR / name, tmp_path / name)
    res = hugify("inspect", "--json", "--threshold", "0", tmp_path / name, check=False)
    import json

    (r,) = json.loads(res.stdout)
    assert r["plans"]["shift"]["reason"] == "ehdr-reference"
