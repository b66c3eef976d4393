"""Booting Debian's kernels under qemu on a real Debian root, one disk per filesystem
(tests/test_kernel_matrix.py, bench/kernel_matrix.py).

- The initramfs (one per kernel): busybox-static, the modules the root disk needs
  (virtio_pci and virtio_blk where modular, ext4, XFS, btrfs, the checksum modules
  they ask for) with their dependencies from the kernel's modules.dep, decompressed
  (.ko.xz from 6.12 on: busybox's insmod takes plain ELF), and testkit/vm/guest/init, which
  loads them, mounts /dev/vda with the filesystem named on the command line and
  switch_roots to systemd.
- The root (one per filesystem): testkit.debian_roots.systemd_root() (the Debian 12 root that
  test_boot.py boots in a container) with hugify's .deb and the test package built
  with dh_hugify installed by dpkg, Debian 12's gdb and perf (with what they need that
  the root lacks) and the test package's debug symbols, the guest driver, its probe and
  the unit that runs it; copied with cp -a onto a loop-mounted ext4, XFS or btrfs image. Images are
  cached by their inputs; each boot writes to a throw-away qcow2 overlay.
- The boot: qemu-system-x86_64, TCG unless HUGIFY_VM_ACCEL says otherwise (nested KVM
  stops with "emulation failure" in the kernel's decompressor on these machines),
  2 GiB of memory (a 2 MiB folio needs 512 contiguous free pages: with less, the
  page cache's allocations fall back to small folios and the matrix would measure
  fragmentation, not the kernel), the console on the first serial port and the
  driver's JSON on the second, bounded by BOOT_TIMEOUT. A finished boot's results
  are cached by everything that went into it.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.cache import build_dir, build_once, building, cache_root, locked
from testkit.debian import build_hugify_deb, build_variant, files_key, installed_digest, tool_versions
from testkit.debian_roots import KEYRING, MIRROR, SUITE, apt_options, systemd_root
from testkit.vm.kernels import Kernel, update_lists

GUEST = Path(__file__).resolve().parent / "guest"
FILESYSTEMS = ("ext4", "xfs", "btrfs")
MEMORY_MIB = 2048
IMAGE_SIZE = "3G"
#: A TCG boot of this root takes about a minute; the driver's runs several more.
BOOT_TIMEOUT = int(os.environ.get("HUGIFY_VM_TIMEOUT", "1800"))
ACCEL = os.environ.get("HUGIFY_VM_ACCEL", "tcg")
#: Modules the root disk may need; a name the kernel has built in, or does not have, is skipped.
WANTED_MODULES = (
    "virtio_pci",
    "virtio_blk",
    "crc32c_generic",
    "crc32c_intel",
    "libcrc32c",
    "xxhash_generic",
    "sha256_generic",
    "blake2b_generic",
    "ext4",
    "xfs",
    "btrfs",
)
#: The test package's binaries installed in the guest (its hugified program and library,
#: its non-PIE program listed as-is, and lld's program, library and plugin).
GUEST_DEBS = ("libhugdebtest1", "hugify-deb-test", "hugify-deb-test-exec", "hugify-deb-test-lld")
UNIT_NAME = "hugify-matrix.service"
#: The kernel's command line besides the filesystem and THP mode (part of a boot's key).
KERNEL_ARGS = "console=ttyS0 panic=-1 loglevel=5"
#: Part of the root images' key: bump it when _staged_root changes what goes onto them.
ROOT_RECIPE = "3"
#: The debuggers the driver runs the anonymous-copy mode under (issue 21): Debian 12's gdb
#: and perf, installed by dpkg in the staged root with what they need that the root lacks
#: (the root itself is shared with tests/test_boot.py and stays as it is).
DEBUG_TOOLS = ("gdb", "linux-perf")
#: The test package's debug symbols (its files are stripped): perf and gdb name the
#: program's own functions from them, as on any Debian system with -dbgsym installed.
GUEST_DEBUG_DEBS = ("libhugdebtest1-dbgsym", "hugify-deb-test-dbgsym")
VM_TOOLS = ("qemu-system-x86", "qemu-utils", "busybox-static", "kmod", "xfsprogs", "btrfs-progs", "e2fsprogs")


class VmError(Exception):
    """A boot that could not be made or did not finish (the reason is the message)."""


class GuestPanic(VmError):
    """The guest's kernel panicked (the message has the console's last lines)."""


def _run(cmd: list[str], **kw: object) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]
    if res.returncode != 0:
        raise VmError(f"{' '.join(cmd)} failed ({res.returncode}): {(res.stderr or res.stdout).strip()[-800:]}")
    return str(res.stdout)


# --- the initramfs ---------------------------------------------------------------------------


def _module_name(path: str) -> str:
    base = Path(path).name
    return base[: base.index(".ko")].replace("-", "_")


def module_load_order(modules_dir: Path, wanted: tuple[str, ...] = WANTED_MODULES) -> list[str]:
    """The modules.dep paths of the wanted modules and their dependencies, each after
    the modules it depends on."""
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (modules_dir / "modules.dep").read_text().splitlines():
        path, _, rest = line.partition(":")
        deps[path] = rest.split()
        by_name[_module_name(path)] = path
    order: list[str] = []

    def visit(path: str) -> None:
        if path in order:
            return
        for dep in reversed(deps[path]):
            visit(dep)
        order.append(path)

    for name in wanted:
        if name in by_name:
            visit(by_name[name])
    return order


def _decompressed(path: Path) -> bytes:
    if path.suffix == ".xz":
        return subprocess.run(["xz", "-dc", str(path)], capture_output=True, check=True).stdout
    if path.suffix == ".zst":
        return subprocess.run(["zstd", "-dcq", str(path)], capture_output=True, check=True).stdout
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes())
    return path.read_bytes()


def initramfs(k: Kernel, busybox: Path = Path("/bin/busybox")) -> Path:
    """busybox (this machine's; the guest's own for another architecture), the root
    disk's modules and testkit/vm/guest/init as a gzipped newc cpio."""
    if not busybox.is_file():
        raise VmError(f"no {busybox} (busybox-static): run tools/setup-dev-env")
    init = GUEST / "init"
    key = files_key([("init", init), ("busybox", busybox)], k.package, k.version, repr(WANTED_MODULES))
    final = build_dir("kernel-matrix", f"initramfs-{k.release}", key)

    def make(work: Path) -> None:
        tree = work / "tree"
        for d in ("bin", "dev", "proc", "sys", "newroot", "modules"):
            (tree / d).mkdir(parents=True)
        shutil.copy(busybox, tree / "bin" / "busybox")
        shutil.copy(init, tree / "init")
        (tree / "init").chmod(0o755)
        names = []
        for path in module_load_order(k.modules):
            name = _module_name(path) + ".ko"
            (tree / "modules" / name).write_bytes(_decompressed(k.modules / path))
            names.append(name)
        (tree / "modules" / "order").write_text("".join(f"{n}\n" for n in names))
        files = sorted(str(p.relative_to(tree)) for p in tree.rglob("*"))
        cpio = subprocess.run(
            ["cpio", "-o", "-H", "newc", "--quiet", "--reproducible"],
            input="\n".join([".", *files]).encode(),
            cwd=tree,
            capture_output=True,
            check=True,
        ).stdout
        (work / "initrd.gz").write_bytes(gzip.compress(cpio, mtime=0))
        shutil.rmtree(tree)

    return build_once(final, cache_root() / "kernel-matrix" / "initramfs.lock", make, "initrd.gz")


