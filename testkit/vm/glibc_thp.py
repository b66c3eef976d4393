"""glibc's own huge-page advice, the tunable glibc.elf.thp of glibc 2.44, in the kernel
matrix (bench/kernel_matrix.py's way "glibc.elf.thp", tests/test_kernel_matrix.py) and
on the host (tests/test_glibc_thp.py, in a chroot: host_root()).

- glibc_debs(): libc6 and libc-bin of the newest glibc with the tunable that Debian's
  experimental or sid has (2.44-3 in experimental when this was written), fetched with
  `apt-get download` through a private apt state (testkit.debian_roots.apt_options), once per
  version.
- unpack_glibc(root): both unpacked over a Debian 12 root (dpkg-deb -x: dpkg would
  refuse libc6 2.44 for its Breaks on bookworm's base-files; nothing of bookworm needs
  more than an older glibc gives), then that glibc's ldconfig, so that /etc/ld.so.cache
  is the new glibc's.
- host_root(): a minbase Debian 12 root with python3 and that glibc, for chroots on
  the host (cached; callers copy it before changing it).
- root_extra(): the kernel matrix's root (testkit/vm/boot.py) with that glibc, the guest
  driver testkit/vm/guest/glibc_thp_guest.py as its unit in place of the matrix's, and the
  prefetch timer masked (its run would land between the driver's cold starts).
- glibc_thp_row(b): a boot's results as the matrix's JSON keeps them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from testkit.cache import build_dir, build_once, building, cache_root, locked
from testkit.debian import files_key
from testkit.debian_roots import KEYRING, MIRROR, apt_options, debian_root
from testkit.vm.boot import GUEST, UNIT_NAME, RootExtra, VmError
from testkit.vm.kernels import update_lists

#: The first glibc with glibc.elf.thp.
GLIBC_SINCE = "2.44"
#: The suites searched for it, newest first.
GLIBC_SUITES = ("experimental", "sid")
GLIBC_PACKAGES = ("libc6", "libc-bin")
GUEST_DRIVER = GUEST / "glibc_thp_guest.py"
UNIT = "hugify-glibc-thp.service"
UNIT_TEXT = """[Unit]
Description=hugify kernel matrix: glibc.elf.thp cold starts, then power off
After=multi-user.target hugify-prefetch.service

[Service]
Type=oneshot
ExecStart=/usr/bin/python3 /hugify-matrix/glibc_thp_guest.py
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=40min
FailureAction=poweroff

[Install]
WantedBy=multi-user.target
"""
#: Part of the root's key: bump it when stage() changes what goes onto the root.
RECIPE = "1"


def _newest(opts: list[str]) -> str:
    """The highest libc6 version of GLIBC_SUITES' lists that is GLIBC_SINCE or later."""
    res = subprocess.run(["apt-cache", *opts, "madison", "libc6"], capture_output=True, text=True, check=False)
    versions = [f[1].strip() for f in (line.split("|") for line in res.stdout.splitlines()) if len(f) >= 3]
    best = ""
    for v in versions:
        newer = not best or subprocess.run(["dpkg", "--compare-versions", v, "gt", best], check=False).returncode == 0
        if newer and subprocess.run(["dpkg", "--compare-versions", v, "ge", GLIBC_SINCE], check=False).returncode == 0:
            best = v
    if not best:
        raise VmError(f"no libc6 {GLIBC_SINCE} or later in {', '.join(GLIBC_SUITES)}: {res.stdout.strip()[:300]}")
    return best


def glibc_debs() -> list[Path]:
    """libc6 and libc-bin of the newest glibc with the tunable, fetched once per version."""
    group = cache_root() / "glibc-thp"
    with locked(group / "debs.lock"):
        state = group / "apt"
        opts = apt_options(state, [f"deb [signed-by={KEYRING}] {MIRROR} {s} main" for s in GLIBC_SUITES])
        update_lists(state, opts)
        version = _newest(opts)
        final = build_dir("glibc-thp", "debs", files_key([], version, *GLIBC_PACKAGES))
        if not (final / "done").exists():
            with building(final) as work:
                wanted = [f"{p}={version}" for p in GLIBC_PACKAGES]
                res = subprocess.run(
                    ["apt-get", "-q", *opts, "download", *wanted], cwd=work, capture_output=True, text=True, check=False
                )
                debs = sorted(work.glob("*.deb"))
                if res.returncode != 0 or len(debs) != len(wanted):
                    raise VmError(f"apt-get download {' '.join(wanted)} failed: {res.stderr.strip()[-600:]}")
                (work / "done").write_text(version + "\n")
    return sorted(final.glob("*.deb"))


def glibc_version(debs: list[Path]) -> str:
    """The Debian version of the fetched glibc (e.g. 2.44-3)."""
    (libc6,) = [d for d in debs if d.name.startswith("libc6_")]
    return libc6.name.split("_")[1]


