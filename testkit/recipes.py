"""Test programs built by the tests themselves, with several compilers, linkers and
languages, cached outside the checkout by the hash of their recipe.

A recipe names a toolchain and its flags; ``build(recipe)`` returns a directory
holding ``prog`` and, for dynamically linked recipes, ``libhug.so`` (found by
``prog`` through ``$ORIGIN``). The cache key covers the recipe, the sources under
tests/programs, and the tool versions, so a toolchain upgrade rebuilds. Their C code is
tests/programs/gen_code.py's, one function in FULL_EVERY a switch function and the others
padded to its size, measured on the recipe's compiler (generate_code): the sizes and
layouts of full programs at a fifth of the compile time.

Run ``.venv/bin/python -m testkit.recipes`` to build every recipe ahead of the tests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from testkit import REPO
from testkit.annobin_notes import annotate
from testkit.cache import building, cache_root, cached, locked, note_used
from testkit.cli import transform

PROGRAMS = REPO / "tests" / "programs"
ANNOBIN_NOTES = Path(__file__).resolve().parent / "annobin_notes.py"
#: Bump when the build steps below change in a way that changes their output.
BUILD_VERSION = 2


def _gen_code() -> ModuleType:
    """tests/programs/gen_code.py, whose figures the cache keys name."""
    spec = importlib.util.spec_from_file_location("gen_code", PROGRAMS / "gen_code.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    # No __pycache__ among the recipes' inputs (recipe_key reads that directory).
    before, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = before
    return module


_GEN = _gen_code()
#: One generated C function in this many is a switch function (tests/programs/gen_code.py);
#: the others are padded to its size, which compiles about five times faster.
FULL_EVERY: int = _GEN.FULL_EVERY
#: What generate_code's sources depend on besides its arguments (part of cache keys).
GENERATOR = f"gen_code.py --padded, one in {FULL_EVERY} a switch function, probed on {_GEN.PROBE_FUNCS}"


@dataclasses.dataclass(frozen=True)
class Recipe:
    name: str
    lang: str = "c"  # c | cxx | rust
    cc: str = "gcc"  # gcc | clang (C/C++ only)
    ldflags: tuple[str, ...] = ()
    cflags: tuple[str, ...] = ("-O2",)
    exe_funcs: int = 2800  # about 2.5 MiB of code
    lib_funcs: int = 2800
    static_pie: bool = False
    debug: tuple[str, ...] = ()  # e.g. ("-g", "-gdwarf-4")
    #: objcopy --compress-debug-sections=TYPE after linking (zstd, which gcc 12 lacks;
    #: zlib-gnu, which ld 2.44 no longer writes).
    compress_after: str | None = None
    #: Extra C++ translation units that include heavy headers: lots of .debug_info.
    heavy_units: int = 0
    #: The mode `hugify` is expected to choose, and the shift's refusal reason if not.
    expect_mode: str = "shift"
    #: Every unit carries annobin build notes (testkit/annobin_notes.py).
    annobin: bool = False
    #: Options the tests transform this recipe's files with (not part of the build).
    transform_opts: tuple[str, ...] = ()

    @property
    def has_lib(self) -> bool:
        return self.lang in ("c", "cxx") and not self.static_pie

    @property
    def triple(self) -> str | None:
        """GNU triple of the target, or None for the build machine."""
        return None

    @property
    def runner(self) -> list[str]:
        """What runs the recipe's programs: nothing natively, qemu-user otherwise."""
        return []

    def compiler(self, cxx: bool) -> list[str]:
        if self.cc == "clang":
            return ["clang++" if cxx else "clang"]
        return ["g++" if cxx else "gcc"]

    @property
    def transform_args(self) -> tuple[str, ...]:
        """Options the tests transform this recipe's files with."""
        return self.transform_opts

    def binutil(self, name: str) -> str:
        """A binutils program that handles the recipe's architecture."""
        return f"{self.triple}-{name}" if self.triple else name