# --- the root disks --------------------------------------------------------------------------


@dataclass(frozen=True)
class GuestInputs:
    """What goes onto every root disk, and its cache key."""

    root: Path
    debs: list[Path]
    tools: Path  # probe.so and dlopen-lib, built on this (Debian 12) host for the Debian 12 guest
    key: str
    debug_debs: tuple[Path, ...] = ()  # DEBUG_TOOLS and what they need, GUEST_DEBUG_DEBS


def guest_tools() -> Path:
    sources = [("probe.c", GUEST / "probe.c"), ("dlopen_lib.c", GUEST / "dlopen_lib.c")]
    final = build_dir("kernel-matrix", "guest-tools", files_key(sources, tool_versions("gcc-12", "libc6-dev")))
    if (final / "probe.so").exists():
        return final
    with building(final) as work:
        flags = ["-O2", "-Wall", "-Wextra", "-Werror"]
        _run(["gcc", *flags, "-shared", "-fPIC", "-o", str(work / "probe.so"), str(GUEST / "probe.c")])
        _run(["gcc", *flags, "-o", str(work / "dlopen-lib"), str(GUEST / "dlopen_lib.c"), "-ldl"])
    return final


def debug_tool_debs(root: Path) -> list[Path]:
    """DEBUG_TOOLS from bookworm with the packages they depend on that `root` lacks
    (apt resolves them against the root's dpkg status, through a private apt state:
    testkit.debian_roots.apt_options), fetched with `apt-get download` once per set of versions."""
    group = cache_root() / "kernel-matrix"
    with locked(group / "debug-tools.lock"):
        state = group / "debug-tools-apt"
        opts = apt_options(state, [f"deb [signed-by={KEYRING}] {MIRROR} {SUITE} main"])
        opts += ["-o", f"Dir::State::status={root / 'var/lib/dpkg/status'}"]
        update_lists(state, opts)  # as for the kernels: again when a day old
        plan = _run(["apt-get", *opts, "-s", "install", "--no-install-recommends", *DEBUG_TOOLS])
        wanted = sorted(f"{name}={version}" for name, version in re.findall(r"^Inst (\S+) \((\S+) ", plan, re.M))
        if not wanted:
            raise VmError(f"apt-get found nothing to install for {' '.join(DEBUG_TOOLS)}: {plan[-600:]}")
        final = build_dir("kernel-matrix", "debug-tools", files_key([], root.parent.name, *wanted))
        if not (final / "done").exists():
            with building(final) as work:
                _run(["apt-get", "-q", *opts, "download", *wanted], cwd=work)
                if len(list(work.glob("*.deb"))) != len(wanted):
                    raise VmError(f"apt-get download {' '.join(wanted)} gave {sorted(p.name for p in work.iterdir())}")
                (work / "done").write_text("".join(f"{w}\n" for w in wanted))
    return sorted(final.glob("*.deb"))


