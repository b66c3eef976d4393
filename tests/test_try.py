"""`hugify try -- COMMAND` and what it stands on: the record library of its first run
(runtime/record.c) and real comparisons in private namespaces (docs/try.md)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hugify import files
from hugify.reasons import LOG_ENV
from testkit import HP
from testkit.cli import command, hugify
from testkit.recipes import build_itlb
from testkit.runtime import HUGIFY_RUN, REPO, RUNTIME, Programs, build_runtime, padded_functions, thp_steady

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


# --- real comparisons -----------------------------------------------------------------

HUGE_CODE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
"""


def _hugify_try(
    *args: str | Path,
    cwd: Path,
    user: str | None = None,
    env: dict[str, str] | None = None,
    launcher: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """`hugify try` of this checkout, started in `cwd` (as `user`, through setpriv and
    the system's python3, when given; through `launcher`, e.g. nohup, when given)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "PYTHON"))}
    base |= {"PYTHONPATH": str(REPO), "LC_ALL": "C", **(env or {})}
    cmd = command("try", *args)
    if user:
        # the suite's reason log is root's file; the system's python3 has what hugify needs
        base.pop(LOG_ENV, None)
        ids = ["--reuid", user, "--regid", str(pwd.getpwnam(user).pw_gid), "--clear-groups"]
        cmd = ["setpriv", *ids, *command("try", *args, python="/usr/bin/python3")]
    return subprocess.run(
        [*launcher, *cmd], cwd=cwd, env=base, capture_output=True, text=True, timeout=600, check=False
    )


def _json(res: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert res.stdout, res.stderr
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def _system_state(*paths: Path) -> tuple[list[str], list[str]]:
    """What no comparison may change: the mounts of this namespace that name one of
    `paths` (the copies' bind mounts stay in the sides' namespaces; the machine's other
    mounts change under other jobs), and the runtime's record directory."""
    run_dir = Path("/run/hugify")
    listing = sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else []
    mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line for line in mountinfo if any(str(p) in line for p in paths)], listing


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory under /tmp that another user may use (pytest's are root's own)."""
    d = Path(tempfile.mkdtemp(prefix="hugify-try-test-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def steady_thp() -> Iterator[None]:
    """THP's settings left alone by the other tests while the shared way makes and maps
    its copies (a test that sets shmem_enabled=deny would have them refused)."""
    with thp_steady():
        yield


@pytest.fixture(scope="module")
def itlb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the iTLB-bound program (4096 functions, 16 MiB of code) in a directory
    everyone may read and write: the unprivileged test runs there too."""
    build_runtime()
    d = tmp_path_factory.mktemp("itlb")
    d.chmod(0o777)
    shutil.copy2(build_itlb(4096) / "itlb", d / "itlb")
    return d / "itlb"


def test_the_itlb_bound_program_gains_and_nothing_of_the_system_changes(itlb: Path, tmp_path: Path) -> None:
    """The upper bound: with 16 MiB of code on huge pages the program takes clearly less
    CPU time, the interval below 1 and below the A/A floor, which itself shows no such
    change; every run used its own side's file, the copies were PMD-mapped and the
    original was not; the mounts and /run/hugify are as before, and the cache holds
    only its entries; the SVG is well-formed with one point per round and ratio."""
    state = _system_state(itlb, tmp_path)
    plot = tmp_path / "ratios.svg"
    cache = tmp_path / "cache"
    args = ("--json", "--cache-dir", cache, "--plot", plot, "--min-rounds", "5", "--target", "5", "--max-rounds", "10")
    res = _hugify_try(*args, "--", itlb, "400", cwd=itlb.parent)
    assert res.returncode == 0, res.stderr
    doc = _json(res)
    assert doc["verdict"] == "gain", doc["answer"]
    hi = doc["cpu"]["ci95"][1]
    assert hi < 1 and hi < doc["noise_floor"]["cpu"]["ci95"][0], (doc["cpu"], doc["noise_floor"])
    assert 0.8 < doc["noise_floor"]["cpu"]["median"] < 1.2, doc["noise_floor"]
    (prog,) = [o for o in doc["objects"] if o["path"] == str(itlb)]
    assert prog["status"] == "transformed" and not prog["cached"]
    seen = prog["seen"]
    assert seen["hugified"]["pmd_mapped"] >= 8 << 20 and seen["hugified"]["windows_small"] == 0, seen
    assert seen["original"]["pmd_mapped"] == 0, seen
    # every run the watcher saw used its side's file (a run that mapped the other
    # side's would be a problem); on a loaded machine its thread may miss a run
    runs = doc["verified_runs"]
    assert runs["hugified"]["runs"] == doc["rounds"] and runs["original"]["runs"] == 2 * doc["rounds"], runs
    assert runs["hugified"]["seen"] >= doc["rounds"] // 2 and runs["original"]["seen"] >= doc["rounds"], runs
    assert doc["problems"] == [] and doc["way"] == "file"
    assert doc["answer"].startswith("CPU time -") and "faster" in doc["answer"]
    assert _system_state(itlb, tmp_path) == state and state[0] == []
    assert _leftovers(cache) == []
    tree = ET.parse(plot)
    circles = tree.getroot().findall("{http://www.w3.org/2000/svg}circle")
    assert len(circles) == 2 * doc["rounds"] + 2  # both ratios per round, and the legend's two


@contextlib.contextmanager
def _tmpfs(where: Path, huge: str) -> Iterator[Path]:
    """A tmpfs mounted on `where` while the block runs."""
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=256m,huge={huge}", "tmpfs", where], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", where], check=True)


@pytest.mark.parametrize("way", ["shared", "auto"])
@pytest.mark.usefixtures("steady_thp")
def test_the_shared_way_maps_the_code_from_roots_copies(itlb: Path, tmp_path: Path, way: str) -> None:
    """Where the copies' filesystem gives no 2 MiB folios, root's hugify try maps their
    code from shared copies on a huge-page tmpfs, as the machine's runtime would:
    `--way shared` puts the copies on a tmpfs without huge pages itself; `--way auto`
    takes the way for a cache on such a tmpfs. No file on a tmpfs without huge pages is
    PMD-mapped (FilePmdMapped), so every huge page the hugified side is seen with is a
    shared copy's: all windows, none small, the copies held once; the gain shows. The
    tmpfs mounts are the comparison's own: no mount below tmp_path (where the cache,
    its run directory and the shared copies' store are) is left in the system's mount
    table, and /run/hugify and the cache are as before."""
    with contextlib.ExitStack() as stack:
        cache = tmp_path / "cache"
        if way == "auto":
            cache = stack.enter_context(_tmpfs(tmp_path / "plainfs", "never")) / "cache"
        state = _system_state(itlb, tmp_path)
        limits = ("--min-rounds", "5", "--target", "5", "--max-rounds", "10")
        res = _hugify_try("--json", "--way", way, "--cache-dir", cache, *limits, "--", itlb, "400", cwd=itlb.parent)
        assert res.returncode == 0, res.stderr
        doc = _json(res)
        assert doc["way"] == "shared", doc["notes"]
        assert doc["verdict"] == "gain", doc["answer"]
        (prog,) = [o for o in doc["objects"] if o["path"] == str(itlb)]
        seen = prog["seen"]["hugified"]
        assert seen["windows"] >= 8 and seen["windows_huge"] == seen["windows"] and seen["windows_small"] == 0, seen
        assert seen["pmd_mapped"] >= seen["windows"] * (2 << 20), seen
        assert prog["seen"]["original"]["pmd_mapped"] == 0
        assert doc["coverage"]["shared_held"] >= seen["windows"] * (2 << 20), doc["coverage"]
        assert doc["problems"] == []
        assert _system_state(itlb, tmp_path) == state
        assert _leftovers(cache) == []


