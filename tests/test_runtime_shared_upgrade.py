"""Shared copies under package upgrades and removal (issue 31 item 4), with real dpkg
installing into a throwaway root with its own database (never this machine's), on a
tmpfs without huge pages (the engine finds file-backed huge pages `unsupported`: root
copies the files). After each dpkg run the package trigger's helper runs as dpkg runs it
(systemd/hugify-prefetch-trigger, without systemctl: `hugify prefetch --all`).

- An upgrade renames the new version over the library's path: a process started right
  after it (before the trigger) maps the new inode, for which root keeps no copy, and
  runs on its file mapping (`no-copy`) with the new version's output; a process started
  before it runs on from the old copy with the old output; the trigger drops the old
  copy and makes the new one, which the next process maps. A removal makes the copies
  unused and the trigger drops them.
- Starts in a loop during upgrades and downgrades with the trigger between them: every
  start prints exactly one version's output, none crashes, and every start that mapped a
  copy mapped the copy of the version it printed (nothing stale is served).

The windows each object has are counted from readelf's program headers of the built
files (testkit.shared.nwin), never taken from the runtime under test. The library gets
code for two whole windows (the shift keeps lld's read-only data out of the executable
segment, and the window next to it stays partial: README.md), so that a start is seen to
map all of its windows from one copy, not some of them.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections import Counter
from dataclasses import replace
from pathlib import Path

from hugify import shared
from testkit import HP
from testkit.cli import write_launcher
from testkit.debian import build_deb, dpkg_root
from testkit.runtime import (
    AUDIT_LIB,
    HUGIFY_RUN,
    LLD_LAYOUTS,
    REPO,
    build_programs,
    build_runtime,
    exec_segment_size,
    run_checked,
    starts_during,
)
from testkit.shared import mount_tmpfs, nwin, shared_lines, unmount

LIBDIR = "usr/lib/hugify-shared-upgrade-test"
TRIGGER = REPO / "systemd" / "hugify-prefetch-trigger"
MAIN = r"""
#include <stdio.h>
#include <unistd.h>
long lib_all(long);
int main(int argc, char **argv) {
    if (argc > 1) { printf("waiting\n"); fflush(stdout); char c; if (read(0, &c, 1) < 0) return 2; }
    printf("result %ld\n", exe_all(1) + lib_all(2));
    return 0;
}
"""
STARTS = 200
UPGRADES = 12


class World:
    """The throwaway root on its tmpfs, the two library versions' packages, the runtime
    directory, and the trigger's environment."""

    def __init__(self, tmp_path: Path) -> None:
        build_runtime()
        # 270 functions of 16 KiB (4.2 MiB) in the library: two whole windows and a partial
        # one (the layout's 160, 2.5 MiB, fill only one).
        layout = replace(LLD_LAYOUTS[0], funcs=(LLD_LAYOUTS[0].funcs[0], 270, LLD_LAYOUTS[0].funcs[2]))
        one = build_programs(tmp_path / "one", layout, main=MAIN)
        two = build_programs(tmp_path / "two", layout, main=MAIN, factor=5)
        # Whole windows of each object as readelf finds them (the same in both versions).
        self.prog_windows, self.lib_windows = nwin(one.prog), nwin(one.lib)
        assert (nwin(two.prog), nwin(two.lib)) == (self.prog_windows, self.lib_windows)
        assert self.prog_windows >= 1 and self.lib_windows >= 2, (self.prog_windows, self.lib_windows)
        debs = tmp_path / "debs"
        debs.mkdir()
        self.prog_deb = build_deb(debs, "hugify-shared-prog", "1.0", {f"{LIBDIR}/prog": one.prog})
        self.lib_debs = [
            build_deb(debs, "hugify-shared-lib", v, {f"{LIBDIR}/libbig.so": p.lib}) for v, p in (("1", one), ("2", two))
        ]
        self.root, self.run = tmp_path / "root", tmp_path / "run"
        mount_tmpfs(self.root, "size=128M,mode=0755")
        self.run.mkdir(mode=0o755)
        self.dpkg = dpkg_root(self.root)
        self.prog, self.lib = self.root / LIBDIR / "prog", self.root / LIBDIR / "libbig.so"
        mdir = tmp_path / "manifest.d"
        mdir.mkdir()
        # What dh_hugify would install (docs/manifest.md): each file with its executable
        # segment (the same in both versions: only the code's constants differ).
        lines = [
            f"{f}\t-\t{HP:#x}\t{exec_segment_size(built):#x}\t{HP:#x}"
            for f, built in ((self.prog, one.prog), (self.lib, one.lib))
        ]
        (mdir / "hugify-shared-test.list").write_text("# hugify manifest v1\n" + "\n".join(lines) + "\n")
        launcher = write_launcher(tmp_path / "hugify")
        tools = tmp_path / "tools"  # no systemctl: the helper runs the prefetch itself
        tools.mkdir()
        for t in ("sh", "cat", "grep", "xargs", "nice"):
            (tools / t).symlink_to(
                subprocess.run(["which", t], capture_output=True, text=True, check=True).stdout.strip()
            )
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HUGIFY_"))}
        self.trigger_env = clean | {
            "PATH": str(tools),
            "HUGIFY": str(launcher),
            "HUGIFY_MANIFEST_DIR": str(mdir),
            "HUGIFY_RUNTIME_DIR": str(self.run),
        }
        self.env = clean | {"HUGIFY_RUNTIME_DIR": str(self.run), "HUGIFY_DEBUG": "1", "LD_AUDIT": str(AUDIT_LIB)}

    def install(self, *debs: Path) -> None:
        for deb in debs:
            run_checked([*self.dpkg, "-i", str(deb)])

    def remove(self, *packages: str) -> None:
        run_checked([*self.dpkg, "-r", *packages])

    def trigger(self) -> str:
        """The package trigger, as dpkg runs it after unpacking or removing a manifest's files."""
        res = subprocess.run([TRIGGER], capture_output=True, text=True, env=self.trigger_env, check=False)
        assert res.returncode == 0, res.stderr
        return res.stderr

    def copies(self) -> dict[str, shared.Record]:
        store = self.run / "shared"
        out = {}
        for d in store.iterdir() if store.is_dir() else ():
            rec = shared.Record.parse((d / "record").read_text())
            assert rec is not None
            out[rec.key] = rec
        return out

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(self.prog), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )

    def close(self) -> None:
        unmount(self.run / "shared")
        unmount(self.root)


