#!/usr/bin/env python3
"""What hugify-prefetch.service costs at boot in a booted guest, at distribution scale,
and what `runtime.boot_budget` bounds (issue 20, item 6; bench/boot_prefetch.py
measures the same on the host, not booted).

The root of the kernel matrix (testkit/vm/boot.py: Debian 12 with systemd and hugify's
.deb) gets the hugified files of the test corpus (bench/boot_prefetch.py's tree: 18
Debian packages through `hugify tree`, stripped files allowed) under PREFIX, with one
manifest per package in /usr/lib/hugify/manifest.d listing them where they are in the
guest. Nothing in the guest runs them, so no window is busy. Each (kernel, filesystem)
is booted once under qemu; the real service runs at boot with the shipped policy
(boot_budget as shipped) and testkit/vm/guest/boot_cost_guest.py then measures it, and the
service started again from dropped caches per budget, against `cat` of the same files
in the same rounds (its docstring says how and from where).

Boots are cached by their inputs (testkit.vm.boot.boot), so a second run only boots what
changed. Must run as root (loop devices, chroot).

usage: tools/bench boot_cost_vm [--only SUITE:FS ...] [--rounds N]
       [--budgets 0,64M,256M,512M,none] [--thp MODE] [--json OUT]
       (none: no bound; 0: the service loads nothing, its fixed cost)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from testkit import REPO
from testkit.cache import build_dir, build_once, cache_root
from testkit.corpus import CORPUS, hugified_tree, parse_size
from testkit.debian import files_key, hugify_inputs
from testkit.vm.boot import ACCEL, GUEST, MEMORY_MIB, UNIT_NAME, RootExtra, VmError, boot, guest_inputs, root_image
from testkit.vm.guest.boot_cost_guest import UNBOUNDED, UNBOUNDED_BYTES
from testkit.vm.kernels import KernelUnavailable
from testkit.vm.matrix import resolve

GUEST_DRIVER = GUEST / "boot_cost_guest.py"
#: Where the corpus's files are installed in the guest: not over the guest's own
#: libraries (libstdc++, libsystemd-shared, … of possibly other versions).
PREFIX = "/opt/hugify-corpus"
UNIT = "hugify-boot-cost.service"
# Type=exec: the boot counts as finished (systemd-analyze) once the driver started;
# the driver waits for that itself.
UNIT_TEXT = """[Unit]
Description=hugify boot cost: measure hugify-prefetch.service, then power off
After=multi-user.target hugify-prefetch.service

[Service]
Type=exec
ExecStart=/usr/bin/python3 /hugify-boot-cost/driver.py
StandardOutput=journal+console
StandardError=journal+console
FailureAction=poweroff