@dataclasses.dataclass(frozen=True)
class CrossRecipe(Recipe):
    """A recipe for another architecture: Debian's cross compilers (or clang
    --target), run under qemu-user with the cross sysroot."""

    target: str = "aarch64-linux-gnu"
    #: --mode for the tests' transform (auto when None).
    force_mode: str | None = None

    @property
    def transform_args(self) -> tuple[str, ...]:
        return (*(("--mode", self.force_mode) if self.force_mode else ()), *self.transform_opts)

    @property
    def triple(self) -> str:
        return self.target

    @property
    def sysroot(self) -> str:
        return f"/usr/{self.target}"

    @property
    def runner(self) -> list[str]:
        qemu = {"aarch64-linux-gnu": "qemu-aarch64", "i686-linux-gnu": "qemu-i386"}[self.target]
        # The sysroot's libraries come first: the host's /etc/ld.so.cache may name a libc
        # of the guest's architecture (libc6-i386's /lib32, which libclang-rt-dev pulls
        # in), which -L cannot redirect and which does not match the sysroot's ld.so
        # (the i686 programs looped in its start-up).
        return [qemu, "-L", self.sysroot, "-E", f"LD_LIBRARY_PATH={self.sysroot}/lib"]

    def compiler(self, cxx: bool) -> list[str]:
        if self.cc == "clang":
            return ["clang++" if cxx else "clang", f"--target={self.target}"]
        return [f"{self.target}-{'g++' if cxx else 'gcc'}"]


#: Transform options: the shift, forced; the opt-in that lets lld's read-only data into
#: the code's huge-page window.
SHIFT = ("--mode", "shift")
EXPOSE = ("--exposure-limit", "1M")

RECIPES = [
    Recipe("gcc-bfd"),
    Recipe("gcc-bfd-noseparate-code", ldflags=("-Wl,-z,noseparate-code",)),
    Recipe("gcc-bfd-now-relr", ldflags=("-Wl,-z,now", "-Wl,-z,pack-relative-relocs")),
    Recipe("gcc-gold", ldflags=("-fuse-ld=gold",)),
    Recipe("clang-bfd", cc="clang", ldflags=("-fuse-ld=bfd",)),
    # lld puts .rodata before the code (-z rosegment): it moves with the code, and
    # stays out of the executable load: the code's window next to it stays in small
    # pages (about 3 MiB of code, one whole window; shifted, though alignment alone
    # would cover as much). Of the shift's two ways to that window, code ending on it
    # or starting on it, the one with less padding in it wins; the program's 4620
    # functions end its code near the end of a page, so its load starts mid-window
    # (test_as_is's corner).
    Recipe("clang-lld", cc="clang", ldflags=("-fuse-ld=lld",), exe_funcs=4620, lib_funcs=4600, transform_opts=SHIFT),
    Recipe("clang-lld-no-rosegment", cc="clang", ldflags=("-fuse-ld=lld", "-Wl,--no-rosegment")),
    # (lld 14's RELR lacks the GLIBC_ABI_DT_RELR dependency that glibc 2.36 requires,
    # so RELR is covered by GNU ld.)
    # 1.8 MiB of code: no whole window without the read-only data below it, which the
    # policy's opt-in lets into the code's window (it buys 1.8 MiB for 0.4 MiB).
    Recipe("clang-lld-now", cc="clang", ldflags=("-fuse-ld=lld", "-Wl,-z,now"), transform_opts=EXPOSE),
    Recipe("gcc-bfd-large", exe_funcs=7800, lib_funcs=1200),
    Recipe("gcc-bfd-small", exe_funcs=200, lib_funcs=200),
    Recipe("gcc-static-pie", static_pie=True, exe_funcs=5500, expect_mode="align"),
    Recipe("cxx-gcc-bfd", lang="cxx", cc="gcc"),
    Recipe("cxx-clang-lld", lang="cxx", cc="clang", ldflags=("-fuse-ld=lld",), transform_opts=EXPOSE),
    Recipe("cxx-gcc-gold", lang="cxx", cc="gcc", ldflags=("-fuse-ld=gold",)),
    # rustc links with its own rust-lld by default: rodata-first, 1.9 MiB of code and
    # 0.8 MiB of read-only data below it (with the opt-in).
    Recipe("rust-default", lang="rust", exe_funcs=5000, transform_opts=EXPOSE),
    Recipe("rust-bfd", lang="rust", exe_funcs=5000, ldflags=("-C", "link-arg=-fuse-ld=bfd")),
]


