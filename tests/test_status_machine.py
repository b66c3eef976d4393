"""`hugify status` answers a newcomer's question, "what does this machine get for
hugified code?", on a root with no hugified package: per mounted
filesystem holding programs, file-backed huge pages, root's shared copies, anonymous
copies only, or none, each with its reason, and the command that measures it
(`hugify try -- COMMAND`).

The filesystems are real (ext4, XFS and btrfs on loop devices, put on PATH as a
program directory); the kernel is this machine's, whose answer for ext4 is measured
first (a cold window read through MADV_HUGEPAGE: testkit.runtime.gives_large_folios),
and kernels it cannot boot are the verdict's injected fact (HUGIFY_FORCE_KERNEL_RELEASE:
Debian 12's 6.1 and 13's 6.12 on ext4, the release ext4 got large folios in). What has
been seen counts: root's record of this boot that a filesystem gave none. After a
prefetch that met no cold window, "exec mappings read as PMD folios by the kernel
itself" is known; as a user other than root, cachestat is "cannot tell", not "no".
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit import REPO
from testkit.cli import hugify
from testkit.runtime import AS_NOBODY, Programs, copy_programs, gives_large_folios, locked, loop_fs, read_plainly

BOOT = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
SHARED = "shared copies"
FILE_BACKED = "file-backed huge pages"


@pytest.fixture(scope="module")
def filesystems(built: Programs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """ext4, ext4 with data=journal, XFS and btrfs, each mounted on a loop device with a
    copy of the runtime tests' programs in bin/."""
    work = tmp_path_factory.mktemp("fs")
    kinds = {"ext4": ("ext4", ""), "ext4-journal": ("ext4", "data=journal"), "xfs": ("xfs", ""), "btrfs": ("btrfs", "")}
    with contextlib.ExitStack() as stack:
        mounted = {}
        for name, (fs, options) in kinds.items():
            (work / name).mkdir()
            mounted[name] = stack.enter_context(loop_fs(work / name, fs, options, programs=built))
        yield mounted


def status(tmp: Path, mounts: dict[str, Path], release: str | None = None, **env: str) -> dict[str, dict[str, Any]]:
    """`hugify status --json` on a root with no hugified package (empty manifest and state
    directories), the filesystems' bin/ on PATH: each one's verdict, by mount point."""
    empty = tmp / "empty"
    for d in (empty / "manifests", empty / "state"):
        d.mkdir(parents=True, exist_ok=True)
    extra = {"PATH": ":".join([*(str(m / "bin") for m in mounts.values()), os.environ["PATH"]])}
    extra |= {"HUGIFY_STATE_DIR": str(empty / "state"), "HUGIFY_POLICY_PATH": "", **env}
    if release:
        extra["HUGIFY_FORCE_KERNEL_RELEASE"] = release
    res = hugify("status", "--json", "--manifest-dir", empty / "manifests", add_env=extra)
    doc = json.loads(res.stdout)
    assert doc["machine"]["measure"] == "hugify try -- COMMAND" and doc["files"] == []
    ways = {w["mountpoint"]: w for w in doc["machine"]["filesystems"]}
    return {name: ways[str(m)] for name, m in mounts.items()}


def test_each_filesystem_gets_its_way_with_its_reason(
    filesystems: dict[str, Path], built: Programs, tmp_path: Path
) -> None:
    with locked():
        ext4_large = gives_large_folios(filesystems["ext4"] / "bin" / "prog")
        xfs_large = gives_large_folios(filesystems["xfs"] / "bin" / "prog")
    assert xfs_large, "XFS gave no 2 MiB folio (Linux 5.18 on)"
    here = status(tmp_path, filesystems)
    assert here["ext4"]["way"] == (FILE_BACKED if ext4_large else SHARED), (ext4_large, here["ext4"])
    assert here["xfs"]["way"] == FILE_BACKED and "xfs gives files large folios from Linux 5.18" in here["xfs"]["why"]
    assert here["btrfs"]["way"] == SHARED and "btrfs gives files no large folios" in here["btrfs"]["why"]
    assert "root's shared copies take their place" in here["btrfs"]["why"]
    journal = here["ext4-journal"]
    assert journal["way"] == SHARED and "data=journal gives its files no large folios" in journal["why"], journal
    for name, w in here.items():
        assert w["type"] == name.split("-")[0] and f"{filesystems[name]}/bin" in w["holds"], w

    # Kernels this machine does not boot: their facts injected.
    for release, ext4_way in (("6.1.0-50-amd64", SHARED), ("6.12.117+deb13-amd64", SHARED), ("6.16.0", FILE_BACKED)):
        got = status(tmp_path, filesystems, release)
        assert got["ext4"]["way"] == ext4_way, (release, got["ext4"])
        assert got["xfs"]["way"] == FILE_BACKED and got["btrfs"]["way"] == SHARED, (release, got)
        if ext4_way == SHARED:
            why = got["ext4"]["why"]
            assert f"ext4 gives files no large folios on Linux {release}; ext4 has them from Linux 6.16" in why, why

    # Shared copies off (the policy): anonymous copies are what is left, opt-in.
    off = tmp_path / "off.toml"
    off.write_text('[runtime]\nshared = "off"\n')
    got = status(tmp_path, filesystems, "6.1.0-50-amd64", HUGIFY_POLICY_PATH=str(off))
    assert got["btrfs"]["way"] == got["ext4"]["way"] == "anonymous only", got
    assert "hugify-run --anonymous PROGRAM" in got["btrfs"]["why"] and got["xfs"]["way"] == FILE_BACKED