def guest_inputs() -> GuestInputs:
    hugify = build_hugify_deb().ok()
    variant = build_variant("with").ok()
    debs = [*hugify.installable(), *(variant.deb(p) for p in GUEST_DEBS)]
    root = systemd_root(debs[0])
    tools = guest_tools()
    archive, symbols = debug_tool_debs(root), [variant.deb(p) for p in GUEST_DEBUG_DEBS]
    files = [(n, GUEST / n) for n in ("guest_driver.py", UNIT_NAME, "init")]
    files += [(p.name, p) for p in sorted(tools.iterdir())]
    # hugify's and the test package's debs count by what dpkg installs from them and runs
    # (installed_digest), not by their builds' cache keys nor their versions, which change
    # with any source file of hugify, its documents and tests too: a change the guest
    # cannot see must not make every image and boot stale. The archive's debs count by
    # their names (package, version).
    installed = installed_digest([*debs, *symbols])
    key = files_key(files, root.parent.name, installed, ROOT_RECIPE, *(d.name for d in archive))
    debug_debs = (*archive, *symbols)
    return GuestInputs(root, debs, tools, key, debug_debs)


@contextlib.contextmanager
def loop_mounted(image: Path) -> Iterator[Path]:
    mnt = Path(tempfile.mkdtemp(prefix="hugify-matrix-mnt-"))
    _run(["mount", "-o", "loop", str(image), str(mnt)])
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        mnt.rmdir()


def _staged_root(g: GuestInputs, dest: Path) -> None:
    """The root with the packages installed by dpkg (in a chroot: no systemd runs
    there, so the maintainer scripts only enable the units) and the driver's files."""
    _run(["cp", "-a", f"{g.root}/.", str(dest)])
    debs = dest / "tmp" / "hugify-matrix-debs"
    debs.mkdir(parents=True)
    for d in (*g.debs, *g.debug_debs):
        shutil.copy(d, debs)
    _run(["chroot", str(dest), "sh", "-c", "dpkg -i /tmp/hugify-matrix-debs/*.deb"])
    shutil.rmtree(debs)
    work = dest / "hugify-matrix"
    work.mkdir()
    shutil.copy(GUEST / "guest_driver.py", work)
    for tool in g.tools.iterdir():
        shutil.copy(tool, work)
    units = dest / "etc" / "systemd" / "system"
    shutil.copy(GUEST / UNIT_NAME, units)
    (units / "multi-user.target.wants").mkdir(exist_ok=True)
    (units / "multi-user.target.wants" / UNIT_NAME).symlink_to(f"../{UNIT_NAME}")
    (dest / "etc" / "hostname").write_text("hugify-matrix\n")
    # No login on the console: its getty waits 90 s for a dev-ttyS0.device that never
    # appears (no udev rules tag the port here) and holds up multi-user.target, this
    # driver's unit with it.
    (units / "serial-getty@ttyS0.service").symlink_to("/dev/null")