def _dw(name: str, *debug: str, cc: str = "gcc", lang: str = "c", opt: str = "-O2", **kw: object) -> Recipe:
    """A debug-info recipe: GNU ld, so the shift moves the DWARF; about 1.5 MiB of code."""
    fields: dict[str, object] = {
        "lang": lang,
        "cc": cc,
        "cflags": (opt,),
        "debug": debug,
        "exe_funcs": 1500,
        "lib_funcs": 600,
        "ldflags": ("-fuse-ld=bfd",) if lang != "rust" else ("-C", "link-arg=-fuse-ld=bfd"),
    }
    fields.update(kw)
    return Recipe(name, **fields)  # type: ignore[arg-type]


DWARF_RECIPES = [
    _dw("dw-gcc-O0-dwarf4", "-g", "-gdwarf-4", opt="-O0"),
    _dw("dw-gcc-O2-dwarf4", "-g", "-gdwarf-4"),
    _dw("dw-gcc-O2-dwarf5", "-g", "-gdwarf-5"),
    _dw("dw-gcc-O2-dwarf2", "-g", "-gdwarf-2"),
    _dw("dw-clang-O0-dwarf5", "-g", "-gdwarf-5", cc="clang", opt="-O0"),
    _dw("dw-clang-O2-dwarf4", "-g", "-gdwarf-4", cc="clang"),
    _dw("dw-cxx-gcc-O2-dwarf5", "-g", lang="cxx"),
    _dw("dw-cxx-clang-O2-dwarf5", "-g", lang="cxx", cc="clang"),
    _dw("dw-gcc-split-dwarf", "-g", "-gsplit-dwarf"),
    _dw("dw-clang-split-dwarf", "-g", "-gsplit-dwarf", cc="clang"),
    # -gz at link time makes ld compress the linked sections too.
    _dw("dw-gcc-gz-zlib", "-g", "-gz=zlib", ldflags=("-fuse-ld=bfd", "-gz=zlib")),
    # ld 2.44 writes plain .debug_* for -gz=zlib-gnu; objcopy still makes .zdebug_*.
    _dw("dw-gcc-zdebug", "-g", "-gz=zlib-gnu", ldflags=("-fuse-ld=bfd", "-gz=zlib-gnu"), compress_after="zlib-gnu"),
    _dw("dw-gcc-gz-zstd", "-g", compress_after="zstd"),
    _dw("dw-rust", "-g", lang="rust"),
    # lld's rodata-first layout (-z rosegment, its default), in C and in Rust.
    _dw("dw-clang-lld", "-g", cc="clang", ldflags=("-fuse-ld=lld",), transform_opts=EXPOSE),
    _dw("dw-rust-lld", "-g", lang="rust", ldflags=("-C", "link-arg=-fuse-ld=lld"), transform_opts=EXPOSE),
    # Many C++ units of libstdc++ templates (each about 1 MiB of .debug_info): four
    # prove what 32 did; the 50 MiB of debug sections are bench/dwarf_bench.py's
    # (BENCH_RECIPES).
    _dw("dw-cxx-heavy", "-g", lang="cxx", heavy_units=4),
]
A64, I686 = "aarch64-linux-gnu", "i686-linux-gnu"
CROSS_RECIPES = [
    # GNU ld on aarch64 puts code and metadata in one segment, 64 KiB aligned.
    CrossRecipe("a64-gcc-bfd", target=A64),
    CrossRecipe("a64-gcc-gold", target=A64, ldflags=("-fuse-ld=gold",)),
    CrossRecipe(
        "a64-clang-lld",
        target=A64,
        cc="clang",
        ldflags=("-fuse-ld=lld",),
        exe_funcs=4600,
        lib_funcs=4600,
        force_mode="shift",
    ),
    CrossRecipe("a64-cxx-gcc-bfd", target=A64, lang="cxx"),
    CrossRecipe("a64-gcc-now", target=A64, ldflags=("-Wl,-z,now",)),
    CrossRecipe("i686-gcc-bfd", target=I686),
    CrossRecipe("i686-gcc-now-relr", target=I686, ldflags=("-Wl,-z,now", "-Wl,-z,pack-relative-relocs")),
    # gold puts the code at the start of the first segment, where alignment alone
    # covers the code as well as a shift would: `auto` picks align, so force the shift.
    CrossRecipe("i686-gcc-gold", target=I686, ldflags=("-fuse-ld=gold",), force_mode="shift"),
    # cxx_lib.cc's unrolled<24> overflows a 32-bit long; -fwrapv keeps that defined.
    CrossRecipe("i686-cxx-gcc-bfd", target=I686, lang="cxx", cflags=("-O2", "-fwrapv")),
    # ld.bfd rejects clang's direct call to the program's own IFUNC on i386 ("unsupported
    # non-PIC call to IFUNC"); gold accepts it.
    CrossRecipe("i686-clang-gold", target=I686, cc="clang", ldflags=("-fuse-ld=gold",), force_mode="shift"),
]
CROSS_DWARF_RECIPES = [
    CrossRecipe("a64-dw-gcc-dwarf5", target=A64, debug=("-g",), exe_funcs=1500, lib_funcs=600),
    CrossRecipe("a64-dw-gcc-dwarf4", target=A64, debug=("-g", "-gdwarf-4"), exe_funcs=1500, lib_funcs=600),
    CrossRecipe("i686-dw-gcc-dwarf5", target=I686, debug=("-g",), exe_funcs=1500, lib_funcs=600),
    CrossRecipe("i686-dw-gcc-dwarf4", target=I686, debug=("-g", "-gdwarf-4"), exe_funcs=1500, lib_funcs=600),
    CrossRecipe(
        "i686-dw-clang-dwarf5",
        target=I686,
        cc="clang",
        debug=("-g",),
        ldflags=("-fuse-ld=gold",),
        exe_funcs=1500,
        lib_funcs=600,
    ),
]
#: Fedora-style builds with annobin notes: a program with just over 2 MiB of code and a
#: small library (the tests lower the threshold).
ANNOBIN_RECIPES = [
    Recipe("annobin-gcc-bfd", exe_funcs=2700, lib_funcs=300, annobin=True),
    CrossRecipe("annobin-i686-gcc-bfd", target=I686, exe_funcs=3000, lib_funcs=300, annobin=True),
]
RECIPES_ALL = RECIPES + DWARF_RECIPES + CROSS_RECIPES + CROSS_DWARF_RECIPES + ANNOBIN_RECIPES
#: For the benchmarks alone: bench/dwarf_bench.py's C++ program with 32 heavy units
#: (about 50 MiB of debug sections; 6 minutes of compiling on two busy cores).
BENCH_RECIPES = [_dw("dw-cxx-large", "-g", lang="cxx", heavy_units=32)]
BY_NAME = {r.name: r for r in RECIPES_ALL + BENCH_RECIPES}