def unpack_glibc(root: Path, debs: list[Path]) -> None:
    """The glibc of `debs` over `root`, and its ldconfig run there."""
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    res = subprocess.run(["chroot", str(root), "/usr/sbin/ldconfig"], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise VmError(f"ldconfig of glibc {glibc_version(debs)} in {root} failed: {res.stderr.strip()[-400:]}")


def host_root() -> Path:
    """A minbase bookworm root with python3 and the newest glibc with the tunable."""
    debs = glibc_debs()
    base = debian_root("glibc-thp-base", "--variant=minbase", "--include=python3")
    final = build_dir("glibc-thp", "root", files_key([], base.parent.name, *(d.name for d in debs), RECIPE))

    def make(work: Path) -> None:
        subprocess.run(["cp", "-a", str(base), str(work / "root")], check=True)
        unpack_glibc(work / "root", debs)

    return build_once(final, cache_root() / "glibc-thp" / "root.lock", make, "root")


def root_extra() -> RootExtra:
    debs = glibc_debs()

    def stage(root: Path) -> None:
        unpack_glibc(root, debs)
        shutil.copy(GUEST_DRIVER, root / "hugify-matrix" / GUEST_DRIVER.name)
        units = root / "etc" / "systemd" / "system"
        (units / "multi-user.target.wants" / UNIT_NAME).unlink()  # not the matrix's driver
        (units / UNIT).write_text(UNIT_TEXT)
        (units / "multi-user.target.wants" / UNIT).symlink_to(f"../{UNIT}")
        (units / "hugify-prefetch.timer").symlink_to("/dev/null")

    key = files_key([("driver", GUEST_DRIVER)], *(d.name for d in debs), UNIT_TEXT, RECIPE)
    return RootExtra("glibcthp", key, stage)


# --- reading a boot --------------------------------------------------------------------

PROG = "/usr/bin/hugify-deb-test"
LIB = "/usr/lib/x86_64-linux-gnu/libhugdebtest.so.1"
EXEC = "/usr/libexec/hugify-deb-exec"


def _maps(step: dict[str, Any]) -> dict[str, list[int]]:
    """path -> [bytes PMD-mapped, bytes] of the run's executable mappings of the test files."""
    return {p: [m["pmd"], m["size"]] for p, m in step["maps"].items()}


def _ld_so_paths(step: dict[str, Any]) -> int:
    """How many ranges ld.so said it advised with MADV_HUGEPAGE and got 0 back."""
    return sum(1 for _, _, rc in step["madvise"] if rc == "0")


def glibc_thp_row(results: dict[str, Any]) -> dict[str, Any]:
    """One glibc boot as the matrix JSON keeps it: per read_ahead_kb and setting, per
    program run, the runs' exit status, mappings and ld.so's advice; the hint."""
    runs: dict[str, Any] = {}
    for ra, per_ra in results["runs"].items():
        runs[ra] = {}
        for setting, progs in per_ra.items():
            runs[ra][setting] = {
                name: {
                    "rc": step["rc"],
                    "maps": _maps(step),
                    "advised": _ld_so_paths(step),
                    "windows": step["windows"],
                    "collapsed": step["collapsed"],
                }
                for name, step in progs.items()
                if isinstance(step, dict) and "maps" in step
            }
            if setting == "system":
                runs[ra][setting]["hint"] = [
                    line for line in str(progs["status_text"]).splitlines() if "glibc.elf.thp" in line
                ]
                runs[ra][setting]["advice"] = progs["status"].get("system", {}).get("glibc_elf_thp")
    return {
        "glibc": results["glibc"],
        "thp": results["thp"],
        "read_ahead_default": results["read_ahead_default"],
        "runs": runs,
    }


def all_huge(run: dict[str, Any], paths: tuple[str, ...] = (PROG, LIB)) -> bool:
    """Whether every executable mapping of `paths` in the run was all PMD-mapped."""
    maps = run["maps"]
    return run["rc"] == 0 and all(p in maps and maps[p][0] == maps[p][1] > 0 for p in paths)


def windows_huge(run: dict[str, Any], path: str) -> bool:
    """Whether every whole 2 MiB window of the path's executable mapping was PMD-mapped
    (the as-is program's mapping is more than its one window)."""
    maps = run["maps"]
    return run["rc"] == 0 and path in maps and maps[path][0] == maps[path][1] >> 21 << 21 > 0


def summary(row: dict[str, Any]) -> dict[str, dict[str, bool]]:
    """read_ahead_kb -> setting -> whether the program's and the library's code was all
    PMD-mapped, DT_NEEDED and dlopen()ed alike."""
    return {
        ra: {s: all_huge(r["program"]) and all_huge(r["dlopen"], (LIB,)) for s, r in per_ra.items()}
        for ra, per_ra in row["runs"].items()
    }


def pmd_share(runs: dict[str, Any]) -> tuple[int, int]:
    """(bytes PMD-mapped, bytes) of the program's and its library's code in the run of
    the program."""
    maps = runs["program"]["maps"]
    return sum(maps.get(p, [0, 0])[0] for p in (PROG, LIB)), sum(maps.get(p, [0, 0])[1] for p in (PROG, LIB))


def hint_limit(hint: list[str]) -> int | None:
    """The read_ahead_kb `hugify status` names as the most that keeps the files huge."""
    m = re.search(r": (\d+) or less keeps", " ".join(hint))
    return int(m[1]) if m else None
