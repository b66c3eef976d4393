"""`hugify tree` on a constructed build root: selection by content, what it keeps
(modes, setuid/setgid, owner, times, xattrs incl. security.capability, hardlinks,
symlinks), what it never touches (non-ELF files, debug files), failures that do not
stop the others, SOURCE_DATE_EPOCH, parallelism and determinism, the policy's
effect, the manifest, the report and the log."""

from __future__ import annotations

import json
import os
import pty
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from hugify import manifest
from testkit import HP
from testkit.cli import command, hugify, run_program
from testkit.elf import bits_differing, readelf_build_id, readelf_loads
from testkit.recipes import BY_NAME, build

MTIME = 1_600_000_000  # 2020-09-13, what the "build" gave every file
BIG = "usr/bin/prog"
HARD = ("usr/bin/prog-hardlink", "usr/sbin/prog-hardlink")
SUID, SGID, CAPPED, XATTR = "usr/bin/suid", "usr/bin/sgid", "usr/bin/ping-like", "usr/bin/xattr"
OWNED = "usr/libexec/owned"
LIB = "usr/lib64/libhug.so"  # 0644, as Debian installs libraries
SMALL = "usr/bin/small"
FAKE_SO = "usr/lib64/libfake.so"  # not ELF
BROKEN = "usr/lib64/libbroken.so"  # ELF header, truncated
DEBUG = "usr/lib/debug/usr/bin/prog.debug"
SYMLINKS = {"usr/bin/prog-symlink": "prog", "usr/lib64/libhug.so.1": "libhug.so", "usr/bin/dangling": "nowhere"}
TRANSFORMED = [BIG, *HARD, SUID, SGID, CAPPED, XATTR, OWNED, LIB]


@dataclass
class Tree:
    root: Path
    originals: dict[str, bytes]

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
        return {**env, "HUGIFY_POLICY_PATH": "", **extra}

    def run(self, *args: str | Path, check: bool = False, **env: str) -> subprocess.CompletedProcess[str]:
        return hugify("tree", self.root, "--no-progress", *args, check=check, env=self.env(**env))


@pytest.fixture(scope="module")
def programs() -> tuple[Path, Path]:
    return build(BY_NAME["gcc-bfd"]), build(BY_NAME["gcc-bfd-small"])


def make_tree(root: Path, programs: tuple[Path, Path]) -> Tree:
    big, small = programs
    for d in ("usr/bin", "usr/sbin", "usr/libexec", "usr/lib64", "usr/lib/debug/usr/bin"):
        (root / d).mkdir(parents=True, exist_ok=True)
    files = {
        BIG: (big / "prog", 0o755),
        SUID: (big / "prog", 0o4755),
        SGID: (big / "prog", 0o2755),
        CAPPED: (big / "prog", 0o755),
        XATTR: (big / "prog", 0o750),
        OWNED: (big / "prog", 0o700),
        LIB: (big / "libhug.so", 0o644),
        SMALL: (small / "prog", 0o755),
        DEBUG: (big / "prog", 0o644),
    }
    for rel, (src, mode) in files.items():
        shutil.copyfile(src, root / rel)
        os.chown(root / rel, 0, 0)
        os.chmod(root / rel, mode)
    for h in HARD:
        os.link(root / BIG, root / h)
    os.chown(root / OWNED, 1234, 5678)
    os.chmod(root / OWNED, 0o700)  # chown may clear bits; set again
    (root / FAKE_SO).write_text("INPUT(-lfoo)\n")  # a linker script named .so
    (root / BROKEN).write_bytes((big / "libhug.so").read_bytes()[:3000])
    subprocess.run(["setcap", "cap_net_raw+ep", str(root / CAPPED)], check=True)
    os.setxattr(root / XATTR, "user.hugify-test", b"kept")
    for link, target in SYMLINKS.items():
        os.symlink(target, root / link)
    for p in root.rglob("*"):
        os.utime(p, (MTIME, MTIME), follow_symlinks=False)
    originals = {
        str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()
    }
    return Tree(root, originals)


@pytest.fixture
def tree(tmp_path: Path, programs: tuple[Path, Path]) -> Tree:
    return make_tree(tmp_path / "root", programs)