@pytest.mark.usefixtures("steady_thp")
def test_the_shared_way_copies_only_what_every_user_may_read(itlb: Path, shared_dir: Path) -> None:
    """With the cache where every user may pass (as under /var/cache), the shared way's
    store is reached by the command's processes of any user, so its copies may show
    them only what they could read anyway. That is judged on the program the command
    loads, not on try's own copy of it in the cache (which no other user may list): a
    program every user may read gets its shared copy and its code on huge pages, one
    in a directory only root may enter gets none, said in a note naming it (the
    system's libc beside it still gets its copy). Before, every
    hugified copy was judged by the scratch directory it lies in, mode 0711, and the
    way was refused for all of them."""
    public, private = shared_dir / "public", shared_dir / "private"
    for d, mode in ((public, 0o755), (private, 0o700)):
        d.mkdir()
        d.chmod(mode)
        shutil.copy2(itlb, d / "itlb")
    cache = shared_dir / "cache"
    limits = ("--min-rounds", "1", "--max-rounds", "1")
    res = _hugify_try("--json", "--way", "shared", "--cache-dir", cache, *limits, "--", public / "itlb", "400",
                      cwd=public)  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = _json(res)
    assert doc["way"] == "shared" and doc["problems"] == [], doc["notes"]
    (prog,) = [o for o in doc["objects"] if o["path"] == str(public / "itlb")]
    assert prog["seen"]["hugified"]["windows_huge"] >= 8, prog["seen"]
    res = _hugify_try("--json", "--way", "shared", "--cache-dir", cache, *limits, "--", private / "itlb", "400",
                      cwd=private)  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = _json(res)
    (prog,) = [o for o in doc["objects"] if o["path"] == str(private / "itlb")]
    assert prog["seen"]["hugified"]["windows_huge"] == 0, prog["seen"]
    why = f"{private / 'itlb'}: no shared copy: not readable by every user: {private}: mode 0700 denies its group"
    assert f"{why} (copy-private)" in doc["notes"], doc["notes"]
    assert _leftovers(cache) == []


def test_the_shared_way_is_roots(shared_dir: Path) -> None:
    """Only root makes shared copies: another user asking for the way is told so in one
    line, status 4, before anything runs."""
    res = _hugify_try("--way", "shared", "--cache-dir", shared_dir / "cache", "--", "true", cwd=shared_dir,
                      user="nobody")  # fmt: skip
    assert res.returncode == 4, res.stderr
    assert res.stderr == (
        "hugify try: only root makes shared copies: run hugify try as root, or give --way anonymous (try-shared)\n"
    )
    assert not (shared_dir / "cache").exists()


SEQUENTIAL = (
    "#include <stdio.h>\n#include <stdlib.h>\n"
    + padded_functions("exe", 96)
    + "int main(int argc, char **argv) { long x = 1; for (int r = atoi(argv[1]); r > 0; r--) x = exe_all(x);"
    + ' printf("%ld\\n", x); }\n'
)


def test_an_a_a_comparison_claims_nothing_unless_its_interval_excludes_1(tmp_path: Path) -> None:
    """--control: the hugified side gets a plain copy of the original, so nothing
    differs but the file; the whole method runs, nothing is on huge pages, and the
    answer follows the interval: control-passed (status 0) where it holds 1, else
    control-failed (status 8, one line on stderr). Which of the two a real A/A run
    gives is chance (a 95 % interval excludes the truth in 1 run of 20, and how each
    file is cached moves a short command by tenths of a millisecond); the forced
    skew below fails it for certain. The program runs 1.5 MiB of straight-line code:
    the iTLB program is no A/A subject, as the physical placement of its page cache
    alone moves it by tens of percent (docs/try.md, "Limits")."""
    build_runtime()
    prog = _cc(tmp_path / "straight", SEQUENTIAL, "-fPIE", "-pie")
    args = ("--json", "--control", "--cache-dir", tmp_path / "cache", "--min-rounds", "6", "--max-rounds", "6")
    res = _hugify_try(*args, "--", prog, "1000", cwd=tmp_path)
    doc = _json(res)
    summary = (doc["answer"], doc["cpu"], doc["noise_floor"]["cpu"])
    assert doc["coverage"]["hugified_pmd_mapped"] == 0 == doc["coverage"]["original_pmd_mapped"], summary
    # Nothing differs but the file: the runs agree to a few percent whichever way the
    # interval falls (the copies' page cache costs tenths of a millisecond a run).
    assert 0.95 <= doc["cpu"]["median"] <= 1.05, summary
    lo, hi = doc["cpu"]["ci95"]
    if lo <= 1 <= hi:
        assert res.returncode == 0 and doc["verdict"] == "control-passed", (res.stderr, summary)
    else:
        assert res.returncode == 8 and doc["verdict"] == "control-failed", (res.stderr, summary)
        assert res.stderr == f"hugify try: {doc['answer']}\n" and res.stderr.endswith(" (control-failed)\n")
    (obj,) = [o for o in doc["objects"] if o["path"] == str(prog)]
    assert obj["status"] == "copied" and obj["copy"].startswith(str(tmp_path / "cache"))
    assert not list((tmp_path / "cache").glob("*/file"))  # plain copies are not kept


#: Takes three times the CPU time when it runs from a copy: its program file is not the
#: inode given (the original's), as on the hugified side of --control.
SKEWED = (
    "#include <stdio.h>\n#include <stdlib.h>\n#include <sys/stat.h>\n"
    + padded_functions("exe", 96)
    + "int main(int argc, char **argv) { struct stat st; long x = 1, n = atol(argv[2]);"
    + ' if (stat("/proc/self/exe", &st) != 0) return 2; if (st.st_ino != (ino_t)atoll(argv[1])) n *= 3;'
    + ' for (long r = n; r > 0; r--) x = exe_all(x); printf("%d\\n", x >= 0); }\n'
)


