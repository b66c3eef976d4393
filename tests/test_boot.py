"""hugify's runtime under a real systemd: a Debian 12 container booted with
systemd as PID 1.

The root is made by `mmdebstrap --variant=minbase --include=systemd,systemd-sysv,
dbus,…` (hugify's own dependencies added; cached by that package list, see
testkit/debian_roots.py). Each session boots a copy-on-write overlay of it (upper
layer on the cache's disk, not tmpfs: the page cache of the installed files must
be able to hold 2 MiB folios). Before the boot, hugify's .deb and the hugified
library of the test package (tests/deb, testkit.debian.build_variant("with")) are
installed with dpkg inside it. Then `systemd-nspawn --register=no --keep-unit
--boot` starts it: this host has no systemd, so nothing registers with machined
and nothing is driven with machinectl. A oneshot unit in the container
(hugify-boot-test.service, after multi-user.target) records what systemd says of
hugify-prefetch.service and its timer, installs the test package's program and its
non-PIE program listed as-is (whose manifests fire hugify's dpkg trigger, which starts
the service through systemctl),
records `hugify status`, writes everything to a bind-mounted directory and powers
the container off. The whole session runs in its own mount and PID namespaces
with a bounded timeout: when it ends or is killed, the container dies with it.

A session's results are cached keyed by its inputs (the root, hugify's .deb, the
test package's build, the scripts); a session whose container did not finish is
not cached.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit import HP
from testkit.cache import build_dir, building, cache_root, locked
from testkit.debian import EXEC, LIB, PROG, build_hugify_deb, build_variant, files_key
from testkit.debian_roots import PRIVATE_SESSION, systemd_root
from testkit.elf import readelf_windows, window_offsets
from testkit.runtime import gives_large_folios
from testkit.runtime import locked as runtime_lock

TEST_UNIT = "hugify-boot-test.service"
BOOT_TIMEOUT = 600

UNIT = """\
[Unit]
Description=hugify boot test: record the runtime's state, then power off
After=multi-user.target hugify-prefetch.service

[Service]
Type=oneshot
ExecStart=/bin/sh /hugify-test/inside.sh
StandardOutput=append:/hugify-test/out/inside.log
StandardError=inherit
TimeoutStartSec=5min
FailureAction=poweroff

[Install]
WantedBy=multi-user.target
"""

#: Runs inside the booted container, as TEST_UNIT.
INSIDE = r"""
set -x
O=/hugify-test/out
svc=hugify-prefetch.service
props=ActiveState,Result,ExecMainCode,ExecMainStatus,InvocationID
# Not --wait: this unit is part of the boot transaction that it would wait for.
systemctl is-system-running > $O/system-state 2>&1 || true
systemctl list-units --failed --plain --no-legend > $O/failed-units
cat /proc/1/comm > $O/pid1
systemctl show -p $props $svc > $O/service-boot
systemctl show -p ProtectSystem,PrivateNetwork,NoNewPrivileges,CapabilityBoundingSet,SystemCallFilter $svc \
    > $O/service-sandbox
