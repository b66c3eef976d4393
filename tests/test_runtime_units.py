"""The systemd units and the package triggers: `systemd-analyze verify` on the units,
their sandbox, the service started for real where systemd is PID 1 (otherwise its
ExecStart run directly under the unit's privilege and priority limits), and the
trigger helper run the way rpm and dpkg run it."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testkit import HP
from testkit.cli import write_launcher
from testkit.runtime import REPO, Programs, copy_programs, drop_caches, exec_segment_size, locked, run_mappings

UNITS = REPO / "systemd"
SERVICE = UNITS / "hugify-prefetch.service"
TIMER = UNITS / "hugify-prefetch.timer"
TRIGGER = UNITS / "hugify-prefetch-trigger"
MOUNT = UNITS / "run-hugify-shared.mount"
GENERATOR = UNITS / "hugify-shared-generator.in"


@pytest.fixture
def launcher(tmp_path: Path) -> Path:
    """An executable `hugify` that runs this checkout's CLI (what /usr/bin/hugify is)."""
    return write_launcher(tmp_path / "hugify")


def manifest_for(progs: Programs, directory: Path, name: str = "test.list") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    lines = [f"{p}\t-\t{HP:#x}\t{exec_segment_size(p):#x}\t{HP:#x}" for p in sorted(progs.files)]
    m = directory / name
    m.write_text("# hugify manifest v1\n" + "\n".join(lines) + "\n")
    return m


def unit_value(unit: Path, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in unit.read_text().splitlines() if line.startswith(f"{key}=")]


def installed_units(tmp_path: Path, launcher: Path) -> tuple[Path, Path]:
    """The units as `make install` installs them for a hugify at `launcher`."""
    d = tmp_path / "units"
    d.mkdir()
    (d / SERVICE.name).write_text(SERVICE.read_text().replace("/usr/bin/hugify", str(launcher)))
    shutil.copy(TIMER, d / TIMER.name)
    shutil.copy(MOUNT, d / MOUNT.name)
    return d / SERVICE.name, d / TIMER.name


def systemd_is_pid1() -> bool:
    return Path("/run/systemd/system").is_dir() and Path("/proc/1/comm").read_text().strip() == "systemd"


# --- units -----------------------------------------------------------------------------------