[Install]
WantedBy=multi-user.target
"""
#: Writes the boot budget named on the kernel command line (hugify.boot_budget=BYTES,
#: -1: no bound) into /etc/hugify/policy.toml before the service's run at boot, so that
#: boots of one image can differ in it; without the argument its unit does not run.
BOOT_POLICY_SH = r"""for a in $(cat /proc/cmdline); do
    case $a in hugify.boot_budget=*)
        b=${a#*=}
        [ "$b" = -1 ] && b=NO_BOUND
        mkdir -p /etc/hugify
        printf '[runtime]\nboot_budget = %s\n' "$b" > /etc/hugify/policy.toml ;;
    esac
done
""".replace("NO_BOUND", str(UNBOUNDED_BYTES))
BOOT_POLICY_UNIT = """[Unit]
Description=hugify boot cost: the boot budget of the kernel command line
DefaultDependencies=no
After=local-fs.target
Before=hugify-prefetch.service
ConditionKernelCommandLine=hugify.boot_budget

[Service]
Type=oneshot
ExecStart=/bin/sh /hugify-boot-cost/boot-policy.sh

[Install]
WantedBy=sysinit.target
"""
#: The bytes the service's cgroup read, printed to the journal after its run (while the
#: cgroup exists: systemd 252 logs a run's resources after removing it, without them).
#: Adds a `cat` after the run, before the unit's job ends (its own reads, about 40 KiB,
#: count too).
IO_DROPIN = """[Service]
IOAccounting=yes
ExecStopPost=-/bin/cat /sys/fs/cgroup/system.slice/hugify-prefetch.service/io.stat
"""
#: The corpus's whole files (410 MiB) and the matrix's root do not fit the matrix's 3 GiB.
IMAGE_SIZE = "5G"
DEFAULT_PAIRS = ("trixie:xfs", "newest:ext4", "trixie:ext4")
#: Part of the payload's key: bump it when payload() changes what it makes.
PAYLOAD_RECIPE = "2"


def package_of_paths(corpus: Path) -> dict[str, str]:
    """Installed path -> the corpus package that ships it (dpkg-deb -c of its .deb)."""
    out: dict[str, str] = {}
    for deb in sorted(corpus.parent.glob("*.deb")):
        listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
        for line in listing.splitlines():
            name = line.split(None, 5)[5].split(" -> ")[0].split(" link to ")[0]
            out[name.removeprefix(".")] = deb.name.split("_")[0]
    return out


def payload() -> Path:
    """PREFIX with the hugified files and usr/lib/hugify/manifest.d with their manifests
    (one per package, paths under PREFIX), cached by the corpus and hugify's code."""
    roots = sorted((cache_root() / CORPUS).glob("root-*"))
    if not roots:
        raise SystemExit(f"no corpus under {cache_root() / CORPUS}: run tests/test_debian_corpus.py once")
    corpus = roots[-1]
    key = files_key(
        [*hugify_inputs(), ("hugified_tree", REPO / "testkit" / "corpus.py")],
        corpus.name,
        PREFIX,
        PAYLOAD_RECIPE,
    )
    final = build_dir("boot-cost", "payload", key)

    def make(work: Path) -> None:
        manifests = work / "usr" / "lib" / "hugify" / "manifest.d"
        manifests.mkdir(parents=True)
        with tempfile.TemporaryDirectory(dir=cache_root()) as tmp:
            manifest = Path(tmp) / "manifest"
            hugified_tree(Path(tmp), manifest)
            tree = Path(tmp) / "root"
            owners = package_of_paths(corpus)
            header, *lines = manifest.read_text().splitlines()
            by_package: dict[str, list[str]] = {}
            copied: dict[tuple[int, int], Path] = {}
            for line in lines:
                if not line or line.startswith("#"):
                    continue
                path = line.split("\t", 1)[0]
                src, dest = tree / path.lstrip("/"), work / PREFIX.lstrip("/") / path.lstrip("/")
                dest.parent.mkdir(parents=True, exist_ok=True)
                st = src.stat()
                if (st.st_dev, st.st_ino) in copied:  # hardlinked names stay one inode
                    os.link(copied[st.st_dev, st.st_ino], dest)
                else:
                    shutil.copy2(src, dest)
                    copied[st.st_dev, st.st_ino] = dest
                by_package.setdefault(owners.get(path, "hugify-corpus"), []).append(PREFIX + line)
            for pkg, entries in by_package.items():
                (manifests / f"{pkg}.list").write_text("\n".join([header, *entries]) + "\n")

    return build_once(final, cache_root() / "boot-cost" / "payload.lock", make)


def root_extra(rounds: int, budgets: list[int]) -> RootExtra:
    files = payload()

    def stage(root: Path) -> None:
        subprocess.run(["cp", "-a", f"{files}/.", str(root)], check=True)
        (root / "hugify-boot-cost").mkdir()
        shutil.copy(GUEST_DRIVER, root / "hugify-boot-cost" / "driver.py")
        units = root / "etc" / "systemd" / "system"
        (units / "multi-user.target.wants" / UNIT_NAME).unlink()  # not the matrix's driver
        (units / UNIT).write_text(UNIT_TEXT)
        (units / "multi-user.target.wants" / UNIT).symlink_to(f"../{UNIT}")
        (root / "hugify-boot-cost" / "boot-policy.sh").write_text(BOOT_POLICY_SH)
        (units / "hugify-boot-cost-policy.service").write_text(BOOT_POLICY_UNIT)
        (units / "sysinit.target.wants").mkdir(exist_ok=True)
        (units / "sysinit.target.wants" / "hugify-boot-cost-policy.service").symlink_to(
            "../hugify-boot-cost-policy.service"
        )
        dropin = units / "hugify-prefetch.service.d"
        dropin.mkdir()
        (dropin / "io.conf").write_text(IO_DROPIN)
        # The timer's first run (15 minutes after boot) would land in the driver's rounds.
        (units / "hugify-prefetch.timer").symlink_to("/dev/null")
        (root / "etc" / "hostname").write_text("hugify-boot-cost\n")

    key = files_key([("driver", GUEST_DRIVER)], files.name, UNIT_TEXT, BOOT_POLICY_SH, BOOT_POLICY_UNIT, IO_DROPIN)
    # no_timer_check: under TCG on a busy host the kernel's IO-APIC timer check can fail
    # and panic ("IO-APIC + timer doesn't work!"); the check proves nothing here.
    args = f"no_timer_check hugify.rounds={rounds} hugify.budgets={','.join(map(str, budgets))}"
    return RootExtra("bootcost", key, stage, IMAGE_SIZE, args)


def case_name(budget: str) -> str:
    if budget == "cat":
        return "cat"
    b = int(budget)
    return "no bound" if b == UNBOUNDED else f"budget {b >> 20} MiB"


def mib(n: float | None) -> float | None:
    return None if n is None else round(n / 2**20, 1)


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """The boot's figures; per case, medians over the rounds and the service's time over
    cat's of the same round (median and range)."""
    boot_run = results["boot"]
    manager = boot_run["manager"]
    userspace = int(manager["UserspaceTimestampMonotonic"]) / 1e6
    service = boot_run["service"]
    out: dict[str, Any] = {
        "uname": results["uname"],
        "root_fs": results["root_fs"],
        "files": results["files"],
        "file_mib": mib(results["file_bytes"]),
        "boot": {
            "service_s": service["seconds"],
            "service_start_after_userspace_s": round(service["start_s"] - userspace, 2) if service["seconds"] else None,
            "service_read_mib": mib(service["read_bytes"]),
            "cache_mib": mib(boot_run["cached_bytes"]),
            "windows": boot_run["windows"],
            "basic_target_after_userspace_s": round(boot_run["basic_target_s"] - userspace, 2),
            "userspace_s": round(int(manager["FinishTimestampMonotonic"]) / 1e6 - userspace, 2),
            "analyze": boot_run["analyze"],
            "result": service["props"].get("Result"),
        },
        "cases": {},
    }
    rounds = results["rounds"]
    # cat, then the budgets from the smallest, no bound last
    for name in sorted(
        rounds[0] if rounds else [], key=lambda n: -2 if n == "cat" else 1 << 60 if n == "-1" else int(n)
    ):
        runs = [r[name] for r in rounds]
        ratios = sorted(r[name]["seconds"] / r["cat"]["seconds"] for r in rounds)
        unit_read = [r["read_bytes"] for r in runs if r.get("read_bytes") is not None]
        out["cases"][case_name(name)] = {
            "seconds": round(statistics.median(r["seconds"] for r in runs), 2),
            "over_cat": round(statistics.median(ratios), 2),
            "over_cat_range": [round(ratios[0], 2), round(ratios[-1], 2)],
            "unit_read_mib": mib(statistics.median(unit_read)) if unit_read else None,
            "disk_read_mib": mib(statistics.median(r["disk_read_bytes"] for r in runs)),
            "cache_mib": mib(statistics.median(r["cached_bytes"] for r in runs)),
            "windows": runs[-1].get("windows", {}),
        }
    return out


def huge_of(windows: dict[str, int]) -> str:
    total = sum(windows.values())
    return f"{windows.get('huge', 0)}/{total}" if total else "-"


def boot_line(b: dict[str, Any]) -> str:
    service = "masked" if b["service_s"] is None else f"{b['service_s']:.2f} s ({b['result']})"
    return (
        f"service {service}, read {b['service_read_mib']} MiB, left {b['cache_mib']} MiB of the files cached, "
        f"{huge_of(b['windows'])} windows huge; basic.target {b['basic_target_after_userspace_s']} s and "
        f"the boot {b['userspace_s']} s after userspace started"
    )


def print_row(label: str, s: dict[str, Any]) -> None:
    print(f"\n{label}: {s['files']} files ({s['file_mib']} MiB); at boot: {boot_line(s['boot'])}")
    print(f"  {'case':<16} {'s':>7} {'/cat':>6} {'range':>13} {'unit MiB':>9} {'disk MiB':>9} {'cache MiB':>10} huge")
    for name, c in s["cases"].items():
        lo, hi = c["over_cat_range"]
        unit = "-" if c["unit_read_mib"] is None else f"{c['unit_read_mib']:.0f}"
        print(
            f"  {name:<16} {c['seconds']:7.2f} {c['over_cat']:6.2f} {f'[{lo:.2f}, {hi:.2f}]':>13} {unit:>9} "
            f"{c['disk_read_mib']:9.0f} {c['cache_mib']:10.0f} {huge_of(c['windows'])}"
        )


def variant_args(variant: str) -> str:
    """The kernel's command line for a boot-only variant: the shipped policy (default),
    the service masked, or another boot budget (a size, or none)."""
    if variant == "default":
        return ""
    if variant == "masked":
        return "systemd.mask=hugify-prefetch.service"
    return f"hugify.boot_budget={UNBOUNDED if variant == 'none' else parse_size(variant)}"


def main() -> int:
    ap = argparse.ArgumentParser(
        prog="tools/bench boot_cost_vm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", nargs="*", default=list(DEFAULT_PAIRS), help="SUITE:FS pairs (suite or newest)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budgets", default="0,64M,128M,512M,none")
    ap.add_argument(
        "--boot-variants",
        default="",
        help="boots without rounds on the first pair, e.g. default,masked,0,none: the boot's own time "
        "with the shipped policy, without the service, with another boot budget",
    )
    ap.add_argument("--repeats", type=int, default=2, help="boots per variant")
    ap.add_argument("--parallel", type=int, default=1, help="guests at once")
    ap.add_argument("--thp", default="madvise", help="the THP mode booted (Debian's kernels default to madvise)")
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "boot_cost_vm.json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("root needed: loop devices and chroot make the images")
    budgets = [UNBOUNDED if b == "none" else parse_size(b) for b in args.budgets.split(",")]
    extra = root_extra(args.rounds, budgets)
    jobs: list[tuple[str, str, str, RootExtra]] = []
    for pair in args.only:
        suite, fs = pair.split(":", 1)
        jobs.append((suite, fs, "", extra))
    for variant in filter(None, args.boot_variants.split(",")):
        suite, fs = args.only[0].split(":", 1)
        for i in range(args.repeats):
            more = f"no_timer_check hugify.rounds=0 {variant_args(variant)} hugify.repeat={i}"
            jobs.append((suite, fs, variant, dataclasses.replace(extra, kernel_args=more)))
    # Every kernel and image first, once (kernels and images each share a lock), then the guests.
    kernels = {}
    for suite, fs, _, _ in jobs:
        if suite not in kernels:
            try:
                kernels[suite] = resolve(suite)
            except KernelUnavailable as e:
                raise SystemExit(f"{suite}: {e}") from None
        root_image(fs, guest_inputs(), extra)

    def one(job: tuple[str, str, str, RootExtra]) -> dict[str, Any]:
        suite, fs, variant, x = job
        try:
            b = boot(kernels[suite], fs, args.thp, x)
        except VmError as e:
            print(f"{suite} on {fs} {variant}: {e}", file=sys.stderr)
            return {"suite": suite, "fs": fs, "variant": variant, "error": str(e)}
        row = {"kernel": b.kernel.label, "package": f"{b.kernel.package} {b.kernel.version}", "fs": fs}
        return (
            row
            | {"variant": variant or "rounds", "kernel_args": x.kernel_args, "qemu_seconds": b.seconds}
            | {"guest_results": str(b.dir / "results.json")}
            | summary(b.results)
        )

    with ThreadPoolExecutor(args.parallel) as pool:
        done = list(pool.map(one, jobs))
    rows = [r for r in done if "error" not in r]
    errors = [r for r in done if "error" in r]
    for r in rows:
        if r["variant"] == "rounds":
            print_row(f"{r['kernel']} on {r['fs']}", r)
    variants = [r for r in rows if r["variant"] != "rounds"]
    if variants:
        print("\nboots without rounds:")
    for r in variants:
        print(f"  {r['kernel']} on {r['fs']}, {r['variant']:<8} {r['kernel_args'].split()[-1]}: {boot_line(r['boot'])}")
    doc = {
        "date": datetime.date.today().isoformat(),
        "command": " ".join(["bench/boot_cost_vm.py", *sys.argv[1:]]),
        "accel": ACCEL,
        "memory_mib": MEMORY_MIB,
        "thp": args.thp,
        "rows": rows,
        "errors": errors,
    }
    args.json.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(args.json)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