def test_a_control_whose_interval_excludes_1_fails_loudly(tmp_path: Path) -> None:
    """--control where the hugified side is forced slower (the command itself runs
    three times the work from a copy): the interval excludes 1, and the control fails
    with the report on stdout, one line with its reason id on stderr and status 8. On
    the old code it said control-failed but exited 0 (and a control only failed when
    clear of the A/A floor's interval too)."""
    build_runtime()
    prog = _cc(tmp_path / "skewed", SKEWED, "-fPIE", "-pie")
    args = ("--control", "--cache-dir", tmp_path / "cache", "--min-rounds", "2", "--max-rounds", "2")
    res = _hugify_try(*args, "--", prog, str(prog.stat().st_ino), "300", cwd=tmp_path)
    assert res.returncode == 8, res.stderr
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("hugify try: A/A control: CPU time [+"), res.stderr
    assert res.stderr.endswith(" (control-failed)\n"), res.stderr
    assert f"answer: {res.stderr.removeprefix('hugify try: ')}" in res.stdout


def test_the_plot_never_writes_through_a_symlink_at_its_name(tmp_path: Path) -> None:
    """--plot in a directory others can write (hugify try runs as root): a symlink
    planted at the picture's name is replaced by the picture, and the file it pointed
    to keeps its bytes."""
    build_runtime()
    prog = _cc(tmp_path / "straight", SEQUENTIAL, "-fPIE", "-pie")
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    plot = tmp_path / "ratios.svg"
    plot.symlink_to(victim)
    args = ("--cache-dir", tmp_path / "cache", "--min-rounds", "2", "--max-rounds", "2", "--plot", plot)
    res = _hugify_try(*args, "--", prog, "400", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert victim.read_text() == "root's file\n"
    assert not plot.is_symlink()
    assert ET.parse(plot).getroot().tag == "{http://www.w3.org/2000/svg}svg"


def _address_program(body: str) -> str:
    """A program of 96 functions (1.5 MiB of code) whose main finds its load address
    (`info`, from dladdr of exe_f0), then runs `body`."""
    main = "int main(void) {\n    Dl_info info;\n    dladdr((void *)exe_f0, &info);\n" + body + "}\n"
    return HUGE_CODE + padded_functions("exe", 96) + main


#: Prints where its code lies from where it was loaded.
ADDRESS_PRINTER = _address_program(
    r"""    long x = exe_all(1);
    printf("%ld: exe_f0 at %#lx from the load address\n", x, (unsigned long)((char *)exe_f0 - (char *)info.dli_fbase));
    return 0;
"""
)
#: Exits with 7 where its code lies 2 MiB or more from where it was loaded: the shift
#: puts the code on whole windows, which start at 2 MiB at the earliest.
ADDRESS_EXIT = _address_program(
    "    return exe_all(1) >= 0 && (char *)exe_f0 - (char *)info.dli_fbase >= 0x200000 ? 7 : 0;\n"
)


@pytest.mark.parametrize("source", ["output", "exit status"])
def test_behaviour_that_depends_on_code_addresses_is_a_difference(tmp_path: Path, source: str) -> None:
    """A program that prints where its code lies, or exits with a status that says
    it: the shift moves the code, the sides part, and hugify try stops there (status
    6) with where they part, the original's first."""
    build_runtime()
    prog = _cc(tmp_path / "where", ADDRESS_PRINTER if source == "output" else ADDRESS_EXIT, "-fPIE", "-pie")
    res = _hugify_try("--json", "--cache-dir", tmp_path / "cache", "--", prog, cwd=tmp_path)
    assert res.returncode == 7, res.stderr
    assert res.stderr.count("\n") == 1 and res.stderr.endswith("(original vs hugified) (behaviour-differs)\n")
    doc = _json(res)
    assert doc["error"]["reason"] == "behaviour-differs"
    if source == "output":
        assert "differ in standard output; standard output at line 1: " in res.stderr
        assert doc["difference"]["what"] == ["standard output"]
    else:
        assert "the runs differ in exit status 0 vs 7 (original vs hugified)" in res.stderr
        assert doc["difference"]["what"] == ["exit status 0 vs 7"]
    (obj,) = [o for o in doc["objects"] if o["path"] == str(prog)]
    assert obj["status"] == "transformed" and obj["mode"] == "shift"


def _running(cmdline: str) -> list[int]:
    """Processes whose command line (NUL-separated) contains `cmdline`."""
    found = []
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if d.name.isdigit() and cmdline.encode() in (d / "cmdline").read_bytes():
                found.append(int(d.name))
    return found


def _leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.name.startswith(".")) if cache.exists() else []


def test_a_failing_command_is_reported_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """Its exit status and last line on standard error, status 3 (command-failed); the
    background process it started is gone, and so are the run's scratch files."""
    build_runtime()
    marker = "1234.5678"
    state = _system_state(tmp_path)
    cache = tmp_path / "cache"
    script = f"sleep {marker} & echo 'cannot open input.txt' >&2; exit 7"
    res = _hugify_try("--cache-dir", cache, "--", "sh", "-c", script, cwd=tmp_path)
    assert res.returncode == 3, res.stderr
    assert res.stderr == (
        "hugify try: the command failed on the original files (exit status 7): cannot open input.txt (command-failed)\n"
    )
    assert res.stdout == ""
    assert not _running(f"sleep\0{marker}"), "the command's background process was left running"
    assert _leftovers(cache) == [] and _system_state(tmp_path) == state


MAKEFILE = """\
OBJS = one.o two.o three.o
all: $(OBJS)
%.o: %.c
\tgcc -O2 -c $< -o $@
"""


