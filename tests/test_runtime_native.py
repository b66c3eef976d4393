"""hugify-run and libhugify-audit.so beyond the page cache: what the audit library
exports and links, that it changes nothing a program sees, how hugify-run finds the
libraries ld.so will load, how it passes arguments and exit statuses through, and
`make install` of runtime/."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from testkit.cli import command
from testkit.runtime import (
    AUDIT_LIB,
    HUGIFY_RUN,
    REPO,
    RUNTIME,
    Programs,
    build_runtime,
    copy_programs,
    drop_caches,
    exec_segment_size,
    locked,
    parse_smaps,
    run_mappings,
)


def run(argv: list, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HUGIFY_"))}
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, env={**base, **(env or {})}, check=False, **kw
    )


def runtime_sources(src: Path) -> Path:
    """What `make -C runtime install` needs of the source tree, unbuilt, under `src`."""
    shutil.copytree(RUNTIME, src / "runtime", ignore=shutil.ignore_patterns("hugify-run", "*.so", "build-config.h*"))
    shutil.copytree(REPO / "systemd", src / "systemd")
    shutil.copy(REPO / "Cargo.toml", src / "Cargo.toml")
    return src


def test_audit_library_exports_only_the_audit_interface():
    """la_version, la_objopen, la_activity, and la_objsearch (which returns the name it is
    given: it notes how much the thread had read when ld.so began looking for an object,
    docs/runtime-reference.md, "libhugify-audit.so"); nothing that binds symbols, nothing
    that needs a library."""
    syms = subprocess.run(
        ["nm", "-D", "--defined-only", AUDIT_LIB], capture_output=True, text=True, check=True
    ).stdout.split()
    assert sorted(s for s in syms if s.startswith("la_")) == ["la_activity", "la_objopen", "la_objsearch", "la_version"]
    assert not [s for s in syms if "symbind" in s or "plt" in s]
    dyn = subprocess.run(["readelf", "-dW", AUDIT_LIB], capture_output=True, text=True, check=True).stdout
    assert "(NEEDED)" not in dyn  # no libc: ld.so loads nothing else into the audit namespace
    undefined = subprocess.run(
        ["nm", "-D", "--undefined-only", AUDIT_LIB], capture_output=True, text=True, check=True
    ).stdout
    assert undefined.strip() == ""


def test_engine_library_states_are_the_documented_ones():
    """libhugify-engine.so (the state machine `hugify prefetch`/`status` call) exports only
    its entry points, and its window states are the list of docs/runtime-reference.md, which
    hugify.engine reports by the same names."""
    import ctypes

    from hugify import engine as binding

    engine = RUNTIME / "libhugify-engine.so"
    syms = subprocess.run(["nm", "-D", "--defined-only", engine], capture_output=True, text=True, check=True).stdout
    assert sorted(line.split()[-1] for line in syms.splitlines() if " T " in line) == [
        "hp_engine_file_id",
        "hp_engine_init",
        "hp_engine_large_folios_since",
        "hp_engine_may_record",
        "hp_engine_page_regions",
        "hp_engine_pmd_windows",
        "hp_engine_record_drop",
        "hp_engine_record_read",
        "hp_engine_record_write",
        "hp_engine_run",
        "hp_engine_set_budget",
        "hp_engine_set_fault_hook",
        "hp_engine_set_runtime_dir",
        "hp_engine_state_name",
        "hp_engine_why_name",
    ]
    name = ctypes.CDLL(str(engine)).hp_engine_state_name
    name.restype, name.argtypes = ctypes.c_char_p, [ctypes.c_uint]
    states = []
    while (s := name(len(states)).decode()) != "?":
        states.append(s)
    doc = (REPO / "docs/runtime-reference.md").read_text().split("## Window states")[1].split("\n## ")[0]
    assert states == [line.split("`")[1] for line in doc.splitlines() if line.startswith("| `")]
    assert {getattr(binding, s.upper()) for s in states} == set(states)


def test_engine_leaves_the_callers_stdin_open(tmp_path: Path):
    """hp_engine_init releases the engine's context before setting it up; a context that
    starts zeroed closed descriptor 0 (and pagemap took its place). `hugify status` run
    in-process with stdin a file: afterwards fd 0 is still that file."""
    build_runtime()
    stdin_file = tmp_path / "stdin"
    stdin_file.write_text("input\n")
    script = (
        "import os, sys\n"
        "from hugify.cli import main\n"
        "main(['status', '--json', sys.argv[1]])\n"
        "print(os.readlink('/proc/self/fd/0'))\n"
    )
    with stdin_file.open() as stdin:
        res = run([sys.executable, "-c", script, "/bin/true"], cwd=REPO, stdin=stdin)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1] == str(stdin_file)


def test_engine_reason_ids_are_the_cores_and_never_empty(tmp_path: Path):
    """Every reason id the engine reports is in the core's table (so `hugify explain`
    knows it, with its meaning, not another one), docs/runtime-reference.md lists exactly them,
    and a window carrying one reports the id and a detail, never an empty string."""
    import ctypes

    from hugify import kernel, prefetch, reasons
    from hugify.engine import Engine

    build_runtime()
    why = ctypes.CDLL(str(RUNTIME / "libhugify-engine.so")).hp_engine_why_name
    why.restype, why.argtypes = ctypes.c_char_p, [ctypes.c_uint]
    ids = []
    while (name := why(len(ids) + 1).decode()) != "?":  # 0 is "no reason"
        ids.append(name)
    assert why(0).decode() == ""
    table = reasons.table()
    assert [table.get(i, ("unknown", ""))[0] for i in ids] == ["info"] * len(ids), ids
    doc = (REPO / "docs/runtime-reference.md").read_text().split("## Window states")[1].split("\n## ")[0]
    rows = [line.split("|")[3] for line in doc.splitlines() if line.startswith("| `")]
    documented = {rid for row in rows for rid in row.split("`")[1::2]}
    assert documented == set(ids)
    hp = kernel.pmd_size()
    engine = Engine(hp)
    prefetcher = prefetch.Prefetcher(engine, prefetch.system_info(engine, hp, tmp_path), tmp_path, hp)
    target = prefetch.Target("/x", fs="ext4")
    for rid in ids:
        window = prefetch.Window(0, "failed", rid, prefetcher._explain(target, rid, 3))
        assert window.as_json()["reason"] == rid and window.as_json()["detail"], rid
    res = run(command("explain", *ids), cwd=REPO)
    assert res.returncode == 0 and len(res.stdout.splitlines()) == len(ids), res.stderr


def test_installed_hugify_run_ignores_an_audit_library_beside_it(tmp_path: Path):
    """hugify-run installed in its BINDIR gives ld.so the installed audit library, even
    with a libhugify-audit.so lying beside it (which would be loaded into every process
    it runs); a copy elsewhere still takes the one beside it (build trees)."""
    src = runtime_sources(tmp_path / "src")
    prefix = tmp_path / "prefix"
    subprocess.run(
        ["make", "-s", "-C", src / "runtime", "install", f"PREFIX={prefix}"], check=True, capture_output=True
    )
    installed = prefix / "bin/hugify-run"
    planted = prefix / "bin/libhugify-audit.so"
    shutil.copy2(AUDIT_LIB, planted)
    res = run([installed, "sh", "-c", 'echo "$LD_AUDIT"'])
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert res.stdout.strip() == str(prefix / "lib/hugify/libhugify-audit.so")
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy2(installed, copy / "hugify-run")
    shutil.copy2(AUDIT_LIB, copy / "libhugify-audit.so")
    res = run([copy / "hugify-run", "sh", "-c", 'echo "$LD_AUDIT"'])
    assert res.stdout.strip() == str(copy / "libhugify-audit.so"), res


def test_engine_scans_another_processs_page_tables():
    """The benchmark's sampler reads other processes' page tables through the engine
    (hp_page_regions, the runtime's one PAGEMAP_SCAN call): a child's stack page it
    has written is present, and pages it never touched are not reported."""
    from hugify import kernel
    from hugify.engine import Engine

    build_runtime()
    engine = Engine(kernel.pmd_size())
    assert engine.has(Engine.PAGEMAP_SCAN), "this kernel has PAGEMAP_SCAN (Linux >= 6.7)"
    child = subprocess.Popen(["sleep", "30"])
    try:
        stack = next(line for line in Path(f"/proc/{child.pid}/maps").read_text().splitlines() if "[stack]" in line)
        lo, hi = (int(x, 16) for x in stack.split()[0].split("-"))
        fd = os.open(f"/proc/{child.pid}/pagemap", os.O_RDONLY)
        try:
            present = Engine.PAGE_IS_PRESENT
            regions = engine.page_regions(fd, lo, hi, present, present)
        finally:
            os.close(fd)
    finally:
        child.kill()
        child.wait()
    assert regions and all(lo <= a < b <= hi and c == present for a, b, c in regions), regions
    assert regions[-1][1] == hi  # the top of the stack, where the child's frames are
    assert sum(b - a for a, b, _ in regions) < hi - lo  # the untouched stack is not present


def test_audit_changes_nothing_the_program_sees(built: Programs):
    """Same output and exit status with and without the audit library, for the original
    and the hugified program, lazy and immediate binding."""
    for prog in (built.orig / "prog", built.prog):
        plug = prog.parent / "libplug.so"
        outputs = set()
        for env in ({}, {"LD_AUDIT": str(AUDIT_LIB)}, {"LD_AUDIT": str(AUDIT_LIB), "LD_BIND_NOW": "1"}):
            res = run([prog, plug], env)
            assert res.returncode == 0, res.stderr
            assert res.stderr == ""
            outputs.add(res.stdout.split("\n--- smaps")[0])
        assert len(outputs) == 1, outputs


def test_hugify_run_passes_arguments_environment_and_status(tmp_path: Path):
    script = tmp_path / "script"
    script.write_text('#!/bin/sh\nprintf "%s|" "$@"; printf "%s" "$LD_AUDIT"; exit 7\n')
    script.chmod(0o755)
    res = run([HUGIFY_RUN, script, "a b", "", "-c"], {"HUGIFY_AUDIT_LIB": "/x/audit.so", "LD_AUDIT": "/y/other.so"})
    assert res.returncode == 7
    assert res.stdout == "a b||-c|/y/other.so:/x/audit.so"
    # found on PATH like a shell would, and `--` ends hugify-run's options
    res = run([HUGIFY_RUN, "--", "true"], {"PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    res = run([HUGIFY_RUN, "--version"])
    assert res.returncode == 0 and res.stdout.startswith("hugify-run ")


def test_hugify_run_uses_the_audit_library_beside_it(tmp_path: Path):
    """Run from a build tree, hugify-run gives ld.so the audit library built beside it
    (found from its real path, also when started through a symlink), not the install
    path; without one beside it, the install path (test_runtime_make_install)."""
    build_runtime()
    res = run([HUGIFY_RUN, "sh", "-c", 'echo "$LD_AUDIT"'])
    assert res.returncode == 0 and res.stderr == "", res.stderr  # ld.so loaded it as audit interface
    assert res.stdout.strip() == str(AUDIT_LIB.resolve())
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    shutil.copy2(HUGIFY_RUN, here / "hugify-run")
    shutil.copy2(AUDIT_LIB, here / "libhugify-audit.so")
    (elsewhere / "hugify-run").symlink_to(here / "hugify-run")
    for argv0 in (here / "hugify-run", elsewhere / "hugify-run"):
        res = run([argv0, "sh", "-c", 'echo "$LD_AUDIT"'])
        assert res.stdout.strip() == str(here / "libhugify-audit.so") and res.stderr == "", res
    (here / "libhugify-audit.so").unlink()
    res = run([here / "hugify-run", "sh", "-c", 'echo "$LD_AUDIT"'])
    built_in = next(line for line in (RUNTIME / "build-config.h").read_text().splitlines() if "AUDIT_PATH" in line)
    assert f'"{res.stdout.strip()}"' in built_in


def test_hugify_run_errors(tmp_path: Path):
    assert run([HUGIFY_RUN]).returncode == 2
    res = run([HUGIFY_RUN, "--bogus"])
    assert res.returncode == 2 and "unknown option --bogus" in res.stderr
    res = run([HUGIFY_RUN, "no-such-command-hugify"])
    assert res.returncode == 127
    assert res.stderr.strip() == "hugify-run: no-such-command-hugify: command not found"
    data = tmp_path / "data"
    data.write_text("not a program\n")
    res = run([HUGIFY_RUN, data])
    assert res.returncode == 126 and res.stderr == f"hugify-run: {data}: Permission denied\n"


def test_hugify_run_resolves_libraries_like_ld_so(built: Programs, tmp_path: Path):
    """A program without RUNPATH finds its hugified library through LD_LIBRARY_PATH, a
    preloaded library is included, and a missing one does not stop the program."""
    progs = copy_programs(built, tmp_path / "bin")
    libs = tmp_path / "libs"
    libs.mkdir()
    shutil.move(progs.lib, libs / "libbig.so")
    src = tmp_path / "main2.c"
    src.write_text("long lib_all(long);\nint main(void) { return lib_all(1) < 0; }\n")
    prog2 = tmp_path / "prog2"
    subprocess.run(["gcc", "-o", prog2, src, f"-L{libs}", "-lbig"], check=True)
    env = {"HUGIFY_DEBUG": "1", "HUGIFY_AUDIT_LIB": "", "HUGIFY_RUNTIME_DIR": str(tmp_path)}
    with locked():
        drop_caches()
        res = run(
            [HUGIFY_RUN, prog2], {**env, "LD_LIBRARY_PATH": f"/nonexistent:{libs}", "LD_PRELOAD": str(progs.plug)}
        )
        bad = run([HUGIFY_RUN, prog2], {**env, "LD_PRELOAD": "libnotthere.so"})
    assert res.returncode == 0, res.stderr
    assert f"hugify-run: {libs}/libbig.so: 2 windows: 2 huge (2 loaded" in res.stderr, res.stderr
    assert f"hugify-run: {progs.plug}: 1 windows: 1 huge (1 loaded" in res.stderr, res.stderr
    # without LD_LIBRARY_PATH ld.so cannot start it; hugify-run still runs it and passes the error on
    assert bad.returncode == 127 and "libbig.so" in bad.stderr and "libnotthere.so" in bad.stderr


def test_hugify_run_is_quiet_and_prefetches_only_hugified_objects(built: Programs, tmp_path: Path):
    progs = copy_programs(built, tmp_path / "bin")
    with locked():
        drop_caches()
        res = run([HUGIFY_RUN, progs.prog, "-"], {"HUGIFY_AUDIT_LIB": ""})
        plain = run([HUGIFY_RUN, progs.orig / "prog", "-"], {"HUGIFY_AUDIT_LIB": "", "HUGIFY_DEBUG": "1"})
    assert res.returncode == 0 and res.stderr == ""
    maps = parse_smaps(res.stdout)
    assert maps[str(progs.prog)].pmd == exec_segment_size(progs.prog)
    assert plain.returncode == 0
    assert "windows" not in plain.stderr  # nothing hugified: nothing mapped, nothing read
    assert "objects in" in plain.stderr


def test_audit_handles_a_program_loaded_through_ld_so(built: Programs, tmp_path: Path):
    """`ld.so PROGRAM`: the program is not the main map the kernel loaded; it still is
    recognised from its program headers."""
    progs = copy_programs(built, tmp_path / "bin")
    ldso = next(p for p in ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1") if Path(p).exists())
    with locked():
        drop_caches()
        maps = run_mappings([ldso, progs.prog, "-"], env={"LD_AUDIT": str(AUDIT_LIB)})
    for p in (progs.prog, progs.lib):
        assert maps[str(p)].pmd == exec_segment_size(p)


def test_runtime_make_install(tmp_path: Path):
    """`make install DESTDIR= PREFIX=` puts the dispatcher, the audit library and the
    trigger helper in place, with the audit library's path built into hugify-run."""
    src = runtime_sources(tmp_path / "src")
    dest = tmp_path / "dest"
    subprocess.run(
        ["make", "-s", "-C", src / "runtime", "install", f"DESTDIR={dest}", "PREFIX=/opt/hugify"],
        check=True,
        capture_output=True,
    )
    run_bin = dest / "opt/hugify/bin/hugify-run"
    lib = dest / "opt/hugify/lib/hugify/libhugify-audit.so"
    trig = dest / "opt/hugify/lib/hugify/prefetch-trigger"
    assert os.access(run_bin, os.X_OK) and lib.is_file() and os.access(trig, os.X_OK)
    assert (dest / "opt/hugify/lib/hugify/libhugify-engine.so").is_file()
    assert b"/opt/hugify/lib/hugify/libhugify-audit.so" in run_bin.read_bytes()
    assert "HUGIFY=${HUGIFY:-/opt/hugify/bin/hugify}" in trig.read_text()
    res = run([run_bin, "sh", "-c", 'echo "$LD_AUDIT"'])
    assert res.stdout.strip() == "/opt/hugify/lib/hugify/libhugify-audit.so"
    subprocess.run(["make", "-s", "-C", src / "runtime", "clean"], check=True)
    assert not (src / "runtime" / "hugify-run").exists()