def key_of(path: Path) -> str:
    """The key root files a copy of `path` under: the mapping's device and inode."""
    from hugify.engine import Engine
    from hugify.kernel import pmd_size

    fd = os.open(path, os.O_RDONLY)
    try:
        ident = Engine(pmd_size(), None).file_id(fd)
    finally:
        os.close(fd)
    assert ident is not None
    return shared.key_of(ident)


def test_an_upgrade_and_a_removal_leave_nothing_stale(tmp_path: Path):
    w = World(tmp_path)
    try:
        w.install(w.lib_debs[0], w.prog_deb)
        w.trigger()
        outputs = {}
        old_key = key_of(w.lib)
        assert old_key in w.copies() and key_of(w.prog) in w.copies()
        old = w.start("wait")  # holds version 1's copy mapped
        assert old.stdout is not None and old.stdout.readline() == "waiting\n"
        w.install(w.lib_debs[1])  # renames version 2 over the path
        new_key = key_of(w.lib)
        assert new_key != old_key
        first = w.start()
        out, err = first.communicate(timeout=120)
        lines = shared_lines(err)
        assert lines[str(w.lib)] == (0, w.lib_windows, ", window 0 no-copy: file mapping kept"), err
        # the program did not change: its copy serves
        assert lines[str(w.prog)][:2] == (w.prog_windows, w.prog_windows), err
        outputs["2"] = out
        said = w.trigger()
        copies = w.copies()
        assert old_key not in copies and new_key in copies, (copies, said)
        assert str(w.lib) in said  # "shared copies dropped ...: PATH"
        later = w.start()
        out2, err2 = later.communicate(timeout=120)
        assert out2 == outputs["2"] and shared_lines(err2)[str(w.lib)] == (
            w.lib_windows,
            w.lib_windows,
            f" from {w.run}/shared/{new_key}/libbig.so",
        )
        # The process started before the upgrade ran on from the removed copy.
        # (moved out of the runtime's way before its removal: .old-KEY-PID)
        maps = Path(f"/proc/{old.pid}/maps").read_text().splitlines()
        assert any(re.search(rf"/shared/(\.old-)?{old_key}(-\d+)?/libbig\.so \(deleted\)$", line) for line in maps), (
            maps
        )
        out1, _ = old.communicate("go\n", timeout=120)
        assert old.returncode == 0 and out1 != out2 and out1.startswith("result "), (out1, out2)
        # Removal: the copies are unused at once (no file, no process) and the trigger
        # drops them.
        w.remove("hugify-shared-prog", "hugify-shared-lib")
        w.trigger()
        assert w.copies() == {}
    finally:
        w.close()