def test_make_running_compiles_is_compared_with_the_compiler_hugified(tmp_path: Path) -> None:
    """make forks and executes gcc, which executes cc1 and as: the first run finds
    them, the compiler's cc1 (Debian's: non-PIE, its code on whole windows as it is)
    and its libraries get copies, the hugified side's compiles map the copies, and the
    object files are compared (--compare-files) after every round."""
    build_runtime()
    for i, name in enumerate(("one", "two", "three")):
        (tmp_path / f"{name}.c").write_text(f"int {name}(int x) {{ return x * {i + 2}; }}\n")
    (tmp_path / "Makefile").write_text(MAKEFILE)
    objs = ["one.o", "two.o", "three.o"]
    args = ("--json", "--cache-dir", tmp_path / "cache", "--min-rounds", "3", "--max-rounds", "3", "--compare-files")
    res = _hugify_try(*args, *objs, "--", "make", "-s", "-B", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    doc = _json(res)
    by_name = {Path(o["path"]).name: o for o in doc["objects"]}
    cc1 = by_name["cc1"]
    assert cc1["copy"] and cc1["status"] in ("as-is", "transformed"), cc1
    assert cc1["seen"]["hugified"]["pmd_mapped"] > 0, cc1["seen"]
    assert doc["first_run"]["processes"] >= 4  # make, gcc, cc1, as (per object file)
    assert doc["rounds"] == 3 and doc["problems"] == []
    for o in objs:
        assert (tmp_path / o).is_file()


#: The program stays 0.3 s after its work, so that the watcher sees every run on a
#: loaded machine too (its thread missed a 20 ms run there): the test asks for all.
#: About 80 ms of CPU time a run: well above the 20 ms hugify try measures at the least
#: (100 rounds took 20 ms, on the edge of too-short).
RUNPATH_MAIN = (
    "#include <stdio.h>\n#include <unistd.h>\nlong lib_all(long);\n"
    + padded_functions("exe", 80)
    + "int main(void) { long x = 1; for (int r = 0; r < 400; r++) x = lib_all(exe_all(x));"
    + ' printf("%ld\\n", x); fflush(stdout); usleep(300000); }\n'
)


@pytest.mark.parametrize("user", ["root", "nobody"])
def test_a_program_with_runpath_origin_maps_both_copies(shared_dir: Path, user: str) -> None:
    """The program finds its library through RUNPATH $ORIGIN/../lib: bind-mounted over
    the originals' paths, both copies are found where the originals are. As root the
    side is a mount namespace; as another user, a user namespace with one."""
    build_runtime()
    top = shared_dir
    (top / "bin").mkdir()
    (top / "lib").mkdir()
    _cc(top / "lib" / "libbig.so", padded_functions("lib", 80), "-shared", "-fPIC")
    prog = _cc(top / "bin" / "prog", RUNPATH_MAIN, "-L", str(top / "lib"), "-lbig", "-Wl,-rpath,$ORIGIN/../lib")
    env = {"XDG_CACHE_HOME": str(top / "cache"), "HOME": str(top)}
    args: tuple[str | Path, ...] = ("--json", "--min-rounds", "2", "--max-rounds", "2")
    if user == "root":
        args += ("--cache-dir", top / "cache" / "hugify" / "try")  # not the machine's /var/cache/hugify/try
    else:
        subprocess.run(["chown", "-R", user, str(top)], check=True)
    res = _hugify_try(*args, "--", "bin/prog", cwd=top, user=None if user == "root" else user, env=env)
    assert res.returncode == 0, res.stderr
    doc = _json(res)
    objects = {o["path"]: o for o in doc["objects"]}
    for path in (prog, top / "lib" / "libbig.so"):
        o = objects[str(path)]
        assert o["status"] == "transformed", o
        assert o["seen"]["hugified"]["pmd_mapped"] == 2 << 20, o["seen"]
    assert doc["verified_runs"]["hugified"]["seen"] == 2
    cache = Path(doc["cache"]["root"])
    assert cache == top / "cache" / "hugify" / "try"  # for nobody: $XDG_CACHE_HOME/hugify/try
    assert _leftovers(cache) == []


def test_a_setuid_program_is_refused(tmp_path: Path) -> None:
    prog = _cc(tmp_path / "suid", "int main(void) { return 0; }\n")
    prog.chmod(0o4755)
    cache = tmp_path / "cache"
    res = _hugify_try("--cache-dir", cache, "--", prog, cwd=tmp_path)
    assert res.returncode == 4, res.stderr
    assert res.stderr == (
        f"hugify try: {prog} is setuid: its privileges would not survive the private namespace, "
        "nor a copy (setuid-program)\n"
    )
    assert not cache.exists()


@pytest.mark.parametrize("kind", ["read-only", "full"])
def test_an_unwritable_cache_is_one_line(tmp_path: Path, kind: str) -> None:
    """A read-only filesystem, and one too small for the copy: one line naming the
    directory and the system's error, status 5 (try-cache), nothing left on it."""
    build_runtime()
    prog = _cc(
        tmp_path / "prog",
        HUGE_CODE + padded_functions("exe", 96) + "int main(void) { return exe_all(1) < 0; }\n",
    )
    cache = tmp_path / "cache"
    cache.mkdir()
    options = "ro,size=1M,mode=0755" if kind == "read-only" else "size=1M,mode=0755"  # root's alone
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(cache)], check=True)
    try:
        res = _hugify_try("--cache-dir", cache, "--", prog, cwd=tmp_path)
        left = _leftovers(cache)
    finally:
        subprocess.run(["umount", str(cache)], check=True)
    error = "Read-only file system" if kind == "read-only" else "No space left on device"
    assert res.returncode == 5, res.stderr
    assert res.stderr == f"hugify try: cannot write the cache of hugified copies in {cache} ({error}) (try-cache)\n"
    assert left == []


