"""hugify tree --jobs 2 vs find-debuginfo -j2 over the same build root, in one run.

The build root holds several large ELF files built with -g, as a package build
leaves them after %install: two programs and two shared libraries with 1.1-1.5 MiB
of code each, built with -O2 -g as distributions do, plus small programs hugify
skips. The tree is built once and cached (like the test programs). Each
repetition starts from a fresh copy of the tree (not timed). find-debuginfo gets
the options rpm 4.18's %__debug_install_post passes it. Both run against the same
tree and in the same run, interleaved. Target (issue #5): hugify's wall time under
50 % of find-debuginfo's. With --baseline, hugify from another checkout runs in the
same rounds, for a no-slowdown check of a change (this/baseline per round).

usage: tools/bench tree_bench [--repeat N] [--baseline CHECKOUT]
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from testkit import REPO
from testkit.bench import Sample, add_baseline_option, installed_env, median_wall, parser, run, with_baseline
from testkit.cache import cache_root
from testkit.cli import command

GEN = REPO / "tests" / "programs" / "gen_code.py"
#: What distributions build with (rpm's %optflags, Debian's CFLAGS): -O2 -g.
CFLAGS = ["-O2", "-g"]
#: (name, generated functions, shared library?): 1.1-1.5 MiB of code each.
LARGE = [("exea", 1800, False), ("exeb", 1400, False), ("liba", 1600, True), ("libb", 1400, True)]


def compile_set(build: Path, prefix: str, funcs: int, shared: bool) -> Path:
    """A program or library of generated code with debug info, compiled in `build`."""
    d = build / prefix
    d.mkdir(parents=True)
    subprocess.run(["python3", str(GEN), prefix, str(funcs), "4", str(d)], check=True)
    sources = sorted(d.glob(f"{prefix}_*.c"))
    pic = "-fPIC" if shared else "-fPIE"
    objs = [str(c.with_suffix(".o")) for c in sources]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        jobs = [
            pool.submit(subprocess.run, ["gcc", *CFLAGS, pic, "-c", c.name, "-o", o], cwd=d, check=True)
            for c, o in zip(sources, objs, strict=True)
        ]
        for f in jobs:
            f.result()
    if shared:
        out = d / f"lib{prefix}.so"
        subprocess.run(["gcc", *CFLAGS, "-shared", "-o", str(out), *objs], cwd=d, check=True)
    else:
        (d / "main.c").write_text(
            f"#include <stdio.h>\nextern long {prefix}_dispatch(long);\n"
            f'int main(int c, char **v) {{ printf("%ld\\n", {prefix}_dispatch(c)); return 0; }}\n'
        )
        out = d / prefix
        subprocess.run(["gcc", *CFLAGS, "-fPIE", "-pie", "-o", str(out), *objs, "main.c"], cwd=d, check=True)
    return out


def pristine() -> Path:
    """What rpmbuild has after %install, built once and cached like the test programs:
    BUILD/bench-1.0 (sources and objects, whose paths the debug info names, so
    find-debuginfo rewrites them and copies the sources, as in a real build) and
    BUILDROOT."""
    key = hashlib.sha256(GEN.read_bytes() + repr((LARGE, CFLAGS)).encode())
    key.update(subprocess.run(["gcc", "--version"], capture_output=True, check=True).stdout)
    top = cache_root() / f"tree-bench-{key.hexdigest()[:16]}"
    if (top / "BUILDROOT").is_dir():
        return top
    shutil.rmtree(top, ignore_errors=True)
    build = top / "BUILD" / "bench-1.0"
    staging = top / "staging"
    for sub in ("usr/bin", "usr/lib64"):
        (staging / sub).mkdir(parents=True)
    for spec in LARGE:
        f = compile_set(build, *spec)
        dest = staging / ("usr/lib64" if spec[2] else "usr/bin") / f.name
        shutil.copy2(f, dest)
        os.chmod(dest, 0o755)  # find-debuginfo only looks at executable files
    (build / "small.c").write_text("int main(void) { return 0; }\n")
    for name in ("tool1", "tool2", "tool3"):  # small files hugify skips
        subprocess.run(["gcc", *CFLAGS, "-o", str(staging / "usr/bin" / name), "small.c"], cwd=build, check=True)
    staging.rename(top / "BUILDROOT")
    return top


def main() -> None:
    ap = parser(__file__, description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    add_baseline_option(ap)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        top = pristine()
        files = sorted(p for p in (top / "BUILDROOT").rglob("*") if p.is_file())
        total = sum(p.stat().st_size for p in files)
        print(f"build root: {len(files)} ELF files, {total / 2**20:.1f} MiB (4 large, -O2 -g)", flush=True)
        tree = Path(d) / "BUILDROOT"
        builddir = top / "BUILD" / "bench-1.0"

        def fresh() -> None:
            shutil.rmtree(tree, ignore_errors=True)
            shutil.copytree(top / "BUILDROOT", tree, symlinks=True)
            for lst in builddir.glob("*.list"):  # what find-debuginfo wrote last time
                lst.unlink()

        env = {
            **installed_env(),
            "HUGIFY_POLICY_PATH": str(REPO / "policy" / "policy.toml"),
            "RPM_BUILD_ROOT": str(tree),
            "RPM_BUILD_DIR": str(top / "BUILD"),
            "RPM_PACKAGE_NAME": "bench",
            "RPM_PACKAGE_VERSION": "1.0",
            "RPM_PACKAGE_RELEASE": "1",
            "RPM_ARCH": "x86_64",
        }
        find_debuginfo = [
            "/usr/bin/find-debuginfo",
            "-j2",
            "--build-id-seed",
            "1.0-1",
            "--unique-debug-suffix",
            "-1.0-1.x86_64",
            "--unique-debug-src-base",
            "bench-1.0-1.x86_64",
            builddir,
        ]
        # Both really do their work on this tree (not timed).
        fresh()
        run(find_debuginfo, env=env)
        debug_files = list((tree / "usr/lib/debug").rglob("*.debug"))
        sources = list((tree / "usr/src/debug").rglob("*.c"))
        assert len(debug_files) == len(files) and sources, "find-debuginfo did not process the tree"
        fresh()
        run(command("tree", tree, "--no-progress", "--report", Path(d) / "r.json"), env=env)
        done = json.loads((Path(d) / "r.json").read_text())["summary"]
        assert done["transformed"] == len(LARGE), done
        print(
            f"find-debuginfo: {len(debug_files)} debug files, {len(sources)} sources; "
            f"hugify: {done['transformed']} transformed, {done['skipped']} skipped",
            flush=True,
        )
        tree_cmd = command("tree", tree, "--jobs", "2", "--no-progress")
        contenders = {
            "find-debuginfo -j2": lambda: run(find_debuginfo, env=env),
            "hugify tree --jobs 2": lambda: run(tree_cmd, env=env),
        }

        def from_checkout(checkout: Path) -> Sample:
            """The baseline's hugify tree, with the baseline's policy."""
            old_env = {**env, "HUGIFY_POLICY_PATH": str(checkout / "policy" / "policy.toml")}
            return run(tree_cmd, env=old_env, cwd=checkout)

        results = with_baseline(
            "one package's build root",
            contenders,
            "find-debuginfo -j2",
            repeat=args.repeat,
            prepare=fresh,
            baseline=args.baseline,
            ours="hugify tree --jobs 2",
            run_from=from_checkout,
        )
        ratio = median_wall(results["hugify tree --jobs 2"]) / median_wall(results["find-debuginfo -j2"])
        verdict = "ok" if ratio < 0.5 else "MISSED"
        print(f"RESULT hugify tree = {ratio * 100:.0f}% of find-debuginfo's wall time (target < 50%): {verdict}")


if __name__ == "__main__":
    main()
