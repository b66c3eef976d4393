"""The runtime's verdicts on the host's own filesystem (the one of the suite's temporary
directory), whatever kernel and filesystem run the suite (issue 32 item 7). The other
runtime tests keep their files on XFS (conftest.large_folio_dir) or on ext4 with
data=journal, whose answers do not depend on the kernel; here the answer does (ext4 has
large folios from Linux 6.16 on, btrfs in none of Debian's kernels), so what hugify must
report is taken from the kernel first, without hugify: a cold window read through a
MADV_HUGEPAGE mapping and its FilePmdMapped, and the same window mapped as the ELF loader
maps it (testkit.runtime.gives_large_folios, kernel_maps_exec_huge)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from testkit.cli import hugify
from testkit.runtime import (
    AUDIT_LIB,
    HUGIFY_RUN,
    Programs,
    clean_env,
    copy_programs,
    drop_caches,
    exec_segment_size,
    file_backed_only,
    gives_large_folios,
    kernel_maps_exec_huge,
    locked,
    parse_smaps,
    run_mappings,
)


def test_the_verdicts_on_the_hosts_own_filesystem(built: Programs, tmp_path: Path):
    progs = copy_programs(built, tmp_path / "bin")
    run = tmp_path / "run"
    fstype = subprocess.run(
        ["findmnt", "-no", "FSTYPE", "--target", str(progs.dir)], capture_output=True, text=True, check=True
    ).stdout.strip()
    with locked():
        large = gives_large_folios(progs.prog)
        by_itself = kernel_maps_exec_huge(progs.prog)
        drop_caches()
        no_copies = file_backed_only(tmp_path)  # the file-backed way's verdicts: no shared copies
        res = hugify(
            "prefetch", "--json", "--policy", no_copies, "--runtime-dir", run, progs.prog, progs.lib, check=False
        )
        prefetched = run_mappings([progs.prog])
        drop_caches()
        dispatched = subprocess.run(
            [str(HUGIFY_RUN), str(progs.prog), "-"], capture_output=True, text=True, env=clean_env(run), check=False
        )
        drop_caches()
        audited = run_mappings([progs.prog], env={"LD_AUDIT": str(AUDIT_LIB), "HUGIFY_RUNTIME_DIR": str(run)})
        status = json.loads(hugify("status", "--json", "--runtime-dir", run, progs.prog, progs.lib, check=False).stdout)
    at = f"{fstype} on Linux {os.uname().release}: large folios {large}, exec PMD by itself {by_itself}"
    assert "Traceback" not in res.stderr and dispatched.returncode == 0, (at, res.stderr, dispatched.stderr)
    states = {
        f["path"]: {(w["state"], w.get("reason", "")) for w in f["windows"]} for f in json.loads(res.stdout)["files"]
    }
    records = sorted(p.name for p in run.glob("no-large-folios-*"))
    ways = {"prefetch": prefetched, "hugify-run": parse_smaps(dispatched.stdout), "audit": audited}
    coverage = {f["path"]: f["coverage"] for f in status["files"]}
    if large:
        want = {("kernel", "")} if by_itself else {("loaded", "")}
        assert res.returncode == 0 and all(s == want for s in states.values()), (at, states)
        for way, maps in ways.items():
            for p in (progs.prog, progs.lib):
                assert maps[str(p)].pmd == exec_segment_size(p), (at, way, p, maps[str(p)])
        assert coverage == {str(progs.prog): 1.0, str(progs.lib): 1.0}, (at, coverage)
        assert records == [], (at, records)
    else:
        assert res.returncode == 4, (at, res.stderr)
        assert states == {
            str(progs.prog): {("unsupported", "file-no-large-folios")},
            str(progs.lib): {("unsupported", "no-large-folios")},
        }, (at, states)
        for way, maps in ways.items():
            for p in (progs.prog, progs.lib):
                assert maps[str(p)].pmd == 0, (at, way, p, maps[str(p)])
        assert coverage == {str(progs.prog): 0.0, str(progs.lib): 0.0}, (at, coverage)
        dev = os.stat(progs.prog).st_dev
        assert f"no-large-folios-{os.major(dev)}:{os.minor(dev)}" in records, (at, records)
        for f in status["files"]:
            assert {w["state"] for w in f["windows"]} == {"unsupported"}, (at, f)