#: Runs argv[1:] (`hugify try ARGS`) as uid 65534 inside a user namespace (mapping the first
#: 65536 ids to themselves) whose own user.max_user_namespaces is 0: the sysctl is kept
#: per user namespace, so the system's stays as it is.
NO_USERNS = """
import ctypes, os, sys
ready, go = os.pipe(), os.pipe()
pid = os.fork()
if pid == 0:
    assert ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == 0
    os.write(ready[1], b"1")
    os.read(go[0], 1)
    with open("/proc/sys/user/max_user_namespaces", "w") as f:
        f.write("0")
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    os.execv(sys.argv[1], sys.argv[1:])
os.read(ready[0], 1)
for name in ("uid_map", "gid_map"):
    with open(f"/proc/{pid}/{name}", "w") as f:
        f.write("0 0 65536")
os.write(go[1], b"1")
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_without_user_namespaces_a_user_is_told_why(shared_dir: Path) -> None:
    """Where the system lets this user make no user namespace, an unprivileged hugify
    try says so in one line naming the setting, status 4, and leaves nothing."""
    build_runtime()
    prog = _cc(
        shared_dir / "prog",
        HUGE_CODE + padded_functions("exe", 96) + "int main(void) { return exe_all(1) < 0; }\n",
    )
    cache = shared_dir / "cache"
    subprocess.run(["chown", "-R", "65534:65534", str(shared_dir)], check=True)
    env = {k: v for k, v in os.environ.items() if k != LOG_ENV} | {"PYTHONPATH": str(REPO)}
    cmd = [
        "/usr/bin/python3",
        "-c",
        NO_USERNS,
        *command("try", "--cache-dir", cache, "--", prog, python="/usr/bin/python3"),
    ]
    res = subprocess.run(cmd, cwd=shared_dir, env=env, capture_output=True, text=True, check=False)
    assert res.returncode == 4, res.stderr
    assert res.stderr == (
        "hugify try: cannot make a private mount namespace (unshare CLONE_NEWUSER|CLONE_NEWNS|CLONE_NEWPID: "
        "No space left on device): user namespaces are disabled (user.max_user_namespaces = 0); run as root "
        "(no-namespace)\n"
    )
    assert _leftovers(cache) == []


def test_explain_and_usage() -> None:
    """Each reason hugify try stops with is explainable with its exit status; without a
    command it is a usage error."""
    ids = {
        "no-namespace": 4,
        "setuid-program": 4,
        "nothing-to-try": 4,
        "command-failed": 3,
        "not-deterministic": 3,
        "files-changed": 3,
        "behaviour-differs": 7,
        "try-cache": 5,
        "try-shared": 4,
        "try-cache-unsafe": 6,
        "too-short": 8,
        "runs-unseen": 8,
        "control-failed": 8,
    }
    res = hugify("explain", *ids, check=False)
    assert res.returncode == 0, res.stderr
    for line, (rid, status) in zip(res.stdout.splitlines(), ids.items(), strict=True):
        assert line.startswith(f"{rid} (") and f", exit status {status}): hugify try: " in line, line
    res = hugify("try", "--json", check=False)
    assert res.returncode == 2 and "give the command to compare after --" in res.stderr


def test_the_svg_stays_well_formed_for_any_command() -> None:
    """Characters XML escapes (here an & where the title is cut) and every ratio
    end up in a well-formed picture."""
    from hugify.trial import report

    rounds = [{"A_cpu_s": 1.0, "B_cpu_s": 0.9 + k / 100, "A2_cpu_s": 1.0 + k / 200} for k in range(7)]
    summary = {"median": 0.93, "ci95": [0.91, 0.95], "half_width": 0.01, "min": 0.9, "max": 0.96}
    result = {
        "command": ["sh", "-c", "x" * 75 + " && make <all> 'twice'"],  # & where the old cut fell
        "per_round": rounds,
        "cpu": summary,
        "noise_floor": {"cpu": summary | {"median": 1.0, "ci95": [0.99, 1.02]}},
        "coverage": {"hugified_pmd_mapped": 4 << 20, "anonymous_held": None},
        "way": "file",
        "limits": {"target": 0.01},
    }
    root = ET.fromstring(report.svg(result))
    assert len(root.findall("{http://www.w3.org/2000/svg}circle")) == 2 * 7 + 2
    texts = [t.text or "" for t in root.findall("{http://www.w3.org/2000/svg}text")]
    assert texts[0].startswith("hugify try: sh -c 'xxx") and texts[0].endswith("…")
    assert texts[1] == report.answer(result)[1]


@pytest.mark.parametrize("launcher", [(), ("nohup",)], ids=["as-started", "nohup"])
def test_the_command_gets_the_signal_dispositions_a_shell_gives(tmp_path: Path, launcher: tuple[str, ...]) -> None:
    """The command gets, on either side, exactly the ignored and blocked signals it gets
    started directly as a shell starts it: what hugify try was started with, SIGPIPE and
    SIGXFSZ back to default (subprocess restores them, as a shell never ignores them on
    its own). Python ignores SIGPIPE and SIGXFSZ, and the sides' processes ignore what
    stops the comparison; none of it may reach the command (`yes | head` must end by
    SIGPIPE). Whatever started the test may have left signals ignored (glibc's signal 32
    after posix_spawn): a shell passes those on, and so must hugify try. The command is
    run by bash, which passes on the blocked signals too (dash unblocks them all at start).
    Under nohup, SIGHUP stays ignored in the command, as nohup promises: the sides'
    processes handle SIGHUP only where it was not ignored already."""
    build_runtime()
    script = "grep -E '^Sig(Ign|Blk)' /proc/self/status > signals.txt; yes | head -1 > /dev/null"
    busy = "; i=0; while [ $i -lt 100000 ]; do i=$((i + 1)); done"  # measurable (too-short below 20 ms)
    direct = tmp_path / "direct"
    direct.mkdir()
    subprocess.run([*launcher, "bash", "-c", script], cwd=direct, check=True, timeout=60, capture_output=True)
    expected = (direct / "signals.txt").read_text()
    assert expected.startswith("SigBlk:\t") and "\nSigIgn:\t" in expected, expected
    # SIGPIPE (13) and SIGXFSZ (25) are not in the mask a shell gives
    ignored = int(expected.split("SigIgn:\t")[1], 16)
    assert not ignored & (1 << 12 | 1 << 24), expected
    if launcher:  # SIGHUP (1) ignored by nohup
        assert ignored & 1, expected
    tried = tmp_path / "tried"
    tried.mkdir()
    args = ("--json", "--cache-dir", tmp_path / "cache", "--min-rounds", "1", "--max-rounds", "1")
    res = _hugify_try(
        *args, "--compare-files", "signals.txt", "--", "bash", "-c", script + busy, cwd=tried, launcher=launcher
    )
    assert res.returncode == 0, res.stderr
    assert (tried / "signals.txt").read_text() == expected


def test_a_terminated_comparison_leaves_nothing_behind(tmp_path: Path) -> None:
    """SIGTERM in the middle of the rounds: the command's processes (one left running
    in the background of each run), the sides' processes and the scratch files go;
    hugify try ends by the same signal."""
    build_runtime()
    marker = "987.654"
    cache = tmp_path / "cache"
    script = f"sleep {marker} & i=0; while [ $i -lt 100000 ]; do i=$((i + 1)); done"
    cmd = command("try", "--cache-dir", cache, "--budget", "600", "--")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with subprocess.Popen([*cmd, "sh", "-c", script], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True) as p:
        deadline = time.monotonic() + 60
        while not _running(f"sleep\0{marker}") and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1)  # into the rounds
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGTERM, err
    assert "hugify try: stopped by SIGTERM" in err
    assert not _running(f"sleep\0{marker}")
    assert _leftovers(cache) == [] and _system_state(tmp_path)[0] == []


def test_entries_of_another_hugify_go_once_unused_for_a_day(tmp_path: Path) -> None:
    """Entries under another key (another hugify, another policy) unused for more than
    a day are removed when a run opens the cache; younger ones stay."""
    build_runtime()
    cache = tmp_path / "cache"
    old, recent = cache / f"{'0' * 64}-{'f' * 16}", cache / f"{'1' * 64}-{'f' * 16}"
    for entry in (old, recent):
        entry.mkdir(parents=True)
        (entry / "outcome.json").write_text("{}\n")
    two_days_ago = time.time() - 2 * 86400
    os.utime(old, (two_days_ago, two_days_ago))
    res = _hugify_try("--cache-dir", cache, "--", "sh", "-c", "exit 1", cwd=tmp_path)
    assert res.returncode == 3, res.stderr
    assert not old.exists() and recent.is_dir()


# --- the cache holds only what it says (issue 38) --------------------------------------


def _marked(path: Path, marker: str, extra: str = "") -> Path:
    """A program of 1.5 MiB of code (a copy is made of it) that does some 70 ms of
    work (well over what hugify try can measure), says `marker` and exits 0; `extra`:
    more C statements before that."""
    main = (
        "int main(void) { long x = 1; for (int r = 600; r > 0; r--) x = exe_all(x);"
        f' {extra} puts("{marker}"); return x < 0; }}\n'
    )
    return _cc(path, HUGE_CODE + padded_functions("exe", 96) + main, "-fPIE", "-pie")


#: What the programs another user plants do besides: leave a file, as whoever runs them.
PWN = 'FILE *f = fopen("pwned", "w"); if (f) fclose(f);'


def test_a_cache_entry_holds_the_bytes_its_name_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another user who can replace a file the command loads renames other bytes over
    it once hugify try has hashed it (inotify's IN_CLOSE_NOWRITE says when): forced
    here at that very point by a hook. The entry named by the digest of the bytes
    hashed holds their copy, not the other bytes, because both come from one read of
    one descriptor. On the old code (the hook's step added after its hash), the copy,
    made from a second open of the path, was the other program's under the first
    one's digest: every later root hugify try of a command loading it ran it."""
    from hugify.trial.cache import Cache
    from hugify.trial.session import try_policy

    build_runtime()
    good = _marked(tmp_path / "good", "the-good-bytes")
    evil = _marked(tmp_path / "evil", "the-evil-bytes")
    original = tmp_path / "prog"
    shutil.copy2(good, original)
    read = files.version(os.stat(original))
    fired: list[files.Step] = []

    def rename_over(step: files.Step) -> None:
        if step.name == "hashed" and step.target == str(original) and not fired:
            fired.append(step)
            os.rename(evil, original)

    monkeypatch.setattr(files, "step_hook", rename_over)
    cache = Cache(tmp_path / "cache", try_policy(None))
    cache.open()
    try:
        (copy,) = cache.copies([str(original)], jobs=1)
    finally:
        cache.close()
    assert fired, "the hashed step was never reached"
    assert b"the-evil-bytes" in original.read_bytes()  # renamed over it
    digest = hashlib.sha256(good.read_bytes()).hexdigest()
    assert copy.status == "transformed" and copy.sha256 == digest and copy.path is not None
    assert copy.path.parent.name.startswith(f"{digest}-")
    data = copy.path.read_bytes()
    assert b"the-good-bytes" in data and b"the-evil-bytes" not in data
    # The copy stands for the file whose bytes it holds, not for what is at the path now.
    assert copy.source == read and files.version(os.stat(original)) != read