def test_units_verify_clean(tmp_path: Path, launcher: Path):
    service, timer = installed_units(tmp_path, launcher)
    mount = service.parent / MOUNT.name
    res = subprocess.run(
        ["systemd-analyze", "verify", service, timer, mount], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout + res.stderr == "", res.stdout + res.stderr


def test_the_shared_copies_tmpfs_is_mounted_before_the_service_as_hugify_mounts_it():
    """run-hugify-shared.mount mounts the copies' tmpfs where hugify/shared.py mounts it
    itself (outside systemd), with the same options (root's alone, huge=within_size,
    nosuid and nodev but executable: the copies are mapped executable) and a size of the
    default budget and the records' room; the sandboxed service, which may not mount,
    comes after it and may write there."""
    from hugify import policy, shared

    assert unit_value(MOUNT, "Where") == ["/run/hugify/shared"]
    assert unit_value(MOUNT, "Type") == ["tmpfs"] and unit_value(MOUNT, "What") == [shared.MOUNT_SOURCE]
    (options,) = unit_value(MOUNT, "Options")
    opts = options.split(",")
    assert set(shared.MOUNT_OPTIONS.split(",")) <= set(opts) and {"nosuid", "nodev"} <= set(opts), opts
    assert "noexec" not in opts and "exec" not in opts
    (size,) = [o.split("=", 1)[1] for o in opts if o.startswith("size=")]
    budget = policy.RUNTIME["shared_budget"].default
    assert int(size.rstrip("M")) << 20 == budget + shared.MOUNT_SLACK, size
    assert shared.shared_dir(Path("/run/hugify")) == Path(unit_value(MOUNT, "Where")[0])
    assert unit_value(SERVICE, "Wants") == [MOUNT.name]
    assert MOUNT.name in unit_value(SERVICE, "After")[0].split()
    assert unit_value(SERVICE, "ReadWritePaths") == ["-/run/hugify/shared"]


def installed_generator(tmp_path: Path) -> Path:
    """hugify-shared-generator as `make install` installs it, for this checkout's package."""
    g = tmp_path / "hugify-shared-generator"
    g.write_text(GENERATOR.read_text().replace("@PYTHON@", sys.executable).replace("@PYDIR@", str(REPO)))
    g.chmod(0o755)
    return g


def run_generator(tmp_path: Path, policy: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The generator run as systemd runs one (its normal, early and late directories)
    under the policy `policy` (HUGIFY_POLICY_PATH: in place of /usr/lib's and /etc's);
    the normal directory."""
    pfile = tmp_path / "policy.toml"
    pfile.write_text(policy)
    dirs = [tmp_path / d for d in ("normal", "early", "late")]
    for d in dirs:
        d.mkdir()
    env = {**os.environ, "HUGIFY_POLICY_PATH": str(pfile)}
    res = subprocess.run([installed_generator(tmp_path), *dirs], capture_output=True, text=True, env=env, check=False)
    return res, dirs[0]


def test_the_shared_copies_tmpfs_is_sized_from_the_policy(tmp_path: Path):
    """hugify-shared-generator, which systemd runs at boot and at every daemon-reload,
    writes a drop-in that sizes run-hugify-shared.mount from the policy's shared_budget
    and the records' room, with the unit's own options besides; systemd-analyze loads
    the unit with it (from the generator's directory in the unit path) cleanly, and the
    kernel mounts a tmpfs with those options at that size. On the old code the unit's
    size=260M held whatever the budget."""
    from hugify import shared

    budget = 64 << 20
    res, normal = run_generator(tmp_path, '[runtime]\nshared_budget = "64M"\n')
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")
    dropin = normal / f"{MOUNT.name}.d" / shared.MOUNT_DROPIN
    (options,) = unit_value(dropin, "Options")
    ((static,),) = [unit_value(MOUNT, "Options")]
    besides = [o for o in static.split(",") if not o.startswith("size=")]
    assert options.split(",") == [*besides, f"size={budget + shared.MOUNT_SLACK}"], (options, static)
    units = tmp_path / "units"
    units.mkdir()
    shutil.copy(MOUNT, units / MOUNT.name)
    verify = subprocess.run(
        ["systemd-analyze", "verify", MOUNT.name],
        capture_output=True,
        text=True,
        env={**os.environ, "SYSTEMD_UNIT_PATH": f"{normal}:{units}:"},
        check=False,
    )
    assert (verify.returncode, verify.stdout + verify.stderr) == (0, ""), verify.stdout + verify.stderr
    where = tmp_path / "shared"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, shared.MOUNT_SOURCE, str(where)], check=True)
    try:
        mount = shared.mount_of(where)
        assert mount is not None and mount.size == budget + shared.MOUNT_SLACK and mount.huge == "within_size"
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_the_generator_leaves_the_unit_s_size_when_the_policy_is_not_usable(tmp_path: Path):
    res, normal = run_generator(tmp_path, '[runtime]\nshared_budget = "lots"\n')
    assert res.returncode == 1 and res.stdout == "", res
    assert len(res.stderr.splitlines()) == 1 and "run-hugify-shared.mount keeps its own size" in res.stderr, res.stderr
    assert not list(normal.iterdir())


def test_service_is_sandboxed_tightly(tmp_path: Path, launcher: Path):
    service, _ = installed_units(tmp_path, launcher)
    res = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", service], capture_output=True, text=True, check=False
    )
    m = re.search(r"Overall exposure level for hugify-prefetch.service: ([0-9.]+) (\w+)", res.stdout)
    assert m, res.stdout + res.stderr
    assert float(m.group(1)) <= 1.5, res.stdout  # "OK" starts below 4.0
    for key, value in [
        ("Type", "oneshot"),
        ("ProtectSystem", "strict"),
        ("NoNewPrivileges", "yes"),
        ("PrivateNetwork", "yes"),
        ("IPAddressDeny", "any"),
        ("CapabilityBoundingSet", "CAP_DAC_READ_SEARCH"),
        ("Nice", "19"),
        ("IOSchedulingPriority", "7"),
        ("WantedBy", "sysinit.target"),
    ]:
        assert unit_value(service, key) == [value], key
    assert unit_value(TIMER, "WantedBy") == ["timers.target"]
    assert unit_value(TIMER, "OnUnitInactiveSec")


def test_service_runs_for_real(built: Programs, large_folio_dir: Path, tmp_path: Path, launcher: Path):
    """Where systemd is PID 1 the service is started with systemctl; otherwise its
    ExecStart runs directly, with the unit's capability bounding set, no new privileges,
    no network, and its CPU and I/O priority (what can be applied without systemd). The
    files on XFS (conftest.large_folio_dir): 2 MiB folios whatever the kernel."""
    progs = copy_programs(built, large_folio_dir / tmp_path.name / "bin")
    mdir = tmp_path / "manifest.d"
    manifest_for(progs, mdir)
    rdir = tmp_path / "run"
    service, _ = installed_units(tmp_path, launcher)
    (exec_start,) = unit_value(service, "ExecStart")
    argv = [*shlex.split(exec_start), "--manifest-dir", str(mdir), "--runtime-dir", str(rdir)]
    assert argv[:5] == [str(launcher), "prefetch", "--all", "--boot", "--quiet"]
    ok = {0, *map(int, unit_value(service, "SuccessExitStatus")[0].split())}
    with locked():
        drop_caches()
        if systemd_is_pid1():
            unit = Path("/run/systemd/system/hugify-prefetch-test.service")
            dropin = Path(f"{unit}.d")
            text = service.read_text().replace(exec_start, shlex.join(argv))
            unit.write_text(text.replace("ConditionPathIsDirectory=/usr/lib/hugify/manifest.d", ""))
            dropin.mkdir(exist_ok=True)
            rdir.mkdir()
            # this test's files live in /tmp and its Python under /root: let the sandbox see them
            (dropin / "test.conf").write_text(f"[Service]\nPrivateTmp=no\nProtectHome=no\nReadWritePaths={rdir}\n")
            try:
                subprocess.run(["systemctl", "daemon-reload"], check=True)
                subprocess.run(["systemctl", "start", unit.name], check=True)
                result = subprocess.run(
                    ["systemctl", "show", "-P", "Result", unit.name], capture_output=True, text=True, check=True
                ).stdout.strip()
                assert result == "success"
            finally:
                unit.unlink()
                shutil.rmtree(dropin)
                subprocess.run(["systemctl", "daemon-reload"], check=False)
        else:
            (cap,) = unit_value(service, "CapabilityBoundingSet")
            wrap = [
                "unshare",
                "--net",
                "setpriv",
                "--no-new-privs",
                f"--bounding-set=-all,+{cap.removeprefix('CAP_').lower()}",
                "nice",
                "-n",
                unit_value(service, "Nice")[0],
                "ionice",
                "-c",
                "2",
                "-n",
                unit_value(service, "IOSchedulingPriority")[0],
            ]
            res = subprocess.run([*wrap, *argv], capture_output=True, text=True, check=False)
            assert res.returncode in ok, res.stdout + res.stderr
            assert res.stdout == "" and res.stderr == "", res.stdout + res.stderr  # --quiet: all is well
        maps = run_mappings([progs.prog])
    for p in (progs.prog, progs.lib):
        assert maps[str(p)].pmd == exec_segment_size(p)


# --- package triggers --------------------------------------------------------------------------


def trigger_env(tmp_path: Path, launcher: Path, **extra: str) -> dict[str, str]:
    """No systemctl on PATH: the helper runs the prefetch itself (the path taken in
    chroots, containers and package builds)."""
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    for t in ("sh", "cat", "grep", "xargs", "nice", "python3"):
        found = shutil.which(t)
        assert found, t
        (tools / t).symlink_to(found)
    return {"PATH": str(tools), "HUGIFY": str(launcher), **extra}


def test_rpm_file_trigger_prefetches_the_new_manifests(
    built: Programs, large_folio_dir: Path, tmp_path: Path, launcher: Path
):
    progs = copy_programs(built, large_folio_dir / tmp_path.name / "bin")
    mdir = tmp_path / "manifest.d"
    m = manifest_for(progs, mdir, "pkg-a.list")
    other = copy_programs(built, large_folio_dir / tmp_path.name / "other")
    manifest_for(other, mdir, "pkg-b.list")  # installed earlier: not in this transaction
    # what %transfiletriggerin gets on stdin: every installed path under the prefix
    stdin = f"{mdir}\n{m}\n"
    with locked():
        drop_caches()
        res = subprocess.run(
            [TRIGGER, "--stdin"],
            input=stdin,
            capture_output=True,
            text=True,
            env=trigger_env(tmp_path, launcher, HUGIFY_RUNTIME_DIR=str(tmp_path / "run")),
            check=False,
        )
        maps = run_mappings([progs.prog])
        untouched = run_mappings([other.prog])
    assert res.returncode == 0, res.stderr
    assert maps[str(progs.prog)].pmd == exec_segment_size(progs.prog)
    assert maps[str(progs.lib)].pmd == exec_segment_size(progs.lib)
    assert untouched[str(other.prog)].pmd == 0


def test_dpkg_trigger_prefetches_everything_and_never_fails(
    built: Programs, large_folio_dir: Path, tmp_path: Path, launcher: Path
):
    progs = copy_programs(built, large_folio_dir / tmp_path.name / "bin")
    mdir = tmp_path / "manifest.d"
    manifest_for(progs, mdir)
    (mdir / "broken.list").write_text("# hugify manifest v1\n/nonexistent/file\t-\t0x200000\t0x200000\t0x200000\n")
    env = trigger_env(tmp_path, launcher, HUGIFY_MANIFEST_DIR=str(mdir), HUGIFY_RUNTIME_DIR=str(tmp_path / "run"))
    with locked():
        drop_caches()
        res = subprocess.run([TRIGGER], capture_output=True, text=True, env=env, check=False)
        maps = run_mappings([progs.prog])
    assert res.returncode == 0, res.stderr  # a missing file is reported, not fatal to dpkg
    assert "/nonexistent/file: not found" in res.stderr
    assert maps[str(progs.prog)].pmd == exec_segment_size(progs.prog)
    broken = subprocess.run(
        [TRIGGER], capture_output=True, text=True, env={**env, "HUGIFY": "/nonexistent/hugify"}, check=False
    )
    assert broken.returncode == 0


def test_rpm_removal_trigger_runs_over_every_manifest(built: Programs, tmp_path: Path, launcher: Path):
    """%transfiletriggerpostun (a package's manifest removed): the helper takes the
    removed paths from stdin and runs over every manifest, which is what drops the
    shared copies of files no longer installed (hugify/shared.py)."""
    progs = copy_programs(built, tmp_path / "bin")
    mdir = tmp_path / "manifest.d"
    manifest_for(progs, mdir)
    calls = tmp_path / "calls"
    fake = tmp_path / "fake-hugify"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    fake.chmod(0o755)
    env = trigger_env(tmp_path, launcher, HUGIFY=str(fake))
    res = subprocess.run(
        [TRIGGER, "--removed"], input=f"{mdir}/gone.list\n", capture_output=True, text=True, env=env, check=False
    )
    assert res.returncode == 0, res.stderr
    assert calls.read_text() == "prefetch --quiet --all\n"


def test_trigger_declarations(tmp_path: Path):
    """The dpkg triggers file and the rpm scriptlet are accepted by dpkg-deb and rpmspec."""
    dpkg = UNITS / "dpkg"
    lines = [x for x in (dpkg / "hugify-runtime.triggers").read_text().splitlines() if x and not x.startswith("#")]
    assert lines == ["interest-noawait /usr/lib/hugify/manifest.d"]
    pkg = tmp_path / "deb"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "DEBIAN" / "control").write_text(
        "Package: hugify-runtime-test\nVersion: 1\nArchitecture: all\nMaintainer: t <t@example.org>\nDescription: t\n"
    )
    shutil.copy(dpkg / "hugify-runtime.triggers", pkg / "DEBIAN" / "triggers")
    post = (dpkg / "hugify-runtime.postinst").read_text().replace("#DEBHELPER#\n", "")
    (pkg / "DEBIAN" / "postinst").write_text(post)
    (pkg / "DEBIAN" / "postinst").chmod(0o755)
    subprocess.run(["dpkg-deb", "--build", pkg, tmp_path / "t.deb"], capture_output=True, check=True)
    info = subprocess.run(
        ["dpkg-deb", "-I", tmp_path / "t.deb", "triggers"], capture_output=True, text=True, check=True
    )
    assert "interest-noawait /usr/lib/hugify/manifest.d" in info.stdout
    assert subprocess.run(["sh", "-n", dpkg / "hugify-runtime.postinst"], check=False).returncode == 0

    spec = tmp_path / "t.spec"
    spec.write_text(
        "Name: hugify-runtime-test\nVersion: 1\nRelease: 1\nSummary: t\nLicense: MIT\nBuildArch: noarch\n"
        "%description\nt\n%files\n" + (UNITS / "rpm" / "hugify-runtime.triggers.spec").read_text()
    )
    parsed = subprocess.run(["rpmspec", "--parse", spec], capture_output=True, text=True, check=False)
    assert parsed.returncode == 0, parsed.stderr
    assert (
        "%transfiletriggerin -- /usr/lib/hugify/manifest.d\n/usr/lib/hugify/prefetch-trigger --stdin" in parsed.stdout
    )
    assert (
        "%transfiletriggerpostun -- /usr/lib/hugify/manifest.d\n/usr/lib/hugify/prefetch-trigger --removed"
        in parsed.stdout
    )