journalctl -b --no-pager -o short-monotonic -u $svc > $O/journal-boot
systemctl is-active hugify-prefetch.timer > $O/timer-active 2>&1 || true
systemctl is-enabled hugify-prefetch.timer > $O/timer-enabled 2>&1 || true
before=$(systemctl show -p InvocationID --value $svc)
rc=0
dpkg -i /hugify-test/debs/second/*.deb > $O/install-second.log 2>&1 || rc=$?
echo $rc > $O/install-second.rc
# The trigger starts the service without waiting (--no-block): wait for a new run to end.
for i in $(seq 120); do
    inv=$(systemctl show -p InvocationID --value $svc)
    state=$(systemctl show -p ActiveState --value $svc)
    [ "$inv" != "$before" ] && [ "$state" != activating ] && break
    sleep 1
done
systemctl show -p $props $svc > $O/service-trigger
journalctl -b --no-pager -o short-monotonic -u $svc > $O/journal-trigger
hugify status > $O/status.txt 2>&1 || true
hugify status --json > $O/status.json 2> $O/status.err || true
echo ok > $O/done
systemctl --no-block poweroff
"""

#: Runs on the host in private mount and PID namespaces: $1 the session directory,
#: $2 the cached root.
SESSION = r"""
set -euo pipefail
W=$1 ROOT=$2
mount -t overlay hugify-boot -o "lowerdir=$ROOT,upperdir=$W/upper,workdir=$W/work" "$W/merged"
M=$W/merged
mkdir -p "$M/hugify-test"
install -m 0644 "$W/hugify-boot-test.service" "$M/etc/systemd/system/"
mkdir -p "$M/etc/systemd/system/multi-user.target.wants"
ln -s ../hugify-boot-test.service "$M/etc/systemd/system/multi-user.target.wants/hugify-boot-test.service"
nspawn=(systemd-nspawn --register=no --keep-unit --quiet -D "$M" --bind="$W/share:/hugify-test")
echo "== dpkg -i hugify and the first hugified package (not booted)"
"${nspawn[@]}" --pipe sh -c 'dpkg -i /hugify-test/debs/first/*.deb'
echo "== boot"
"${nspawn[@]}" --boot --console=read-only
"""


@dataclass
class Boot:
    dir: Path

    def text(self, name: str) -> str:
        p = self.dir / "share" / "out" / name
        return p.read_text() if p.exists() else ""

    def props(self, name: str) -> dict[str, str]:
        return dict(line.split("=", 1) for line in self.text(name).splitlines() if "=" in line)

    def ok(self) -> Boot:
        log = (self.dir / "session.log").read_text()
        assert self.text("done") == "ok\n", f"the container did not finish its test unit:\n{log[-8000:]}"
        return self


def run_session(work: Path, root: Path) -> None:
    """Boots the container; kills it (its whole PID namespace) after BOOT_TIMEOUT."""
    with (work / "session.log").open("w") as log:
        proc = subprocess.Popen(
            [
                *PRIVATE_SESSION,
                "bash",
                "-c",
                SESSION,
                "session",
                str(work),
                str(root),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            rc = proc.wait(timeout=BOOT_TIMEOUT)
        except subprocess.TimeoutExpired:
            rc = -1
            log.write(f"\n== killed after {BOOT_TIMEOUT} s\n")
        finally:
            # unshare's child is the PID namespace's init (--kill-child): when it dies,
            # every process of the namespace dies, the container's too.
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
    (work / "session.rc").write_text(str(rc))


@pytest.fixture(scope="module")
def boot() -> Boot:
    hugify = build_hugify_deb().ok()
    pkgs = build_variant("with").ok()
    root = systemd_root(hugify.deb("hugify"))
    first = [*hugify.installable(), pkgs.deb("libhugdebtest1")]
    second = [pkgs.deb("hugify-deb-test"), pkgs.deb("hugify-deb-test-exec")]
    key = files_key([(p.name, p) for p in first + second], root.parent.name, UNIT, INSIDE, SESSION)
    final = build_dir("boot", "session", key)
    if (final / "share" / "out" / "done").exists():
        return Boot(final)
    with locked(cache_root() / "boot" / "session.lock"):
        if (final / "share" / "out" / "done").exists():
            return Boot(final)
        with building(final, finished=lambda work: (work / "share" / "out" / "done").exists()) as work:
            for d in ("upper", "work", "merged", "share/out", "share/debs/first", "share/debs/second"):
                (work / d).mkdir(parents=True)
            for p in first:
                shutil.copy(p, work / "share/debs/first")
            for p in second:
                shutil.copy(p, work / "share/debs/second")
            (work / "share" / "inside.sh").write_text(INSIDE)
            (work / TEST_UNIT).write_text(UNIT)
            # From the boot service's prefetch to `hugify status`, the session reads the
            # host's page cache: the runtime tests, which drop it, wait.
            with runtime_lock():
                run_session(work, root)
            # The overlay's layers are only needed while it runs.
            for d in ("upper", "work", "merged"):
                shutil.rmtree(work / d, ignore_errors=True)
    # Unfinished, the session stays in its scratch directory, for the tests to report.
    return Boot(final if final.is_dir() else work)


def test_container_boots_with_systemd_as_pid1(boot: Boot) -> None:
    b = boot.ok()
    assert b.text("pid1") == "systemd\n"
    # The test unit is still part of the boot, so the system is "starting".
    assert b.text("system-state").strip() == "starting", b.text("system-state")
    assert b.text("failed-units") == "", b.text("failed-units")


def test_prefetch_service_ran_at_boot_under_its_sandbox(boot: Boot) -> None:
    b = boot.ok()
    props = b.props("service-boot")
    assert props["Result"] == "success" and props["ExecMainStatus"] == "0", props
    assert props["ExecMainCode"] == "1", props  # exited (not killed, not failed to start)
    sandbox = b.props("service-sandbox")
    assert sandbox["ProtectSystem"] == "strict" and sandbox["PrivateNetwork"] == "yes", sandbox
    assert sandbox["NoNewPrivileges"] == "yes" and sandbox["CapabilityBoundingSet"] == "cap_dac_read_search", sandbox
    journal = b.text("journal-boot")
    assert re.search(r"Finished hugify-prefetch\.service|Finished Load hugified programs", journal), journal


def test_prefetch_timer_is_active(boot: Boot) -> None:
    b = boot.ok()
    assert b.text("timer-enabled").strip() == "enabled"
    assert b.text("timer-active").strip() == "active"


def test_installing_a_hugified_package_starts_the_service_through_systemctl(boot: Boot) -> None:
    b = boot.ok()
    assert b.text("install-second.rc").strip() == "0", b.text("install-second.log")
    assert "Processing triggers for hugify" in b.text("install-second.log")
    before, after = b.props("service-boot"), b.props("service-trigger")
    assert after["InvocationID"] != before["InvocationID"], (before, after)
    assert after["Result"] == "success" and after["ExecMainStatus"] == "0", after
    starts = re.findall(r"Starting (?:hugify-prefetch\.service|Load hugified programs)", b.text("journal-trigger"))
    assert len(starts) == 2, b.text("journal-trigger")


def test_status_shows_the_installed_files_windows_huge(boot: Boot) -> None:
    """Where the filesystem of the container's root (the cache's disk) gives 2 MiB folios
    on this kernel, measured on the test package's library there without hugify, every
    window is huge; where it does not, every window is unsupported."""
    b = boot.ok()
    with runtime_lock():
        large = gives_large_folios(build_variant("with").ok().root / LIB)
    files = {f["path"]: f for f in json.loads(b.text("status.json"))["files"]}
    state = "huge" if large else "unsupported"
    for path in (f"/{PROG}", f"/{LIB}"):
        f = files[path]
        assert f["windows"] and all(w["state"] == state for w in f["windows"]), b.text("status.txt")
        assert f["huge_bytes"] == (f["code_size"] if large else 0) and f["code_size"] > 0, b.text("status.txt")
        coverage = "100.0" if large else "0.0"
        assert re.search(rf"^{re.escape(path)} .* {coverage} %", b.text("status.txt"), re.M), b.text("status.txt")
    # The program listed as-is: its whole windows alone (not all of its code) are huge.
    windows = window_offsets(readelf_windows(build_variant("with").ok().root / EXEC, fixed=True))
    f = files[f"/{EXEC}"]
    assert [w["offset"] for w in f["windows"]] == windows != [], b.text("status.txt")
    assert all(w["state"] == state for w in f["windows"]), b.text("status.txt")
    assert f["huge_bytes"] == (len(windows) * HP if large else 0) < f["code_size"], b.text("status.txt")