def test_what_was_seen_counts(filesystems: dict[str, Path], tmp_path: Path, own_runtime_dir: Path) -> None:
    """Root's record of this boot that ext4 gave two files no large folios (what the
    engine writes: the filesystem's device and magic) turns its verdict to the shared
    copies, saying why, whatever the kernel's version says."""
    dev = os.stat(filesystems["ext4"]).st_dev
    (own_runtime_dir / f"no-large-folios-{os.major(dev)}:{os.minor(dev)}").write_text(f"{BOOT} ef53\n")
    got = status(tmp_path, {"ext4": filesystems["ext4"]}, "6.18.0")
    assert got["ext4"]["way"] == SHARED and "root's record of this boot" in got["ext4"]["why"], got


def test_the_text_answers_first_and_suggests_try(filesystems: dict[str, Path], tmp_path: Path) -> None:
    empty = tmp_path / "m"
    empty.mkdir()
    env = {"PATH": f"{filesystems['btrfs'] / 'bin'}:{os.environ['PATH']}", "HUGIFY_POLICY_PATH": ""}
    out = hugify("status", "--manifest-dir", empty, add_env=env).stdout.splitlines()
    assert out[0] == "what hugified code gets on this machine, per filesystem holding programs:", out
    line = next(x for x in out if x.startswith(f"  {filesystems['btrfs']} (btrfs, holding "))
    assert ": shared copies: btrfs gives files no large folios" in line, line
    # run from the checkout: its own document (installed, the installed one: test_install.py)
    assert f"whether that makes a command faster here: hugify try -- COMMAND ({REPO}/docs/try.md)" in out


def test_a_prefetch_finds_out_the_exec_verdict_and_a_user_cannot_tell_cachestat(
    large_folio_dir: Path, built: Programs, tmp_path: Path, own_runtime_dir: Path
) -> None:
    """The programs cached in small folios (read plainly): prefetch repairs their windows
    without meeting a cold one, where the engine probes; status after it still said
    "unknown" on the old code. As nobody, cachestat is refused for root's files: the
    old code said "cachestat no"."""
    progs = copy_programs(built, large_folio_dir / tmp_path.name)
    with locked():
        read_plainly([progs.prog, progs.lib])
        hugify("prefetch", "--runtime-dir", own_runtime_dir, progs.prog, progs.lib)
    doc = json.loads(hugify("status", "--json", "--runtime-dir", own_runtime_dir, progs.prog).stdout)
    assert doc["system"]["exec_pmd_readahead"] is not None, doc["system"]
    text = hugify("status", "--runtime-dir", own_runtime_dir, progs.prog).stdout
    assert "by the kernel itself unknown" not in text, text
    # As another user: the suite's interpreter may sit under a home nobody may enter;
    # the installed hugify runs Debian's /usr/bin/python3 too.
    res = hugify(
        "status",
        "--manifest-dir",
        "/nonexistent",
        runner=AS_NOBODY,
        python="/usr/bin/python3",
        env={"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1"},
        check=False,
    )
    assert res.returncode == 0, res.stderr
    features = next(x for x in res.stdout.splitlines() if x.startswith("kernel features:"))
    assert "cachestat cannot tell as this user (permission" in features, features
    assert "by the kernel itself unknown (not recorded this boot" in features or "itself no" in features, features