def _as(user: str, *cmd: str | Path) -> None:
    ids = ["--reuid", user, "--regid", str(pwd.getpwnam(user).pw_gid), "--clear-groups"]
    subprocess.run(["setpriv", *ids, *map(str, cmd)], check=True)


def test_a_cache_another_user_made_is_refused(shared_dir: Path) -> None:
    """--cache-dir names a directory another user made (in a sticky directory all may
    write, as /tmp) and planted an entry in, under the name the copy of root's program
    would have (names are computable by anyone): root's hugify try refuses it in one
    line with its reason id, status 6, before anything runs, and the planted program
    never runs. On the old code it was bind-mounted over the program and run as root."""
    from hugify.trial.cache import code_key
    from hugify.trial.session import try_policy

    build_runtime()
    prog = _marked(shared_dir / "prog", "same")
    evil = _marked(shared_dir / "evil", "same", PWN)
    public = shared_dir / "public"
    public.mkdir()
    public.chmod(0o1777)
    cache = public / "cache"
    entry = cache / f"{hashlib.sha256(prog.read_bytes()).hexdigest()}-{code_key(try_policy(None))}"
    _as("nobody", "mkdir", "-p", entry)
    outcome = json.dumps({"status": "transformed", "reason": None, "detail": "", "mode": "shift"})
    _as("nobody", "sh", "-c", f"cp {evil} {entry}/file && echo '{outcome}' > {entry}/outcome.json")
    res = _hugify_try("--cache-dir", cache, "--min-rounds", "1", "--max-rounds", "1", "--", prog, cwd=shared_dir)
    assert res.returncode == 6, res.stderr
    assert res.stderr == (
        f"hugify try: the cache of hugified copies, {cache}, is not safe to use: {cache} is owned by uid 65534 "
        "(nobody), not by uid 0 (root); give --cache-dir a directory of your own that nobody else can write "
        "(try-cache-unsafe)\n"
    )
    assert not (shared_dir / "pwned").exists()
    assert sorted(p.name for p in cache.iterdir()) == [entry.name]  # nothing written there


def test_a_copy_of_a_private_program_is_no_more_readable_than_the_program(shared_dir: Path) -> None:
    """Root tries a program kept in a directory only root may enter (a 0755 file in a
    0700 directory, as in /root/bin): its hugified copy in the cache is no more readable
    by another user than the program, whose bytes nobody else could read. On the old
    code the entry was 0755 and nobody read the copy."""
    build_runtime()
    private = shared_dir / "private"
    private.mkdir(mode=0o700)
    prog = _marked(private / "prog", "same")
    cache = shared_dir / "cache"
    res = _hugify_try(
        "--json", "--cache-dir", cache, "--min-rounds", "1", "--max-rounds", "1", "--", prog, cwd=shared_dir
    )
    assert res.returncode == 0, res.stderr
    (copy,) = [Path(o["copy"]) for o in _json(res)["objects"] if o["path"] == str(prog)]
    assert copy.is_file() and copy.stat().st_mode & 0o004  # the file itself, as its original
    ids = ["--reuid", "nobody", "--regid", str(pwd.getpwnam("nobody").pw_gid), "--clear-groups"]
    seen = subprocess.run(
        ["setpriv", *ids, "cat", str(copy)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False
    )
    assert seen.returncode != 0 and "Permission denied" in seen.stderr, seen
    assert [oct(p.stat().st_mode & 0o777) for p in [cache, copy.parent]] == ["0o711", "0o700"]


def test_only_a_group_the_caller_alone_is_in_may_write_the_caches_directories(tmp_path: Path) -> None:
    """A directory on the way to the cache that its group may write is another user's
    way in, unless nobody but the caller is in that group (a user private group, which
    umask 002 makes group-writable): root's own group may, nogroup (nobody's, _apt's)
    may not, and nothing is made below a directory refused."""
    import grp

    from hugify.trial.cache import UntrustedCache, open_root

    private = tmp_path / "private"
    private.mkdir()
    private.chmod(0o775)  # root:root
    fd = open_root(private / "cache", create=True)
    assert fd is not None and (private / "cache").is_dir()
    os.close(fd)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, 0, grp.getgrnam("nogroup").gr_gid)
    shared.chmod(0o775)
    with pytest.raises(UntrustedCache, match=f": {shared} is writable by its group \\(mode 0775\\);"):
        open_root(shared / "cache", create=True)
    assert list(shared.iterdir()) == []