def _tool_versions(r: Recipe) -> list[str]:
    tools = [["ld.bfd", "--version"], ["ld.gold", "--version"], ["ld.lld", "--version"]]
    tools.append(["rustc", "-V"] if r.lang == "rust" else [r.cc, "--version"])
    out = []
    for t in tools:
        try:
            out.append(subprocess.run(t, capture_output=True, text=True, check=False).stdout.splitlines()[0])
        except (OSError, IndexError):
            out.append(f"{t[0]}: missing")
    return out


def recipe_key(r: Recipe) -> str:
    fields = dataclasses.asdict(r)
    del fields["transform_opts"]  # how the tests transform, not how they build
    # Left out when off, so the recipes that predate the field keep their cached builds.
    if not r.annobin:
        del fields["annobin"]
    h = hashlib.sha256(json.dumps(fields, sort_keys=True).encode())
    sources = [p for p in sorted(PROGRAMS.iterdir()) if p.is_file()]
    for p in sources + ([ANNOBIN_NOTES] if r.annobin else []):
        h.update(p.name.encode() + p.read_bytes())
    h.update("\n".join(_tool_versions(r)).encode())
    h.update(str(BUILD_VERSION).encode() + GENERATOR.encode())
    return h.hexdigest()[:16]


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"fixture build failed: {' '.join(cmd)}\n{res.stdout}\n{res.stderr}")


