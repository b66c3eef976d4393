"""Hugified objects through the tools that rewrite them after hugify in a package
build: dwz (dh_dwz, which dh-hugify's sequence runs after dh_hugify; with several
files, as a multifile), elfutils' eu-strip (find-debuginfo, which brp-hugify runs
after hugify), binutils' strip and objcopy (dh_strip).

Where hugify's shift splits the first load its program header table needs one header
more: lld's rodata-first layout (its .rodata moves with the code, in a load of its
own) and GNU ld without -z separate-code (the default on arm64: the first load held
the code). The table used to move behind what stays, after .rela.plt, into a gap
between sections. elfutils' libelf, which dwz and eu-strip write their output with,
fills the gaps between sections after writing the program headers: the table came out
with every entry PT_NULL and the program no longer loaded (SIGSEGV); binutils' strip
moved sections and broke the file. Now the table grows in place at e_phoff, and the
loader metadata after it (.interp, notes, as much as makes room) moves behind what
stays, with its headers, symbols and .dynamic pointers.

clang 14 writes DWARF 5 by default, whose .debug_str_offsets dwz 0.15 refuses (and
dh_dwz with it, hugify or not): the objects here carry DWARF 4, which dwz rewrites."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit import HP
from testkit.cli import run_program, transform
from testkit.elf import elflint, exec_load, readelf_build_id, readelf_loads
from testkit.recipes import Recipe, build

RECIPES = (
    Recipe(
        "dw-clang-lld-dwarf4",
        cc="clang",
        ldflags=("-fuse-ld=lld",),
        debug=("-g", "-gdwarf-4"),
        # clang's code is denser than gcc's: this is over 2 MiB, a whole window.
        exe_funcs=3400,
        lib_funcs=3400,
    ),
    Recipe("dw-gcc-bfd-noseparate-code-dwarf4", ldflags=("-Wl,-z,noseparate-code",), debug=("-g", "-gdwarf-4")),
)
FILES = ("prog", "libhug.so")


def _program_headers(path: Path) -> tuple[int, list[str]]:
    """e_phoff and the program headers' lines, as readelf prints them."""
    out = subprocess.run(["readelf", "-hlW", str(path)], capture_output=True, text=True, check=True).stdout
    phoff = int(out.split("Start of program headers:")[1].split()[0])
    table = out.split("Program Headers:")[1].split("Section to Segment")[0]
    return phoff, [line.split()[0] for line in table.splitlines()[2:] if line.strip() and "[" not in line]


def _run(*cmd: str | Path) -> None:
    subprocess.run([*map(str, cmd)], capture_output=True, text=True, check=True)


def _dwz_multifile(d: Path) -> None:
    # What dh_dwz runs for a package with several ELF files.
    _run("dwz", f"-m{d}/common.debug", "-M/usr/lib/debug/.dwz/common.debug", "--", *(d / f for f in FILES))
    assert (d / "common.debug").is_file(), "dwz made no multifile: it did not rewrite the objects"


def _dwz_each(d: Path) -> None:
    # What dh_dwz runs for a single file (and with the multifile off).
    _run("dwz", "--", *(d / f for f in FILES))


def _eu_strip(d: Path) -> None:
    # find-debuginfo's split of the debug information.
    for f in FILES:
        _run("eu-strip", "--remove-comment", "--reloc-debug-sections", "-f", d / f"{f}.debug", d / f)


def _dh_strip(d: Path) -> None:
    # dh_strip: the debug file first, then strip (--strip-unneeded for libraries).
    note = ("--remove-section=.comment", "--remove-section=.note")
    for f, strip in (("prog", note), ("libhug.so", (*note, "--strip-unneeded"))):
        _run("objcopy", "--only-keep-debug", "--compress-debug-sections", d / f, d / f"{f}.debug")
        _run("strip", *strip, d / f)
        _run("objcopy", f"--add-gnu-debuglink={d / f'{f}.debug'}", d / f)


def _strip_all(d: Path) -> None:
    for f in FILES:
        _run("strip", "--strip-all", d / f)


TOOLS: dict[str, Callable[[Path], None]] = {
    "dwz-multifile": _dwz_multifile,
    "dwz": _dwz_each,
    "eu-strip": _eu_strip,
    "dh_strip": _dh_strip,
    "strip-all": _strip_all,
}


def _phnum(path: Path) -> int:
    out = subprocess.run(["readelf", "-hW", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split("Number of program headers:")[1].split()[0])


@pytest.fixture(scope="module", params=RECIPES, ids=lambda r: r.name)
def objects(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The recipe's objects as linked, and shifted."""
    orig = build(request.param)
    new = tmp_path_factory.mktemp("shifted")
    for f in FILES:
        assert transform(orig / f, new / f, "--mode", "shift")["result"]["mode"] == "shift"
        # The first load splits, and the table grows by the new load's header where it was.
        assert readelf_loads(orig / f)[0].filesz > readelf_loads(new / f)[0].filesz, f
        assert _phnum(new / f) == _phnum(orig / f) + 1, f
        assert _program_headers(new / f)[0] == _program_headers(orig / f)[0], f
    return orig, new


def _through(tool: str, src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in FILES:
        shutil.copy2(src / f, dst / f)
    TOOLS[tool](dst)
    return dst


@pytest.mark.parametrize("tool", list(TOOLS))
def test_tools_after_hugify_keep_the_program_loadable(tool: str, objects: tuple[Path, Path], tmp_path: Path) -> None:
    orig, new = objects
    done = _through(tool, new, tmp_path / "shifted")
    plain = _through(tool, orig, tmp_path / "plain")
    for f in FILES:
        phoff, types = _program_headers(done / f)
        assert "NULL" not in types, f"{tool} zeroed {f}'s program headers: {types}"
        assert (phoff, types) == _program_headers(new / f), f
        # The hugified layout survives: the same loads, code on whole windows (binutils
        # strip trims the alignment padding at the end of the first load: 8 bytes).
        before, after = readelf_loads(new / f), readelf_loads(done / f)
        assert after[1:] == before[1:], f
        assert dataclasses.replace(after[0], filesz=0, memsz=0) == dataclasses.replace(before[0], filesz=0, memsz=0)
        assert before[0].filesz - 8 <= after[0].filesz <= before[0].filesz, f
        # Code on its windows: lld's shift leaves one window next to its read-only data
        # partial (issue 28's zero exposure), so the load need not be whole windows.
        x = exec_load(done / f)
        assert (x.offset % HP, x.align) == (x.vaddr % HP, HP), f
        assert readelf_build_id(done / f) == readelf_build_id(new / f), f
        assert elflint(done / f) - elflint(plain / f) == set(), f
    expected = run_program(orig / "prog")
    assert expected[0] == 0
    assert run_program(done / "prog") == run_program(plain / "prog") == expected