@pytest.mark.parametrize("how", ["other bytes", "another user's"])
def test_an_entry_that_is_not_what_it_says_is_made_again(shared_dir: Path, how: str) -> None:
    """An entry of root's own cache whose copy is not the bytes its record says (the
    file replaced), or that is not root's (planted when the directory was another's):
    the next run does not use it (the planted program never runs), but makes the entry
    again. On the old code any entry found was bind-mounted as it was."""
    build_runtime()
    prog = _marked(shared_dir / "prog", "same")
    evil = _marked(shared_dir / "evil", "same", PWN)
    cache = shared_dir / "cache"
    args = ("--json", "--cache-dir", cache, "--min-rounds", "1", "--max-rounds", "1", "--", prog)
    first = _hugify_try(*args, cwd=shared_dir)
    assert first.returncode == 0, first.stderr
    (copy,) = [Path(o["copy"]) for o in _json(first)["objects"] if o["path"] == str(prog)]
    copy.chmod(0o755)
    shutil.copyfile(evil, copy)
    copy.chmod(0o555)
    if how == "another user's":
        subprocess.run(["chown", "-R", "nobody", copy.parent], check=True)
    res = _hugify_try(*args, cwd=shared_dir)
    assert res.returncode == 0, res.stderr
    assert not (shared_dir / "pwned").exists()
    (obj,) = [o for o in _json(res)["objects"] if o["path"] == str(prog)]
    assert obj["status"] == "transformed" and not obj["cached"] and obj["copy"] == str(copy)
    assert b"same" in copy.read_bytes() and copy.stat().st_uid == 0
    assert b"pwned" not in copy.read_bytes()


def _mount_lines(needle: str) -> list[str]:
    """Every mount of every process's namespace whose line names `needle`."""
    found = []
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if d.name.isdigit():
                found += [line for line in (d / "mountinfo").read_text().splitlines() if needle in line]
    return found


def test_a_killed_comparison_leaves_no_process_and_no_mount(tmp_path: Path) -> None:
    """hugify try killed with SIGKILL in the middle of a run of the hugified side
    (which root's namespace shows the copies bind-mounted in, and the shared copies'
    tmpfs): within seconds no process of the command is left (the sides are PID
    namespaces, which end with their init, which ends with hugify try), and no
    namespace of any process holds a mount of the run. On the old code the command
    went on as root, reparented to init, its namespace and the tmpfs alive."""
    build_runtime()
    prog = _marked(tmp_path / "prog", "same")
    marker = "4321.875"
    cache = tmp_path / "cache"
    state = _system_state(tmp_path)
    cmd = command("try", "--cache-dir", cache, "--budget", "600", "--")
    script = f"sleep {marker} & {prog}; sleep 3"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        with subprocess.Popen([*cmd, "sh", "-c", script], cwd=tmp_path, env=env, stderr=subprocess.PIPE) as p:
            deadline = time.monotonic() + 120
            # a run of the hugified side: its namespace shows the copy over the program
            while not any(str(cache) in line for pid in _running(f"sleep\0{marker}")
                          for line in _proc_text(pid, "mountinfo").splitlines()):  # fmt: skip
                assert time.monotonic() < deadline and p.poll() is None, p.stderr.read() if p.stderr else ""
                time.sleep(0.05)
            assert _mount_lines(str(cache))
            p.kill()
            p.wait()
        deadline = time.monotonic() + 10
        while (_running(f"sleep\0{marker}") or _mount_lines(str(tmp_path))) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(f"sleep\0{marker}"), "the command's process was left running"
        assert not _running(script), "the command was left running"
        assert _mount_lines(str(tmp_path)) == [], "a namespace of the run is alive"
        assert _system_state(tmp_path) == state
    finally:
        for pid in _running(f"sleep\0{marker}"):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _proc_text(pid: int, name: str) -> str:
    try:
        return Path(f"/proc/{pid}/{name}").read_text()
    except OSError:
        return ""


# --- honest about what it cannot measure (issue 42) ---------------------------------------


def test_a_command_that_prints_the_time_is_not_deterministic(tmp_path: Path) -> None:
    """`date +%N` prints something else every run: two runs on the original files
    differ first, so it is reported as not deterministic (status 3), not as hugified
    files behaving differently. On the old code the untimed runs compared the
    original with the hugified side before a second original run existed: exit 7,
    behaviour-differs."""
    build_runtime()
    res = _hugify_try("--cache-dir", tmp_path / "cache", "--", "date", "+%N", cwd=tmp_path)
    assert res.returncode == 3, res.stderr
    assert res.stderr.startswith("hugify try: two runs on the original files differ in standard output; ")
    assert res.stderr.count("\n") == 1 and res.stderr.endswith(" cannot be compared (not-deterministic)\n")
    assert _leftovers(tmp_path / "cache") == []


def test_a_command_of_two_milliseconds_is_too_short_to_measure(tmp_path: Path) -> None:
    """A command of about 2 ms of CPU time is mostly its process's start and exit:
    reported as too short to measure in one line with its reason id (status 8), no
    rounds made, no gain or loss claimed. On the old code it was measured (status 0,
    an answer either way)."""
    build_runtime()
    prog = _cc(tmp_path / "straight", SEQUENTIAL, "-fPIE", "-pie")
    res = _hugify_try("--json", "--cache-dir", tmp_path / "cache", "--", prog, "4", cwd=tmp_path)
    assert res.returncode == 8, res.stderr
    assert res.stderr.startswith("hugify try: the command takes ") and res.stderr.count("\n") == 1
    assert res.stderr.endswith(" (too-short)\n"), res.stderr
    doc = _json(res)
    assert doc["error"]["reason"] == "too-short" and "verdict" not in doc and "cpu" not in doc
    assert doc["first_run"]["cpu_s"] < 0.02