def _parallel(cmds: list[list[str]], cwd: Path, env: dict[str, str] | None = None) -> None:
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for f in [pool.submit(_run, c, cwd, env) for c in cmds]:
            f.result()


def ccache_env(env: dict[str, str], base_dir: Path | None = None) -> dict[str, str]:
    """`env` for compiles that go through ccache, with its cache beside the fixtures.
    Recipes that differ only in how they link (gcc-bfd, gcc-gold, -z now, ...), and
    package builds that differ only in their packaging, compile the same sources with
    the same flags: this compiles them once. ccache hashes the compiler itself, the
    flags and the preprocessed source, so a hit is the object that compiler would
    have written. A package build gives its source's parent as `base_dir`:
    dpkg-buildflags' -ffile-prefix-map=DIR=. names the build directory on every compile
    line, and ccache hashes the paths under base_dir relative to the compile's
    directory, so that builds of the same source in different directories (the
    variants' and the installed add-on's, tests/test_packages.py) share their objects."""
    base = {"CCACHE_BASEDIR": str(base_dir)} if base_dir else {}
    return {**env, "CCACHE_DIR": str(cache_root() / "ccache"), "CCACHE_MAXSIZE": "4G", **base}


def _final(work: Path) -> Path:
    """Where a build directory ends up once complete (see `build`)."""
    return work.with_name(work.name.removeprefix(".").removesuffix(".tmp"))


def generate_code(
    prefix: str, count: int, files: int, work: Path, *, compiler: list[str], flags: list[str]
) -> list[str]:
    """tests/programs/gen_code.py's units of `count` functions in `files` files, one
    function in FULL_EVERY a switch function and the others padded to its size as
    `compiler` with `flags` (the code's: -O, -fPIC, ...) compiles it (code_padding);
    the names of the sources, the table unit last."""
    gen = [sys.executable, str(PROGRAMS / "gen_code.py"), "--padded", code_padding(compiler, flags, work)]
    _run([*gen, prefix, str(count), str(files), str(work)], work)
    return [f"{prefix}_gen{i}.c" for i in range(files)] + [f"{prefix}_table.c"]


def code_padding(compiler: list[str], flags: list[str], work: Path) -> str:
    """gen_code.py's --padded argument for a compiler and its code flags, measured by
    gen_code.py itself (--padding-for: the one probe a package's build uses too), its
    compile through ccache."""
    cmd = [sys.executable, str(PROGRAMS / "gen_code.py"), "--padding-for", shlex.join(["ccache", *compiler, *flags])]
    res = subprocess.run(cmd, cwd=work, env=ccache_env(dict(os.environ)), capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"fixture build failed: {' '.join(cmd)}\n{res.stdout}\n{res.stderr}")
    return res.stdout.strip()


