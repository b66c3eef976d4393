"""`hugify try -- COMMAND` and what it stands on: the record library of its first run
(runtime/record.c) and real comparisons in private namespaces (docs/try.md)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from runtime_support import RUNTIME, build_runtime

RECORD_LIB = RUNTIME / "libhugify-record.so"

PLUGIN_HOST = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
int lib_value(void);
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { puts(dlerror()); return 1; }
    dlclose(h);
    printf("%d\n", lib_value());
    fflush(stdout);
    return system(argv[2]);
}
"""


def _cc(out: Path, source: str, *flags: str) -> Path:
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run(["gcc", "-O1", "-o", str(out), str(src), *flags], check=True)
    return out


def test_record_library_names_every_object_every_process_loads(tmp_path: Path) -> None:
    """One line per object ld.so loads: the program by its real file, a library found
    through RUNPATH $ORIGIN, one dlopen'ed and closed again before anyone could look
    at /proc, and the objects of a child the program runs; nothing for the vDSO, and
    no descriptor left to the program."""
    build_runtime()
    (tmp_path / "lib").mkdir()
    _cc(tmp_path / "lib" / "libvalue.so", "int lib_value(void) { return 42; }\n", "-shared", "-fPIC")
    plugin = _cc(tmp_path / "plugin.so", "int plugin(void) { return 1; }\n", "-shared", "-fPIC")
    host = _cc(tmp_path / "host", PLUGIN_HOST, "-L", str(tmp_path / "lib"), "-lvalue", "-Wl,-rpath,$ORIGIN/lib")
    record = tmp_path / "record"
    record.write_bytes(b"")
    env = {"PATH": "/usr/bin:/bin", "LD_AUDIT": str(RECORD_LIB), "HUGIFY_RECORD": str(record)}
    res = subprocess.run(
        [str(host), str(plugin), "ls -l /proc/self/fd/"], env=env, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("42\n")
    # ls lists its descriptors: 0-2 and the directory it reads, none of the library's
    assert "record" not in res.stdout
    lines = [line.split("\t") for line in record.read_text().splitlines()]
    assert all(pid.isdigit() for pid, _ in lines)
    by_pid: dict[str, set[str]] = {}
    for pid, path in lines:
        by_pid.setdefault(pid, set()).add(path)
    first = lines[0][0]
    mine = by_pid.pop(first)
    assert str(host) in mine and str(plugin) in mine
    assert f"{tmp_path}/lib/libvalue.so" in {os.path.normpath(p) for p in mine}
    assert not any("vdso" in p for p in mine)
    # the children: the shell system() runs, and ls
    children = set().union(*by_pid.values())
    assert "/usr/bin/ls" in children and any(p.endswith("/libc.so.6") for p in children)


def test_record_library_records_nothing_without_its_variable(tmp_path: Path) -> None:
    build_runtime()
    env = {"PATH": "/usr/bin:/bin", "LD_AUDIT": str(RECORD_LIB)}
    res = subprocess.run(["ls", str(tmp_path)], env=env, capture_output=True, text=True, check=False)
    assert res.returncode == 0 and res.stderr == ""
    assert list(tmp_path.iterdir()) == []