def report_of(tree: Tree, *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tree.root.parent / "report.json"
    res = tree.run("--report", out, *args, **env)
    return res, json.loads(out.read_text())


def statuses(report: dict) -> dict[str, tuple[str, str | None]]:
    return {f["path"]: (f["status"], f["reason"]) for f in report["files"]}


def exec_aligned(path: Path) -> bool:
    (x,) = [seg for seg in readelf_loads(path) if "E" in seg.flags]
    return x.offset % HP == 0 and x.vaddr % HP == 0 and x.align == HP


# --- selection and outcomes -------------------------------------------------------------


def test_selects_elf_by_content_and_reports_every_elf_file(tree: Tree) -> None:
    res, report = report_of(tree, "--manifest", tree.root.parent / "m.list")
    assert res.returncode == 0, res.stderr
    got = statuses(report)
    assert got == {
        "/" + BIG: ("transformed", None),
        "/" + CAPPED: ("transformed", None),
        "/" + SGID: ("transformed", None),
        "/" + SUID: ("transformed", None),
        "/" + XATTR: ("transformed", None),
        "/" + OWNED: ("transformed", None),
        "/" + LIB: ("transformed", None),
        "/" + SMALL: ("skipped", "below-threshold"),
        "/" + BROKEN: ("failed", "truncated"),
    }
    # One entry per inode, all its names listed.
    (big,) = [f for f in report["files"] if f["path"] == "/" + BIG]
    assert big["paths"] == ["/" + BIG, "/" + HARD[0], "/" + HARD[1]]
    assert big["mode"] == "shift" and big["coverage"] > 0.99 and big["build_id"] != big["build_id_before"]
    for rel in TRANSFORMED:
        assert exec_aligned(tree.root / rel), rel


def test_files_hugify_does_not_transform_stay_byte_identical(tree: Tree) -> None:
    tree.run()
    for rel in (SMALL, FAKE_SO, BROKEN, DEBUG):
        assert (tree.root / rel).read_bytes() == tree.originals[rel], rel
    assert not list(tree.root.rglob(".*hugify-*")), "a temporary file was left behind"


def test_log_says_per_file_what_happened_and_sums_up(tree: Tree) -> None:
    out = tree.run("--package", "demo").stdout.splitlines()
    assert out[0].startswith("hugify: /usr/bin/ping-like: transformed (shift): dv=0x")
    assert "growth" in out[0] and "code on huge pages 100.0%" in out[0]
    assert any(
        line.startswith("hugify: /usr/bin/prog: transformed")
        and line.endswith("(also: /usr/bin/prog-hardlink, /usr/sbin/prog-hardlink)")
        for line in out
    )
    assert "hugify: /usr/bin/small: skipped (below-threshold): executable segment is" in "\n".join(out)
    assert any(
        line.startswith("hugify: warning: /usr/lib64/libbroken.so: not transformed (truncated):")
        and line.endswith("the file is unchanged")
        for line in out
    )
    assert "hugify: demo: 7 transformed, 0 as-is, 1 skipped, 1 failed" in out
    assert out[-1].startswith('hugify: warning: 1 file could not be transformed; on_error = "warn" (built-in default)')
    paths = [line.split(": ")[1] if not line.startswith("hugify: warning") else line.split(": ")[2] for line in out[:9]]
    assert paths == sorted(paths), "per-file lines come in path order"


def test_on_error_fail_fails_at_the_end_after_doing_all_others(tree: Tree) -> None:
    policy = tree.root.parent / "fail.toml"
    policy.write_text('on_error = "fail"\n')
    res, report = report_of(tree, "--policy", str(policy))
    assert res.returncode == 1
    assert report["summary"] == {
        "transformed": 7,
        "as-is": 0,
        "skipped": 1,
        "failed": 1,
        "signed_refused": 0,
        "signatures_dropped": 0,
        "on_error": "fail",
        "exit_status": 1,
    }
    assert "hugify: error: /usr/lib64/libbroken.so: not transformed (truncated)" in res.stdout
    assert f'and on_error = "fail" ({policy}:1)' in res.stdout
    for rel in TRANSFORMED:
        assert exec_aligned(tree.root / rel), rel


# --- what the build put there is kept --------------------------------------------------


def test_hardlinks_are_transformed_once_and_stay_linked(tree: Tree) -> None:
    old_ino = (tree.root / BIG).stat().st_ino
    _, report = report_of(tree)
    stats = [(tree.root / rel).stat() for rel in (BIG, *HARD)]
    assert len({s.st_ino for s in stats}) == 1 and stats[0].st_nlink == 3
    assert stats[0].st_ino != old_ino, "the new file replaced the old inode atomically"
    # Transformed exactly once: hugify's build-id differs from the original by one bit
    # (a second transformation of the shared inode would have flipped it back).
    (big,) = [f for f in report["files"] if f["path"] == "/" + BIG]
    assert readelf_build_id(tree.root / BIG).hex() == big["build_id"]
    assert bits_differing(bytes.fromhex(big["build_id"]), bytes.fromhex(big["build_id_before"])) == 1


def test_hardlink_with_one_excluded_name_is_left_alone(tree: Tree) -> None:
    policy = tree.root.parent / "p.toml"
    policy.write_text('exclude = ["/usr/sbin/**"]\n')
    _, report = report_of(tree, "--policy", str(policy))
    assert statuses(report)["/" + BIG] == ("skipped", "excluded")
    assert (tree.root / BIG).read_bytes() == tree.originals[BIG]


def test_modes_owner_times_and_xattrs_are_kept(tree: Tree) -> None:
    before = {rel: (tree.root / rel).stat() for rel in TRANSFORMED}
    tree.run()
    for rel, st in before.items():
        now = (tree.root / rel).stat()
        assert stat.S_IMODE(now.st_mode) == stat.S_IMODE(st.st_mode), rel
        assert (now.st_uid, now.st_gid) == (st.st_uid, st.st_gid), rel
        assert now.st_mtime_ns == st.st_mtime_ns == MTIME * 10**9, rel
    assert stat.S_IMODE((tree.root / SUID).stat().st_mode) == 0o4755
    assert stat.S_IMODE((tree.root / SGID).stat().st_mode) == 0o2755
    assert stat.S_IMODE((tree.root / LIB).stat().st_mode) == 0o644
    assert ((tree.root / OWNED).stat().st_uid, (tree.root / OWNED).stat().st_gid) == (1234, 5678)
    caps = subprocess.run(["getcap", str(tree.root / CAPPED)], capture_output=True, text=True, check=True).stdout
    assert "cap_net_raw=ep" in caps
    assert os.getxattr(tree.root / XATTR, "user.hugify-test") == b"kept"
    # The directories keep their times too, also where a file failed (its temporary was removed).
    for d in ("usr/bin", "usr/sbin", "usr/libexec", "usr/lib64"):
        assert (tree.root / d).stat().st_mtime_ns == MTIME * 10**9, d


def test_symlinks_are_untouched(tree: Tree) -> None:
    before = {link: os.lstat(tree.root / link) for link in SYMLINKS}
    tree.run()
    for link, target in SYMLINKS.items():
        st = os.lstat(tree.root / link)
        assert stat.S_ISLNK(st.st_mode) and os.readlink(tree.root / link) == target
        assert (st.st_ino, st.st_mtime_ns) == (before[link].st_ino, before[link].st_mtime_ns)


def test_transformed_programs_run(tree: Tree, programs: tuple[Path, Path]) -> None:
    want = run_program(programs[0] / "prog")
    tree.run()
    env = {"LD_LIBRARY_PATH": str(tree.root / "usr/lib64")}
    for rel in (BIG, HARD[1], SUID):
        assert run_program(tree.root / rel, env=env)[:2] == want[:2], rel


def test_source_date_epoch_clamps_times(tree: Tree) -> None:
    epoch = MTIME - 1000
    tree.run("--manifest", tree.root / "m.list", SOURCE_DATE_EPOCH=str(epoch))
    for rel in TRANSFORMED:
        assert (tree.root / rel).stat().st_mtime == epoch, rel
    assert (tree.root / SMALL).stat().st_mtime == MTIME, "untouched files keep their time"
    assert (tree.root / "m.list").stat().st_mtime == epoch
    assert (tree.root / "usr/bin").stat().st_mtime == epoch


def test_source_date_epoch_later_than_the_files_keeps_their_times(tree: Tree) -> None:
    tree.run(SOURCE_DATE_EPOCH=str(MTIME + 1000))
    for rel in TRANSFORMED:
        assert (tree.root / rel).stat().st_mtime == MTIME, rel


# --- parallelism, determinism, idempotence -----------------------------------------------


def test_parallel_and_serial_runs_give_the_same_bytes(tmp_path: Path, programs: tuple[Path, Path]) -> None:
    """Reproducible builds: the jobs, locale, time zone and umask of the build do not
    change a byte of the files, the manifest or the report."""
    outputs = []
    settings = [("1", "C", "UTC", 0o022), ("4", "C.UTF-8", "Pacific/Auckland", 0o077)]
    for jobs, locale, tz, umask in settings:
        t = make_tree(tmp_path / f"j{jobs}" / "root", programs)
        old_umask = os.umask(umask)
        try:
            res = t.run(
                "--jobs", jobs, "--manifest", t.root.parent / "m.list", "--report", t.root.parent / "r.json",
                LC_ALL=locale, LANG=locale, TZ=tz,
            )  # fmt: skip
        finally:
            os.umask(old_umask)
        files = {str(p.relative_to(t.root)): p.read_bytes() for p in sorted(t.root.rglob("*")) if p.is_file()}
        log = res.stdout.replace(str(t.root.parent), "TMP")
        outputs.append((files, (t.root.parent / "m.list").read_bytes(), (t.root.parent / "r.json").read_bytes(), log))
    assert outputs[0] == outputs[1]


def test_second_run_changes_nothing_and_lists_the_same_manifest(tree: Tree) -> None:
    m1, m2 = tree.root.parent / "m1", tree.root.parent / "m2"
    tree.run("--manifest", m1)
    after_first = {p: p.read_bytes() for p in tree.root.rglob("*") if p.is_file()}
    res, report = report_of(tree, "--manifest", str(m2))
    assert {p: p.read_bytes() for p in tree.root.rglob("*") if p.is_file()} == after_first
    assert m1.read_bytes() == m2.read_bytes()
    assert statuses(report)["/" + BIG] == ("as-is", "already-aligned")
    assert "hugify: /usr/bin/prog: as-is (already-aligned): " in res.stdout
    assert "listed in the manifest without a rewrite" in res.stdout


def test_manifest_lists_every_name_with_build_id_and_segment(tree: Tree) -> None:
    m = tree.root.parent / "m.list"
    tree.run("--manifest", m)
    entries = manifest.parse(m.read_text())
    assert [e.path for e in entries] == sorted("/" + rel for rel in TRANSFORMED)
    for e in entries:
        (x,) = [s for s in readelf_loads(tree.root / e.path.lstrip("/")) if "E" in s.flags]
        assert (e.offset, e.size, e.huge_page) == (x.offset, x.filesz, HP)
        assert e.build_id == readelf_build_id(tree.root / e.path.lstrip("/")).hex()


def test_report_names_each_files_manifest_span_as_such(tree: Tree) -> None:
    """The report gives each listed file its manifest entry's fields under the names of
    what they hold (format 2): the span readelf shows for the output, as in the manifest."""
    m = tree.root.parent / "m.list"
    _, report = report_of(tree, "--manifest", m)
    assert report["hugify_tree_report"] == 2
    lines = {f[0]: f[1:] for f in (line.split("\t") for line in m.read_text().splitlines()[1:])}
    listed = [f for f in report["files"] if f["status"] == "transformed"]
    assert sorted(p for f in listed for p in f["paths"]) == sorted(lines), "each name of each file listed"
    for f in listed:
        assert "exec_offset" not in f and "exec_size" not in f, f
        (x,) = [s for s in readelf_loads(tree.root / f["path"].lstrip("/")) if "E" in s.flags]
        assert (f["manifest_offset"], f["manifest_size"], f["huge_page"]) == (x.offset, x.filesz, HP)
        build_id, offset, size, huge = lines[f["path"]][:4]
        assert (f["build_id"], f["manifest_offset"], f["manifest_size"]) == (build_id, int(offset, 0), int(size, 0))
        assert f["huge_page"] == int(huge, 0)


def test_manifest_only_refreshes_build_ids_after_debugedit(tree: Tree) -> None:
    m = tree.root.parent / "m.list"
    tree.run("--manifest", m)
    # What find-debuginfo does: recompute the build-id of the file.
    subprocess.run(
        ["debugedit", "--build-id", "--build-id-seed=1.0-1", str(tree.root / LIB)], check=True, capture_output=True
    )
    new_id = readelf_build_id(tree.root / LIB).hex()
    before = (tree.root / LIB).read_bytes()
    res = tree.run("--manifest", m, "--manifest-only")
    assert res.returncode == 0 and "manifest only: 7 aligned file(s) listed" in res.stdout
    assert (tree.root / LIB).read_bytes() == before, "--manifest-only transforms nothing"
    entries = {e.path: e.build_id for e in manifest.parse(m.read_text())}
    assert entries["/" + LIB] == new_id


# --- policy in effect ----------------------------------------------------------------


def test_policy_include_exclude_package_overrides_and_regex(tree: Tree) -> None:
    policy = tree.root.parent / "p.toml"
    policy.write_text(
        'include = ["/usr/bin/**", "/usr/lib64/*.so"]\n'
        'exclude = ["/usr/bin/s?id"]\n'
        '[packages.demo]\nexclude = ["/usr/bin/sgid"]\n'
    )
    _, report = report_of(tree, "--policy", str(policy), "--package", "demo", "--exclude-regex", "ping")
    got = statuses(report)
    assert got["/" + SUID] == ("transformed", None), "the package's exclude list replaces the top-level one"
    assert got["/" + SGID] == ("skipped", "excluded")
    assert got["/" + CAPPED] == ("skipped", "excluded"), "--exclude-regex"
    assert got["/" + OWNED] == ("skipped", "excluded"), "no include glob matches /usr/libexec"
    assert got["/" + LIB] == ("transformed", None)
    assert (tree.root / SGID).read_bytes() == tree.originals[SGID]


def test_package_threshold_override(tree: Tree) -> None:
    policy = tree.root.parent / "p.toml"
    policy.write_text('[packages.big]\nthreshold = "64M"\n')
    _, report = report_of(tree, "--policy", str(policy), "--package", "big")
    assert {s for s, _ in statuses(report).values()} == {"skipped", "failed"}
    assert statuses(report)["/" + BIG] == ("skipped", "below-threshold")


def test_disabled_policy_changes_nothing_but_writes_an_empty_manifest(tree: Tree) -> None:
    policy = tree.root.parent / "p.toml"
    policy.write_text("enabled = false\n")
    m = tree.root.parent / "m.list"
    res = tree.run("--policy", policy, "--manifest", m)
    assert res.returncode == 0 and "disabled by the policy" in res.stdout
    assert manifest.parse(m.read_text()) == [] and m.read_text().startswith(manifest.MARKER)
    for rel, data in tree.originals.items():
        assert (tree.root / rel).read_bytes() == data, rel


def test_stripped_files_follow_refuse_stripped(tree: Tree) -> None:
    subprocess.run(["strip", str(tree.root / SUID)], check=True)
    _, report = report_of(tree)
    assert statuses(report)["/" + SUID] == ("skipped", "stripped")
    policy = tree.root.parent / "p.toml"
    policy.write_text("refuse_stripped = false\n")
    _, report = report_of(tree, "--policy", str(policy))
    assert statuses(report)["/" + SUID] == ("transformed", None)


def test_other_architectures_are_skipped(tree: Tree) -> None:
    _, report = report_of(tree, "--arch", "aarch64")
    assert statuses(report)["/" + BIG] == ("skipped", "foreign-arch")
    _, report = report_of(tree, "--arch", "amd64")  # Debian's name for x86_64
    assert statuses(report)["/" + BIG] == ("transformed", None)


def test_unusable_policy_changes_nothing(tree: Tree) -> None:
    policy = tree.root.parent / "p.toml"
    policy.write_text("threshold = true\n")
    res = tree.run("--policy", policy)
    assert res.returncode == 3 and f"{policy}:1: threshold: expected a size" in res.stderr
    assert (tree.root / BIG).read_bytes() == tree.originals[BIG]


# --- the terminal --------------------------------------------------------------------


def test_progress_only_on_a_terminal(tree: Tree) -> None:
    master, slave = pty.openpty()
    try:
        res = subprocess.run(
            [*hugify_cmd(), "tree", str(tree.root)],
            stdout=subprocess.PIPE,
            stderr=slave,
            text=True,
            env=tree.env(),
            cwd=Path(__file__).resolve().parent.parent,
            check=False,
        )
        os.close(slave)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
    assert res.returncode == 0
    assert b"hugify: [1/9]" in seen and b"\x1b[K" in seen, seen
    assert "\x1b" not in res.stdout, "the log itself stays plain"
    # Not a terminal: no progress at all.
    plain = hugify("tree", tree.root, env=tree.env())
    assert "[1/" not in plain.stderr and "\x1b" not in plain.stderr


def hugify_cmd() -> list[str]:
    return command()


# --- in-process: the worker pool -----------------------------------------------------


def _options(root: Path, **kw: object):
    import io

    from hugify import policy, tree

    return tree.Options(root=root, policy=policy.resolve(policy.load(files=[])), out=io.StringIO(), **kw)


def test_jobs_run_concurrently_and_are_logged_in_path_order(tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import time

    from hugify import tree as walker

    running, peak, lock = [0], [0], threading.Lock()
    real = walker.process

    def slow_process(job):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        # The last file in path order finishes first.
        time.sleep(0.3 if job.candidate.paths[0] < "/usr/lib64" else 0.05)
        try:
            return real(job)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(walker, "process", slow_process)
    opts = _options(tree.root, jobs=3)
    assert walker.run(opts) == 0
    assert peak[0] == 3
    lines = opts.out.getvalue().splitlines()[:9]
    order = [line.split(": ")[2 if ": warning: " in line else 1] for line in lines]
    assert order == sorted(order)


def test_an_unexpected_error_on_one_file_does_not_stop_the_others(tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    from hugify import tree as walker

    real = walker.replace

    def flaky(source, *args, **kw):
        if source.name == "sgid":
            raise RuntimeError("simulated bug")
        return real(source, *args, **kw)

    monkeypatch.setattr(walker, "replace", flaky)
    opts = _options(tree.root, jobs=2)
    assert walker.run(opts) == 0  # on_error = "warn"
    log = opts.out.getvalue()
    assert "hugify: warning: /usr/bin/sgid: not transformed (internal): RuntimeError: simulated bug" in log
    assert (tree.root / SGID).read_bytes() == tree.originals[SGID]
    assert exec_aligned(tree.root / SUID) and exec_aligned(tree.root / LIB)


def test_each_file_is_probed_once_whatever_the_policys_page_size(tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk probes each inode once; a policy page size other than the default takes
    its windows from that probe (Probe::windows), not from reading the file again."""
    from hugify import _core, policy
    from hugify import tree as walker

    tree.run()  # aligned to 2 MiB, so on whole 1 MiB windows as well
    pol = tree.root.parent / "p.toml"
    pol.write_text('[huge_page_size]\nx86_64 = "1M"\n')
    probes: dict[tuple[int, int], int] = {}
    real = _core.probe

    def counted(source):
        st = os.fstat(source) if isinstance(source, int) else os.stat(source)
        probes[st.st_dev, st.st_ino] = probes.get((st.st_dev, st.st_ino), 0) + 1
        return real(source)

    monkeypatch.setattr(_core, "probe", counted)
    m = tree.root.parent / "m.list"
    opts = _options(tree.root, manifest=m, manifest_only=True)
    opts = opts._replace(policy=policy.resolve(policy.load(files=[pol])))
    assert walker.run(opts) == 0
    assert probes and max(probes.values()) == 1, probes
    entries = manifest.parse(m.read_text())
    assert sorted(e.path for e in entries) == sorted("/" + rel for rel in TRANSFORMED)
    for e in entries:
        (x,) = [s for s in readelf_loads(tree.root / e.path.lstrip("/")) if "E" in s.flags]
        assert (e.offset, e.size, e.huge_page) == (x.offset, x.filesz, 1 << 20), e


def test_a_core_bug_while_probing_one_file_does_not_stop_the_walk(tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    """A panic in the core's probe comes back as HugifyError (reason internal): that file
    is reported, every other file is still found and transformed."""
    from hugify import _core
    from hugify import tree as walker

    real = _core.probe

    def panicking(source):
        # The walk hands the core a descriptor it opened; /proc names its file.
        path = os.readlink(f"/proc/self/fd/{source}") if isinstance(source, int) else str(source)
        if path.endswith("/sgid"):
            e = _core.HugifyError("panic in the rewriter: simulated (internal)")
            e.reason, e.kind, e.detail = "internal", "internal", "panic in the rewriter: simulated"
            raise e
        return real(source)

    monkeypatch.setattr(_core, "probe", panicking)
    found = {c.paths[0]: c.probe["problem"] for c in walker.candidates(tree.root)}
    assert found["/usr/bin/sgid"] == {
        "reason": "internal",
        "kind": "internal",
        "detail": "panic in the rewriter: simulated",
    }
    assert {"/" + p for p in (BIG, SUID, LIB, SMALL)} <= found.keys()
    assert found["/" + BIG] is None


# --- IMA/EVM signatures ----------------------------------------------------------

IMA = "0x0302046e6a3b9f0048304602210088"  # a signature header and the start of a DER blob
EVM = "0x05020400112233"


def xattrs(path: Path) -> dict[str, str]:
    """Every extended attribute of a file, as getfattr (attr package) dumps it in hex."""
    out = subprocess.run(
        ["getfattr", "--absolute-names", "-d", "-m", "-", "-e", "hex", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def summary_line(log: str) -> str:
    return next(x for x in log.splitlines() if " as-is, " in x)


def sign(path: Path) -> None:
    for name, value in (("security.ima", IMA), ("security.evm", EVM), ("user.hugify-note", "0x6b657074")):
        subprocess.run(["setfattr", "-n", name, "-v", value, str(path)], check=True)


def test_ima_signed_file_is_refused_untouched_with_its_xattrs(tree: Tree) -> None:
    sign(tree.root / CAPPED)
    before = xattrs(tree.root / CAPPED)
    assert {"security.ima", "security.evm", "security.capability", "user.hugify-note"} <= set(before), before
    res, report = report_of(tree)
    assert res.returncode == 0, res.stderr  # a refusal, not a failure
    assert (tree.root / CAPPED).read_bytes() == tree.originals[CAPPED]
    assert xattrs(tree.root / CAPPED) == before
    assert statuses(report)["/" + CAPPED] == ("skipped", "signed-file")
    assert report["summary"]["signed_refused"] == 1 and report["summary"]["signatures_dropped"] == 0
    assert f"hugify: /{CAPPED}: skipped (signed-file): signed with security.evm, security.ima" in res.stdout
    assert "; 1 signed with IMA/EVM attributes, left unchanged (signed-file)" in summary_line(res.stdout)
    assert exec_aligned(tree.root / BIG), "the unsigned files are still transformed"


@pytest.mark.parametrize("how", ["switch", "policy"])
def test_drop_stale_signatures_transforms_and_drops_only_the_signature(tree: Tree, how: str) -> None:
    sign(tree.root / CAPPED)
    before = xattrs(tree.root / CAPPED)
    if how == "switch":
        args: tuple[str, ...] = ("--drop-stale-signatures",)
    else:
        pol = tree.root.parent / "drop.toml"
        pol.write_text('ima_signatures = "drop"\n')
        args = ("--policy", str(pol))
    res, report = report_of(tree, *args)
    assert res.returncode == 0, res.stderr
    assert exec_aligned(tree.root / CAPPED)
    after = xattrs(tree.root / CAPPED)
    assert "security.ima" not in after and "security.evm" not in after
    kept = {k: v for k, v in before.items() if k not in ("security.ima", "security.evm")}
    assert after == kept and "security.capability" in kept and "user.hugify-note" in kept
    line = next(x for x in res.stdout.splitlines() if x.startswith(f"hugify: /{CAPPED}: transformed"))
    assert line.endswith("; dropped the stale signature security.evm, security.ima (re-sign it)"), line
    (entry,) = [f for f in report["files"] if f["path"] == "/" + CAPPED]
    assert entry["dropped_signatures"] == ["security.evm", "security.ima"]
    assert report["summary"]["signatures_dropped"] == 1 and report["summary"]["signed_refused"] == 0
    why = "--drop-stale-signatures" if how == "switch" else f'ima_signatures = "drop", {pol}:1'
    assert f"; stale IMA/EVM signatures dropped from 1 ({why})" in summary_line(res.stdout)
    caps = subprocess.run(["getcap", str(tree.root / CAPPED)], capture_output=True, text=True, check=True).stdout
    assert "cap_net_raw=ep" in caps


@pytest.fixture(params=["tmp", "tmpfs"])
def signed_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A directory on the test's filesystem, and on a tmpfs mounted for the test
    (security.* attributes are stored by each filesystem's own handler)."""
    d = tmp_path / "signed"
    d.mkdir()
    if request.param == "tmpfs":
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "hugify-ima-test", str(d)], check=True)
        request.addfinalizer(lambda: subprocess.run(["umount", str(d)], check=True))
        fs = subprocess.run(["stat", "-f", "-c", "%T", str(d)], capture_output=True, text=True, check=True)
        assert fs.stdout.strip() == "tmpfs"
    return d


def test_transform_in_place_refuses_an_ima_signed_file(signed_dir: Path, programs: tuple[Path, Path]) -> None:
    f = signed_dir / "prog"
    shutil.copyfile(programs[0] / "prog", f)
    f.chmod(0o755)
    sign(f)
    original, attrs = f.read_bytes(), xattrs(f)
    res = hugify("transform", f, "--in-place", check=False)
    assert res.returncode == 4, res.stdout + res.stderr
    assert res.stderr.strip().endswith("(signed-file)") and "security.evm, security.ima" in res.stderr
    assert f.read_bytes() == original and xattrs(f) == attrs
    assert sorted(p.name for p in signed_dir.iterdir()) == ["prog"], "no temporary file left"
    res = hugify("transform", f, "--in-place", "--drop-stale-signatures")
    assert "dropped the stale signature security.evm, security.ima" in res.stdout
    assert exec_aligned(f)
    assert xattrs(f) == {"user.hugify-note": attrs["user.hugify-note"]}
    env = {"LD_LIBRARY_PATH": str(programs[0])}  # its library, found beside the original by $ORIGIN
    assert run_program(f, env=env)[:2] == run_program(programs[0] / "prog")[:2]


def test_explain_knows_the_new_reasons() -> None:
    out = hugify("explain", "signed-file", "live-root").stdout
    assert out.startswith("signed-file (refused, exit status 4): ")
    assert "\nlive-root (refused, exit status 4): " in out


# --- a live root -------------------------------------------------------------------


@pytest.fixture(params=["slash", "symlink", "bind-mount"])
def live_root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """/ itself, a symlink to it, and a bind mount of it: the running system's root."""
    if request.param == "slash":
        return "/"
    path = tmp_path / "root"
    if request.param == "symlink":
        path.symlink_to("/")
    else:
        path.mkdir()
        subprocess.run(["mount", "--bind", "/", str(path)], check=True)
        request.addfinalizer(lambda: subprocess.run(["umount", str(path)], check=True))
    return str(path)


def test_tree_refuses_the_live_root(live_root: str, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    res = hugify("tree", live_root, "--report", report, check=False, env={**os.environ, "HUGIFY_POLICY_PATH": ""})
    assert res.returncode == 4, res.stdout + res.stderr
    assert res.stdout == "" and not report.exists()
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"hugify: {live_root}: this is the running system's root") and line.endswith("(live-root)")
    assert "--allow-live-root" in line and "$RPM_BUILD_ROOT" in line


def test_allow_live_root_lets_the_run_proceed(tmp_path: Path) -> None:
    # A disabled policy: the run gets past the guard and changes nothing.
    pol = tmp_path / "off.toml"
    pol.write_text("enabled = false\n")
    env = {**os.environ, "HUGIFY_POLICY_PATH": ""}
    res = hugify("tree", "/", "--allow-live-root", "--policy", pol, check=False, env=env)
    assert res.returncode == 0, res.stderr
    assert "disabled by the policy" in res.stdout


def test_a_build_root_is_not_a_live_root(tree: Tree) -> None:
    res = tree.run()
    assert res.returncode == 0 and "live-root" not in res.stderr