def _compile_objects(r: Recipe, sources: list[str], pic: str, work: Path) -> list[str]:
    flags = [*r.cflags, *r.debug, pic, "-DWITH_SDT", *(["-DSTATIC"] if r.static_pie else [])]
    sdt = _sdt_headers(work) if r.triple else None
    if r.debug:
        # Debug info names the final directory, so split-DWARF .dwo files are found there.
        flags.append(f"-fdebug-prefix-map={work}={_final(work)}")
        flags += [f"-I{sdt}"] if sdt else []
    elif sdt:
        # Without debug info no path reaches the objects: the same command in every
        # recipe, so that ccache shares them.
        flags.append(f"-I{sdt.relative_to(work)}")
    cmds, objs = [], []
    for s in sources:
        obj = f"{Path(s).stem}.{pic.strip('-')}.o"
        out = ["-S", "-o", f"{obj}.s"] if r.annobin else ["-c", "-o", obj]
        cmds.append(["ccache", *r.compiler(cxx=not s.endswith(".c")), *flags, s, *out])
        objs.append(obj)
    _parallel(cmds, work, ccache_env(dict(os.environ)))
    if r.annobin:
        bits = 32 if r.triple == I686 else 64
        for obj in objs:
            (work / f"{obj}.n.s").write_text(annotate((work / f"{obj}.s").read_text(), bits))
        _parallel([[*r.compiler(cxx=False), "-c", f"{obj}.n.s", "-o", obj] for obj in objs], work)
    return objs