MKFS = {"ext4": ["mkfs.ext4", "-q", "-F"], "xfs": ["mkfs.xfs", "-q", "-f"], "btrfs": ["mkfs.btrfs", "-q", "-f"]}


@dataclass(frozen=True)
class RootExtra:
    """What a root image holds beyond the matrix's (bench/boot_cost_vm.py): the name of
    its cache entries, the key of what it adds, the function that adds it to the staged
    root (after the matrix's files, so it may replace the driver's unit), the image size
    and more of the kernel's command line for its boots."""

    name: str
    key: str
    stage: Callable[[Path], None]
    size: str = IMAGE_SIZE
    kernel_args: str = ""


def root_image(fs: str, g: GuestInputs, extra: RootExtra | None = None) -> Path:
    """The guest root on a `fs` filesystem image (raw), cached by its inputs."""
    more = (extra.name, extra.key, extra.size) if extra else ()  # the matrix's key stays as it was
    name = f"root-{extra.name}-{fs}" if extra else f"root-{fs}"
    final = build_dir("kernel-matrix", name, files_key([], g.key, fs, tool_versions(*VM_TOOLS), *more))

    def make(work: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="hugify-matrix-root-", dir=cache_root() / "kernel-matrix") as tmp:
            _run(["truncate", "-s", extra.size if extra else IMAGE_SIZE, str(work / "root.img")])
            _run([*MKFS[fs], str(work / "root.img")])
            staged = Path(tmp) / "root"
            staged.mkdir()
            _staged_root(g, staged)
            if extra:
                extra.stage(staged)
            with loop_mounted(work / "root.img") as mnt:
                _run(["cp", "-a", f"{staged}/.", str(mnt)])

    return build_once(final, cache_root() / "kernel-matrix" / "root.lock", make, "root.img")


# --- the boot ------------------------------------------------------------------------------------


@dataclass
class BootResult:
    kernel: Kernel
    fs: str
    dir: Path
    results: dict[str, Any]
    seconds: float

    def console_tail(self, lines: int = 40) -> str:
        return "\n".join((self.dir / "console.log").read_text(errors="replace").splitlines()[-lines:])


def _results_of(port_log: str) -> dict[str, object] | None:
    text = port_log.replace("\r", "")
    if "HUGIFY-MATRIX-BEGIN\n" not in text or "\nHUGIFY-MATRIX-END" not in text:
        return None
    body = text.split("HUGIFY-MATRIX-BEGIN\n", 1)[1].split("\nHUGIFY-MATRIX-END", 1)[0]
    return dict(json.loads(body))


def headless(out: Path) -> list[str]:
    """The qemu options of every boot here: no display, monitor or network, no reboot (a
    guest that reboots has ended), the console (the first serial port) to out/console.log."""
    quiet = ["-display", "none", "-monitor", "none", "-nic", "none", "-no-reboot"]
    return [*quiet, "-serial", f"file:{out / 'console.log'}"]


def qemu_command(
    k: Kernel, fs: str, thp: str, *, initrd: Path, disk: Path, out: Path, accel: str = ACCEL, extra: str = ""
) -> list[str]:
    append = f"{KERNEL_ARGS} hugify.rootfs={fs} transparent_hugepage={thp} {extra}".strip()
    return [
        "qemu-system-x86_64",
        "-accel",
        accel,
        "-m",
        str(MEMORY_MIB),
        "-smp",
        "1",
        "-cpu",
        "max",
        "-vga",
        "none",
        *headless(out),
        "-serial",
        f"file:{out / 'results.log'}",
        "-kernel",
        str(k.vmlinuz),
        "-initrd",
        str(initrd),
        "-append",
        append,
        "-drive",
        f"file={disk},if=virtio,format=qcow2,cache=unsafe",
    ]


def _tail(path: Path, lines: int = 40) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.replace("\r", "").splitlines()[-lines:])


