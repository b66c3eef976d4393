"""bench/boot_cost_vm.py without booting anything (the benchmark itself is not in the
suite: it boots qemu guests for minutes): it starts through tools/bench, its guest driver
reads manifests and the page cache as it will in the guest, and the summary of a guest's
results gives each case's ratio to `cat` of the same round."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from testkit import REPO
from testkit.vm import boot_cost as host
from testkit.vm.guest import boot_cost_guest as guest


def test_the_benchmark_runs_through_tools_bench() -> None:
    res = subprocess.run(
        [REPO / "tools" / "bench", "boot_cost_vm", "--help"],
        check=False,
        cwd="/",
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stderr
    assert "--boot-variants" in res.stdout


def test_the_driver_lists_the_manifests_files_and_measures_their_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    data.write_bytes(os.urandom(3 << 20))
    manifests = tmp_path / "manifest.d"
    manifests.mkdir()
    line = f"{data}\t-\t0x0\t0x200000\t0x200000\n"
    (manifests / "a.list").write_text("# hugify manifest v1\n" + line)
    (manifests / "b.list").write_text("# hugify manifest v1\n" + line)  # listed twice, counted once
    monkeypatch.setattr(guest, "MANIFESTS", manifests)
    assert guest.hugified_files() == [str(data)]
    assert guest.cached_bytes([str(data)]) == 3 << 20  # just written: all of it in the page cache
    fd = os.open(data, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    assert guest.cached_bytes([str(data)]) < 1 << 20


def _run(seconds: float, read: int, cached: int) -> dict[str, object]:
    return {"seconds": seconds, "read_bytes": read, "disk_read_bytes": read, "cached_bytes": cached}


def test_the_summary_gives_each_case_against_cat_of_its_round() -> None:
    boot = {
        "manager": {"UserspaceTimestampMonotonic": "10000000", "FinishTimestampMonotonic": "30000000"},
        "service": {"seconds": 4.0, "start_s": 15.0, "read_bytes": 256 << 20, "props": {"Result": "success"}},
        "cached_bytes": 254 << 20,
        "windows": {"huge": 127},
        "basic_target_s": 19.5,
        "analyze": "",
    }
    rounds = [
        {"cat": _run(4.0, 440 << 20, 446 << 20), "-1": _run(2.0, 266 << 20, 256 << 20)},
        {"cat": _run(8.0, 440 << 20, 446 << 20), "-1": _run(2.0, 266 << 20, 256 << 20)},
        {"cat": _run(5.0, 440 << 20, 446 << 20), "-1": _run(4.0, 266 << 20, 256 << 20)},
    ]
    doc = {"uname": "7.3", "root_fs": "ext4", "files": 35, "file_bytes": 1 << 30, "boot": boot, "rounds": rounds}
    s = host.summary(doc)
    assert s["boot"]["userspace_s"] == 20.0
    assert s["boot"]["basic_target_after_userspace_s"] == 9.5
    assert s["boot"]["service_start_after_userspace_s"] == 5.0
    bound = s["cases"]["no bound"]
    assert bound["over_cat"] == 0.5  # per-round ratios 0.5, 0.25, 0.8: their median
    assert bound["over_cat_range"] == [0.25, 0.8]
    assert bound["unit_read_mib"] == 266.0
    assert host.variant_args("masked") == "systemd.mask=hugify-prefetch.service"
    assert host.variant_args("64M") == f"hugify.boot_budget={64 << 20}"
    assert host.variant_args("none") == "hugify.boot_budget=-1"