def _build_c_family(r: Recipe, work: Path) -> None:
    for p in ("main.c", "lib.c", "cxx_main.cc", "cxx_lib.cc"):
        shutil.copy(PROGRAMS / p, work / p)
    files = max(2, r.exe_funcs // 1000)
    cc = r.compiler(cxx=False)  # the generated units are C
    exe_src = generate_code("exe", r.exe_funcs, files, work, compiler=cc, flags=[*r.cflags, "-fPIE"])
    cxx = r.lang == "cxx"
    driver = r.compiler(cxx)
    main_src = "cxx_main.cc" if cxx else "main.c"
    if r.static_pie:
        objs = _compile_objects(r, [*exe_src, main_src], "-fPIE", work)
        # A static program has no library: main.c's library calls come from lib.c.
        lib_src = generate_code("lib", r.lib_funcs, 2, work, compiler=cc, flags=[*r.cflags, "-fPIE"])
        objs += _compile_objects(r, [*lib_src, "lib.c"], "-fPIE", work)
        _run([*driver, "-static-pie", *r.ldflags, "-o", "prog", *objs, "-lpthread"], work)
        return
    lib_src = [
        *generate_code("lib", r.lib_funcs, max(2, r.lib_funcs // 1000), work, compiler=cc, flags=[*r.cflags, "-fPIC"]),
        "cxx_lib.cc" if cxx else "lib.c",
    ]
    lib_objs = _compile_objects(r, lib_src, "-fPIC", work)
    _run([*driver, "-shared", "-Wl,-soname,libhug.so", *r.ldflags, "-o", "libhug.so", *lib_objs], work)
    exe_objs = _compile_objects(r, [*exe_src, main_src, *_heavy_units(r, work)], "-fPIE", work)
    link = [*driver, "-pie", *r.ldflags, "-o", "prog", *exe_objs, "-L.", "-lhug", "-Wl,-rpath,$ORIGIN"]
    _run([*link, "-ldl", "-lpthread"], work)
    if r.compress_after:
        for f in ("prog", "libhug.so"):
            _run(["objcopy", f"--compress-debug-sections={r.compress_after}", f], work)


def _sdt_headers(work: Path) -> Path:
    """<sys/sdt.h> is architecture-neutral but only installed for the build machine."""
    inc = work / "sdt-include"
    if not inc.is_dir():
        (inc / "sys").mkdir(parents=True)
        for h in ("sdt.h", "sdt-config.h"):
            shutil.copy(f"/usr/include/x86_64-linux-gnu/sys/{h}", inc / "sys" / h)
    return inc


def _heavy_units(r: Recipe, work: Path) -> list[str]:
    template = (PROGRAMS / "heavy.cc.in").read_text()
    names = []
    for n in range(r.heavy_units):
        (work / f"heavy{n}.cc").write_text(template.replace("@N@", str(n)))
        names.append(f"heavy{n}.cc")
    return names


def _build_rust(r: Recipe, work: Path) -> None:
    _run([sys.executable, str(PROGRAMS / "gen_rust.py"), str(r.exe_funcs), str(work / "main.rs")], work)
    debug = ["-C", "debuginfo=0"]
    if r.debug:
        debug = ["-C", "debuginfo=2", f"--remap-path-prefix={work}={_final(work)}"]
    rustc = ["rustc", "--edition", "2021", "-C", "opt-level=2", *debug, *r.ldflags]
    _run([*rustc, "main.rs", "-o", "prog"], work)


def debian_packages(name: str, packages: list[str]) -> Path:
    """The archive's current versions of the packages, fetched with apt-get download
    and unpacked with dpkg-deb into one tree under the test cache. The tree is keyed
    by the .deb file names, so an archive update unpacks a fresh one."""
    cache = cache_root() / name
    with locked(cache_root() / f"{name}.lock"):
        cache.mkdir(parents=True, exist_ok=True)
        uris = subprocess.run(
            ["apt-get", "download", "--print-uris", *packages], capture_output=True, text=True, check=True
        ).stdout
        debs = sorted(line.split()[1] for line in uris.splitlines())
        key = hashlib.sha256("\n".join(debs).encode()).hexdigest()[:16]
        root = cache / f"root-{key}"
        note_used(root)
        if root.is_dir():
            return root
        for stale in cache.iterdir():
            if stale.is_dir():
                shutil.rmtree(stale)
            elif stale.name not in debs:
                stale.unlink()
        with building(root, stale=False) as work:  # the older roots went above
            subprocess.run(["apt-get", "download", *packages], cwd=cache, check=True, capture_output=True)
            for deb in debs:
                subprocess.run(["dpkg-deb", "-x", str(cache / deb), str(work)], check=True)
    return root


#: How the iTLB-bound program is built: position-independent, one function per 4 KiB page.
ITLB_CFLAGS = ("-O1", "-fPIE", "-pie", "-falign-functions=4096")


def itlb_program(functions: int, seed: int = 1) -> str:
    """A program of `functions` small functions, to be built with
    -falign-functions=4096 (ITLB_CFLAGS) so that they are 4 KiB apart, called in a
    shuffled order ARGV[1] times over: each call lands on another 4 KiB page, so with
    small pages nearly every call misses the iTLB. The calls are direct (predicted
    branches): beyond the calls themselves, the run costs fetching code from a new page
    each time. The upper bound of what huge code pages give (bench/speedup.py's
    `itlb` workload, the gain `hugify try` must show)."""
    order = list(range(functions))
    random.Random(seed).shuffle(order)
    out = ["#include <stdio.h>", "#include <stdlib.h>"]
    out += [
        f"__attribute__((noinline)) long f{i}(long x) {{ return x * {2 * i + 3} + {i}; }}" for i in range(functions)
    ]
    out.append("__attribute__((noinline)) long chain(long x) {")
    out += [f"    x = f{i}(x) & 0xffffff;" for i in order]
    out.append("    return x;\n}")
    out.append(
        "int main(int argc, char **argv) {\n"
        "    long rounds = argc > 1 ? atol(argv[1]) : 1, x = 1;\n"
        "    for (long r = 0; r < rounds; r++) x = chain(x);\n"
        '    printf("%ld\\n", x);\n    return 0;\n}'
    )
    return "\n".join(out) + "\n"


def build_itlb(functions: int) -> Path:
    """The iTLB-bound program of `functions` functions (ITLB_CFLAGS, gcc), built on
    first use and cached like the recipes: the file ``itlb`` in the directory returned."""
    source = itlb_program(functions)
    gcc = subprocess.run(["gcc", "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    key = hashlib.sha256(f"{BUILD_VERSION}{source}{ITLB_CFLAGS}{gcc}".encode()).hexdigest()[:16]

    def make(work: Path) -> None:
        (work / "itlb.c").write_text(source)
        _run(["gcc", *ITLB_CFLAGS, "-o", "itlb", "itlb.c"], work)

    return cached(f"itlb{functions}", key, make)


def cached_dir(name: str, key_text: str, make: Callable[[Path], None]) -> Path:
    """A directory that `make(work)` fills once, cached as NAME-KEY: KEY hashes
    `key_text` (what `make` builds from) and the compilers' and linkers' versions."""
    tools = _tool_versions(Recipe(name, cc="clang")) + _tool_versions(Recipe(name))
    key = hashlib.sha256("\n".join([key_text, *tools, str(BUILD_VERSION)]).encode()).hexdigest()[:16]
    return cached(name, key, make)


def build(r: Recipe) -> Path:
    """The directory holding the recipe's programs, built on first use."""

    def make(work: Path) -> None:
        if r.lang == "rust":
            _build_rust(r, work)
        else:
            _build_c_family(r, work)
        for junk in work.iterdir():
            if junk.is_dir():
                shutil.rmtree(junk)
            elif junk.name not in ("prog", "libhug.so") and junk.suffix != ".dwo":
                junk.unlink()

    return cached(r.name, recipe_key(r), make)


#: A C++ program that exercises libstdc++ (containers, regex, exceptions, threads)
#: and prints what it did: the workload for rewritten real libraries.
CXX_WORKLOAD = r"""
#include <iostream>
#include <map>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>
int main() {
    std::map<std::string, int> m{{"one", 1}, {"two", 2}};
    std::ostringstream out;
    for (auto &[k, v] : m) out << k << '=' << v << ' ';
    std::regex re("([a-z]+)=([0-9])");
    int matches = 0;
    std::string s = out.str();
    for (auto it = std::sregex_iterator(s.begin(), s.end(), re); it != std::sregex_iterator(); ++it)
        matches++;
    try { throw std::runtime_error("thrown"); } catch (const std::exception &e) { out << e.what(); }
    int t = 0;
    std::thread([&] { t = 42; }).join();
    std::cout << out.str() << " matches=" << matches << " thread=" << t << std::endl;
}
"""


class Case:
    """One recipe: the original files and their transformed copies (with their reports)."""

    def __init__(self, recipe: Recipe, orig: Path, new: Path, reports: dict[str, dict[str, Any]]) -> None:
        self.recipe, self.orig, self.new, self.reports = recipe, orig, new, reports

    @property
    def files(self) -> list[str]:
        return list(self.reports)

    def dv(self, name: str) -> int:
        return int(self.reports[name]["result"]["dv"])


_cases: dict[str, Case] = {}


def case_for(recipe: Recipe, tmp_path_factory: pytest.TempPathFactory) -> Case:
    """Builds (cached) and transforms a recipe once per test session, with the
    recipe's transform options. Split-DWARF .dwo files stay beside the originals;
    the skeletons name that directory."""
    if recipe.name not in _cases:
        orig = build(recipe)
        new = tmp_path_factory.mktemp(recipe.name)
        names = ["prog", "libhug.so"] if recipe.has_lib else ["prog"]
        reports = {n: transform(orig / n, new / n, *recipe.transform_args) for n in names}
        _cases[recipe.name] = Case(recipe, orig, new, reports)
    return _cases[recipe.name]


if __name__ == "__main__":
    names = sys.argv[1:] or [r.name for r in RECIPES_ALL]
    for n in names:
        print(n, build(BY_NAME[n]), flush=True)