def test_runs_the_watcher_did_not_see_give_no_answer() -> None:
    """However clear the interval, where the watcher saw fewer than half of the
    hugified side's runs use its copies, what they ran on cannot be told: unmeasurable
    (runs-unseen), not a gain. On the old code the verdict was a gain."""
    from hugify.trial import report

    summary = {"median": 0.8, "ci95": [0.78, 0.82], "half_width": 0.025, "min": 0.77, "max": 0.83}
    result = {
        "cpu": summary,
        "noise_floor": {"cpu": summary | {"median": 1.0, "ci95": [0.98, 1.02]}},
        "coverage": {"hugified_pmd_mapped": 4 << 20, "anonymous_held": None},
        "verified_runs": {"hugified": {"seen": 4, "runs": 10}, "original": {"seen": 20, "runs": 20}},
        "way": "file",
        "limits": {"target": 0.01},
    }
    verdict, line = report.answer(result)
    assert verdict == "unmeasurable" and line.endswith("(runs-unseen)"), line
    assert report.answer(result | {"verified_runs": {"hugified": {"seen": 5, "runs": 10}}})[0] == "gain"


def test_an_interrupted_comparison_reports_its_rounds_and_leaves_nothing(tmp_path: Path) -> None:
    """SIGINT once rounds were made: the report of those rounds is printed, marked as
    stopped, the command's processes and the scratch files go, and hugify try ends by
    SIGINT (a shell shows 130). On the old code Ctrl-C threw every round away."""
    build_runtime()
    prog = _marked(tmp_path / "prog", "same")
    marker = "765.4321"
    cache = tmp_path / "cache"
    log = tmp_path / "runs.log"
    script = f"echo run >> {log}; sleep {marker} & {prog}"
    cmd = command("try", "--cache-dir", cache, "--budget", "600", "--")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # SIGINT as an interactive shell gives it: the suite may itself run with it ignored
    # (a background job of a script: `make test &`), which hugify try rightly keeps
    # ignored, and then it ran every round with status 0. A handler here is the
    # default in the child, after exec.
    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        p = subprocess.Popen(
            [*cmd, "sh", "-c", script], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    finally:
        signal.signal(signal.SIGINT, ignored)
    with p:
        deadline = time.monotonic() + 120
        # the first run, three untimed runs, a round of three, and the next run begun
        while not (log.exists() and len(log.read_text().splitlines()) >= 8):
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.02)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    assert p.returncode == -signal.SIGINT, err
    rounds = int(err.split("stopped by SIGINT after ")[1].split(" ")[0])
    assert rounds >= 1 and err.endswith("round(s); the command's processes and the run's files are gone\n"), err
    assert f"  {rounds} rounds of 3 runs (stopped: by SIGINT after {rounds} round(s));" in out, out
    assert f"\nanswer: (stopped by SIGINT: {rounds} round(s) only) " in out, out
    assert not _running(f"sleep\0{marker}")
    assert _leftovers(cache) == [] and _system_state(tmp_path)[0] == []


def test_the_report_says_where_the_cache_is_and_how_to_clear_it(tmp_path: Path) -> None:
    """The text report names the cache and what it holds, and how to empty it;
    `hugify try --clear-cache` does, and says what it removed. On the old code the
    report did not mention the cache and there was no such option."""
    build_runtime()
    prog = _marked(tmp_path / "prog", "same")
    cache = tmp_path / "cache"
    res = _hugify_try("--cache-dir", cache, "--min-rounds", "1", "--max-rounds", "1", "--", prog, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    entries = [e for e in cache.iterdir() if not e.name.startswith(".")]
    held = sum(f.stat().st_size for e in entries for f in e.iterdir())
    assert entries and f"\n  cache: {cache}, {held / (1 << 20):.1f} MiB (hugify try --clear-cache empties it)\n" in (
        res.stdout
    )
    res = _hugify_try("--clear-cache", "--cache-dir", cache, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"hugify try: removed {len(entries)} entries ({held / (1 << 20):.1f} MiB) from {cache}\n"
    assert list(cache.iterdir()) == []


def test_a_plot_in_a_missing_directory_and_no_rounds_are_refused_at_once(tmp_path: Path) -> None:
    """--plot into a directory that does not exist: one line, status 5, before
    anything runs, and the directory is not made (hugify try runs as root). On the old
    code it measured, then made the directory. --max-rounds 0 is a usage error about
    --max-rounds (the old code complained about --min-rounds)."""
    plot = tmp_path / "missing" / "p.svg"
    res = _hugify_try("--cache-dir", tmp_path / "cache", "--plot", plot, "--", "true", cwd=tmp_path)
    assert res.returncode == 5, res.stderr
    assert (
        res.stderr == f"hugify try: cannot write the plot {plot}: {plot.parent}: No such file or directory (io-error)\n"
    )
    assert not plot.parent.exists() and not (tmp_path / "cache").exists()
    res = _hugify_try("--max-rounds", "0", "--", "true", cwd=tmp_path)
    assert res.returncode == 2 and "argument --max-rounds: give 1 or more" in res.stderr, res.stderr
    assert "--min-rounds" not in res.stderr.splitlines()[-1]


def test_the_watcher_counts_anonymous_copies_as_the_objects_code(built: Programs) -> None:
    """With the runtime's anonymous copies, a process's code windows are anonymous
    memory once copied (at its start), and its file's mapping holds only the rest: the
    watcher counts the copies as the object's resident code and huge pages, whenever it
    looks. The old watcher counted only the file's mapping, whose code it saw only
    while the copying lasted: the root cause of the speedup benchmark's quick
    clang-anon round failing under load (its libclang-cpp copied in half a second,
    before a loaded watcher's first look; the program here is past its copying by the
    time it says "waiting")."""
    from hugify.hugified import read_hugified
    from hugify.trial.watch import RunSampler, Watched

    env = {k: v for k, v in os.environ.items() if k not in ("LD_AUDIT", "HUGIFY_ANONYMOUS")}
    argv = [str(HUGIFY_RUN), "--anonymous=always", str(built.prog), str(built.plug), "wait"]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) as p:
        try:
            assert p.stdout is not None and p.stdout.readline() == "waiting\n"
            watched = []
            for f in (built.prog, built.lib):
                fd = os.open(f, os.O_RDONLY)
                try:
                    windows = read_hugified(fd, HP, str(f)).offsets
                finally:
                    os.close(fd)
                st = f.stat()
                watched.append(Watched(os.path.realpath(f), (0, 0), (st.st_dev, st.st_ino), windows))
            sampler = RunSampler(os.getpid(), watched, HP, None, anonymous=True)
            sampler.look(p.pid)
        finally:
            p.kill()
    assert sampler.anon_held > 0
    for w in watched:
        seen = sampler.seen[w.name]
        assert w.windows and seen.rss >= len(w.windows) * HP, (w.name, seen)
    assert sum(sampler.seen[w.name].pmd for w in watched) == sampler.anon_held