def boot(k: Kernel, fs: str, thp: str = "always", extra: RootExtra | None = None, kernel_args: str = "") -> BootResult:
    """Boots `k` on the `fs` root (the matrix's, or one with `extra` on it) once per
    inputs, `kernel_args` added to the kernel's command line (the guest driver's
    `hugify.*` settings); raises VmError with the reason (and the console's last lines)
    when the guest cannot start, panics or does not finish in time."""
    g = guest_inputs()
    initrd = initramfs(k)
    image = root_image(fs, g, extra)
    qemu = tool_versions("qemu-system-x86")
    args = " ".join(a for a in (extra.kernel_args if extra else "", kernel_args) if a)
    more = (extra.name, extra.key, extra.size) if extra else ()
    key = files_key(
        [("initrd", initrd)],
        g.key,
        k.package,
        k.version,
        fs,
        thp,
        ACCEL,
        qemu,
        str(MEMORY_MIB),
        KERNEL_ARGS,
        args,
        *more,
    )
    name = f"boot-{extra.name}-{k.release}-{fs}-{thp}" if extra else f"boot-{k.release}-{fs}-{thp}"
    final = build_dir("kernel-matrix", name, key)
    # Both of the suite's workers may ask for the same boot: one boots, the other waits.
    with locked(cache_root() / "kernel-matrix" / f"{name}.lock"):
        if not (final / "results.json").exists():
            retried_on_panic(
                lambda: boot_uncached(k, fs, thp, initrd=initrd, image=image, final=final, extra=args), final
            )
    return finished(k, fs, final)


def retried_on_panic(boot_once: Callable[[], None], final: Path) -> None:
    """boot_once() (a boot_uncached into `final`), once more if the guest panicked: under
    TCG a guest kernel has been seen to die of a double fault in the slab allocator at a
    fork, once in many boots of the same image that all went through. A second panic
    fails, with both consoles' last lines; a retried boot keeps the first one's in
    retried.txt."""
    try:
        boot_once()
    except GuestPanic as first:
        try:
            boot_once()
        except GuestPanic as second:
            raise GuestPanic(f"{second}\nand the boot before it: {first}") from None
        (final / "retried.txt").write_text(f"{first}\n")


def finished(k: Kernel, fs: str, final: Path) -> BootResult:
    """The results of the boot kept in `final`."""
    meta = json.loads((final / "meta.json").read_text())
    return BootResult(k, fs, final, json.loads((final / "results.json").read_text()), meta["seconds"])


def boot_uncached(
    k: Kernel,
    fs: str,
    thp: str,
    *,
    initrd: Path,
    image: Path,
    final: Path,
    accel: str = ACCEL,
    extra: str = "",
    timeout: int = BOOT_TIMEOUT,
    machine: Callable[[Path, Path], list[str]] | None = None,
) -> None:
    """One boot into `final` (kept only when it finished); `accel`, `extra` (more of the
    kernel's command line) and `timeout` let the tests break it on purpose. `machine(disk,
    work)`, when given, makes what another machine needs in `work` and returns its qemu
    command (testkit/vm/aarch64.py), which writes its results to work/results.log too."""
    with building(final) as work:
        disk = work / "overlay.qcow2"
        _run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(image), "-F", "raw", str(disk)])
        if machine:
            command = machine(disk, work)
        else:
            command = qemu_command(k, fs, thp, initrd=initrd, disk=disk, out=work, accel=accel, extra=extra)
        if shutil.which(command[0]) is None:
            raise VmError(f"{command[0]} is not installed: run tools/setup-dev-env")
        started = time.monotonic()
        with (work / "qemu.log").open("w") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                console = _tail(work / "console.log")
                raise VmError(
                    f"{k.label} on {fs}: the guest did not finish in {timeout} s; console:\n{console}"
                ) from None
        seconds = round(time.monotonic() - started, 1)
        disk.unlink()
        console = (work / "console.log").read_text(errors="replace") if (work / "console.log").exists() else ""
        if rc != 0:
            raise VmError(f"qemu could not run {k.label} on {fs} (exit {rc}): {_tail(work / 'qemu.log', 10)}")
        if "Kernel panic" in console:
            raise GuestPanic(f"{k.label} on {fs}: the guest panicked; console:\n{_tail(work / 'console.log')}")
        results = (
            _results_of((work / "results.log").read_text(errors="replace")) if (work / "results.log").exists() else None
        )
        if results is None:
            raise VmError(
                f"{k.label} on {fs}: the guest powered off without results; console:\n{_tail(work / 'console.log')}"
            )
        if "driver_error" in results:
            raise VmError(f"{k.label} on {fs}: the guest driver failed: {results['driver_error']}")
        (work / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True))
        (work / "meta.json").write_text(json.dumps({"seconds": seconds, "package": k.package, "version": k.version}))