def test_starts_during_upgrades_map_only_their_own_version_s_copy(tmp_path: Path):
    """STARTS starts (through the audit library and hugify-run) during UPGRADES upgrades
    and downgrades, with the trigger after each."""
    w = World(tmp_path)
    try:
        w.install(w.lib_debs[0], w.prog_deb)
        outputs: dict[str, str] = {}
        keys: dict[str, str] = {}  # the library's copy's key -> the version
        for i, deb in enumerate(w.lib_debs):
            w.install(deb)
            w.trigger()
            res = subprocess.run([str(w.prog)], capture_output=True, text=True, env=w.env, check=True)
            outputs[res.stdout] = str(i + 1)
            keys[key_of(w.lib)] = str(i + 1)
        assert len(outputs) == 2
        upgrades = 0
        trigger_errors: list[str] = []

        def upgrade(i: int) -> None:
            nonlocal upgrades
            deb = w.lib_debs[i % 2]
            w.install(deb)
            keys[key_of(w.lib)] = "1" if deb == w.lib_debs[0] else "2"
            upgrades += 1
            err = w.trigger()
            if "Traceback" in err:
                trigger_errors.append(err)

        seen: Counter[str] = Counter()
        wrong: list[str] = []
        from_copies = 0
        n = w.lib_windows
        mapped = re.compile(
            rf"^hugify-audit: shared {re.escape(str(w.lib))}: {n}/{n} windows mapped from \S+/shared/([\d:]+)/", re.M
        )

        def start(i: int) -> None:
            nonlocal from_copies
            argv = [str(w.prog)] if i % 2 else [str(HUGIFY_RUN), str(w.prog)]
            res = subprocess.run(argv, capture_output=True, text=True, env=w.env, check=False, timeout=120)
            version = outputs.get(res.stdout)
            if res.returncode != 0 or version is None:
                wrong.append(f"start {i + 1}: exit {res.returncode}, output {res.stdout!r}\n{res.stderr[-1500:]}")
                return
            seen[version] += 1
            m = mapped.search(res.stderr)
            if m:
                from_copies += 1
                if keys.get(m[1]) != version:
                    wrong.append(
                        f"start {i + 1}: printed version {version}, mapped the copy {m[1]} of {keys.get(m[1])}"
                    )

        starts = starts_during(start, STARTS, upgrade, UPGRADES)
        print(
            f"\nshared copies under upgrades: {starts} starts ({seen['1']} version 1, {seen['2']} version 2) during "
            f"{upgrades} upgrades and downgrades with dpkg and the trigger after each; {from_copies} mapped the "
            f"library from a copy; {len(wrong)} wrong"
        )
        assert not wrong, "\n".join(wrong[:5])
        assert not trigger_errors, trigger_errors[0]
        assert seen["1"] and seen["2"] and from_copies > 0
    finally:
        w.close()
