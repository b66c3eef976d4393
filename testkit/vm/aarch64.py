"""An arm64 Debian guest booted for real: Debian 13's own arm64 kernel under
qemu-system-aarch64 (TCG, `-M virt -cpu max`: a CPU with BTI and pointer
authentication), on XFS (large folios since Linux 5.18), with the test package built
for arm64 with Debian 13's branch protection and hugify built for arm64
(tests/test_aarch64_boot.py; issue 32 item 4).

Every heavy piece is built once into the shared test cache, keyed by what goes into it
(testkit.cache: cache_root, locked, build_once, cached_build):
- cross_root(): a Debian 13 amd64 root with arm64 as a foreign architecture and its
  cross toolchain (crossbuild-essential-arm64, libc6-dev:arm64, debhelper), by
  mmdebstrap; Debian 12's cross toolchain cannot make BTI-marked programs (its crt
  objects carry no marking, and the linker drops it).
- cross_built_package(): tests/deb/hugify-deb-test cross-built in that root with
  `dpkg-buildpackage --host-arch arm64`, dh_hugify from this checkout (its Python
  package with this machine's extension: abi3, so Debian 13's python3 loads it); with
  dpkg-buildflags' defaults for arm64 (-mbranch-protection=standard); plus the package's
  library built again without branch protection (rewritten by this checkout's hugify on
  the host) and the guest's tools (testkit/vm/guest/bti_*.c, dlopen_lib.c).
- hugify_stage(): hugify for arm64 (`make build install CROSS=aarch64-linux-gnu-
  CARGO_TARGET=aarch64-unknown-linux-gnu`: the extension with rustup's target, the
  runtime with the cross compiler and Debian 13's arm64 CFLAGS) installed into a stage.
- guest_root() / root_image(): a Debian 13 arm64 root of python3 and what it needs,
  unpacked by mmdebstrap's extract variant (configuring packages under qemu-user took
  22 minutes here, for nothing the driver needs), with the test package's programs,
  the stage, the library without branch protection in /opt/nobti and the driver
  (testkit/vm/guest/aarch64_driver.py) as /sbin/init, copied onto an XFS image.
- boot(): Debian 13's linux-image-arm64 (testkit.vm.kernels), the initramfs of testkit.vm.boot with
  Debian 13's arm64 busybox, one boot with a throw-away overlay; the driver's JSON comes
  back on a second, raw disk. Results are cached by everything that went into the boot.

The package is linked with `-z separate-code` (GNU ld's default on x86, not on arm64):
for the 2-load layout, GNU ld's default on arm64, hugify moves the program header table
out of the first page, where the audit library does not look for it yet (issue 32 item
1) and where binutils' strip, run by dh_strip, rewrites the file into one that ld.so
cannot load. Neither is about BTI; drop the flag once both are fixed.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from testkit.cache import build_dir, build_once, cache_root, cached_build, locked
from testkit.cli import hugify, write_launcher
from testkit.debian import (
    DebBuild,
    collect,
    copy_sources,
    files_key,
    hugify_inputs,
    hugify_sources,
    package_source_files,
    prepare_test_source,
    rust_env,
    tool_versions,
)
from testkit.debian_roots import debian_root
from testkit.vm.boot import (
    GUEST,
    BootResult,
    VmError,
    boot_uncached,
    finished,
    headless,
    initramfs,
    loop_mounted,
    retried_on_panic,
)
from testkit.vm.kernels import kernel, unpacked

SUITE = "trixie"
ARCH = "arm64"
TRIPLE = "aarch64-linux-gnu"
RUST_TARGET = "aarch64-unknown-linux-gnu"
FS = "xfs"
MEMORY_MIB = 2048
IMAGE_SIZE = "2G"
#: The size of the raw disk the driver writes its results to (aarch64_driver.RESULTS_SIZE).
RESULTS_SIZE = 4 << 20
BOOT_TIMEOUT = int(os.environ.get("HUGIFY_VM_TIMEOUT", "1800"))
#: The THP mode as Debian's amd64 kernels default to (arm64's default to `always`): the
#: runtime asks for huge pages with MADV_HUGEPAGE either way.
THP = "madvise"
#: pauth-impdef: pointer authentication with QEMU's own cheap algorithm, not QARMA,
#: which costs every return of Debian 13's pac-ret code dearly under TCG.
CPU = "max,pauth-impdef=on"
KERNEL_ARGS = f"console=ttyAMA0 panic=-1 loglevel=4 hugify.rootfs={FS} transparent_hugepage={THP}"
#: The test package's binary packages the guest gets (unpacked into its root).
GUEST_DEBS = ("hugify-deb-test", "libhugdebtest1", "hugify-deb-test-exec")
#: See the module's docstring.
PACKAGE_LDFLAGS = "-Wl,-z,separate-code"
#: The package's non-PIE program with little code (its Makefile's EXEC_FUNCS, 3200 by
#: default): the guest does not run it, and its 2.4 MiB of generated code were half of
#: the package's compile time.
EXEC_FUNCS = 300
#: Debian 13's CFLAGS for arm64 (dpkg-buildflags), for the runtime built on this host.
GUEST_CFLAGS = "-g -O2 -mbranch-protection=standard"
GUEST_TOOLS = {"bti_probe.so": "bti_probe.c", "bti-check": "bti_check.c", "dlopen-lib": "dlopen_lib.c"}
DRIVER = GUEST / "aarch64_driver.py"
CROSS_PACKAGES = ("build-essential", "crossbuild-essential-arm64", "libc6-dev:arm64", "debhelper", "python3", "ccache")


def _run(cmd: list[str], **kw: object) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]
    if res.returncode != 0:
        raise VmError(f"{' '.join(cmd)} failed ({res.returncode}): {(res.stderr or res.stdout).strip()[-1500:]}")
    return str(res.stdout)


def cross_root() -> Path:
    """Debian 13 (amd64) with arm64's cross toolchain and libc, and debhelper."""
    include = ",".join(CROSS_PACKAGES)
    return debian_root(
        "cross-arm64", "--variant=apt", "--architectures=amd64,arm64", f"--include={include}", suite=SUITE
    )


def in_chroot(root: Path, binds: dict[str, Path], script: str) -> tuple[int, str]:
    """`sh -c script` chrooted into `root`, with each directory of `binds` mounted at its
    path inside: in a mount namespace of its own, so that the mounts end with it and the
    cached root is left as it was."""
    mounts = []
    for inside, outside in binds.items():
        (root / inside.lstrip("/")).mkdir(parents=True, exist_ok=True)
        mounts.append(f"mount --bind {shlex.quote(str(outside))} {shlex.quote(f'{root}{inside}')}")
    outer = " && ".join([*mounts, f'exec chroot {shlex.quote(str(root))} /bin/sh -ec "$0"'])
    res = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", outer, script],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8"},
        check=False,
    )
    return res.returncode, res.stdout


#: What runs in the cross root: the package, the library without branch protection, the
#: guest's tools. /hugify holds this checkout's dh_hugify and hugify (a wrapper runs it
#: with the root's python3), /build the sources and what comes out.
BUILD_SCRIPT = f"""
export PATH=/usr/lib/ccache:/hugify/bin:/hugify/dh-hugify:/usr/sbin:/usr/bin:/sbin:/bin
export PERL5LIB=/hugify/dh-hugify HOME=/build CCACHE_DIR=/ccache LC_ALL=C.UTF-8
export DEB_BUILD_OPTIONS=nocheck DEB_LDFLAGS_MAINT_APPEND={PACKAGE_LDFLAGS} EXEC_FUNCS={EXEC_FUNCS}
cd /build/hugify-deb-test
dpkg-buildpackage -us -uc -b -a{ARCH} -Pcross,nocheck -j2
make clean
make libhugdebtest.so.1 CC={TRIPLE}-gcc CFLAGS='-g -O2 -mbranch-protection=none' LDFLAGS={PACKAGE_LDFLAGS}
mkdir -p /build/nobti /build/tools
cp libhugdebtest.so.1 /build/nobti/
CFLAGS=$(dpkg-architecture -a{ARCH} -c dpkg-buildflags --get CFLAGS 2>/dev/null)
cd /build/tools-src
{TRIPLE}-gcc $CFLAGS -Wall -Werror -shared -fPIC -o /build/tools/bti_probe.so bti_probe.c
{TRIPLE}-gcc $CFLAGS -Wall -Werror -o /build/tools/bti-check bti_check.c
{TRIPLE}-gcc $CFLAGS -Wall -Werror -o /build/tools/dlopen-lib dlopen_lib.c -ldl
"""


def _hugify_for_chroot(dest: Path) -> None:
    """This checkout's dh_hugify, hugify package and policy in `dest`, and bin/hugify."""
    for name, path in hugify_inputs():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    write_launcher(dest / "bin" / "hugify", "/hugify/policy", python="python3", repo="/hugify")


def cross_built_package() -> DebBuild:
    """The test package and the rest of BUILD_SCRIPT's output (nobti/, tools/), built
    once per inputs; the library without branch protection rewritten by hugify."""
    root = cross_root()
    tools = [(name, GUEST / src) for name, src in GUEST_TOOLS.items()]
    inputs = package_source_files() + hugify_inputs() + tools
    key = files_key(inputs, root.parent.name, BUILD_SCRIPT)

    def build(scratch: Path, out: Path) -> tuple[int, str]:
        prepare_test_source(scratch, dh_args="--with hugify")
        (scratch / "tools-src").mkdir()
        for _, src in tools:
            shutil.copy(src, scratch / "tools-src")
        hugify_dir = scratch.with_name(scratch.name + "-hugify")
        shutil.rmtree(hugify_dir, ignore_errors=True)
        _hugify_for_chroot(hugify_dir)
        ccache = cache_root() / "ccache-trixie"
        ccache.mkdir(exist_ok=True)
        rc, log = in_chroot(root, {"/build": scratch, "/hugify": hugify_dir, "/ccache": ccache}, BUILD_SCRIPT)
        shutil.rmtree(hugify_dir, ignore_errors=True)
        collect(scratch, out)
        if rc == 0:
            for name in ("nobti", "tools"):
                shutil.copytree(scratch / name, out / name)
            plain = out / "nobti" / "libhugdebtest.so.1"
            res = hugify("transform", plain, "-o", out / "nobti" / "hugified.so", check=False)
            rc, log = res.returncode, log + res.stdout + res.stderr
        return rc, log

    group = cache_root() / "aarch64"
    final = build_dir("aarch64", "package", key)
    return DebBuild(cached_build(final, group / "package.lock", group / "package-build", build))


#: Top-level parts of the source tree that `make build install` does not read: a change
#: there does not rebuild hugify for arm64.
NOT_BUILT = ("docs", "debian", "examples", "fuzz", "signing", ".ci", "README.md", "pyproject.toml")


#: make install's variables for the guest's hugify, part of its build's key. DOCDIR
#: empty: the copy of the sources has no documents, and the guest needs none.
INSTALL_VARS = ("PREFIX=/usr", "DOCDIR=")


def hugify_stage() -> Path:
    """hugify built for arm64 and installed (PREFIX=/usr) into the returned directory."""
    sources = [(name, path) for name, path in hugify_sources() if name.split("/", 1)[0] not in NOT_BUILT]
    rustc = subprocess.run(["rustc", "-V"], capture_output=True, text=True, check=False).stdout
    cross = tool_versions(f"gcc-{TRIPLE}", "libc6-dev-arm64-cross", f"binutils-{TRIPLE}")
    key = files_key(sources, rustc, cross, GUEST_CFLAGS, *INSTALL_VARS)
    group = cache_root() / "aarch64"

    def build(scratch: Path, out: Path) -> tuple[int, str]:
        src = scratch / "src"
        copy_sources(sources, src)
        rust = rust_env()
        env = {
            **os.environ,
            "PATH": f"{rust['cargo_dir']}:{os.environ['PATH']}",
            "CARGO_HOME": rust["CARGO_HOME"],
            "RUSTUP_HOME": rust["RUSTUP_HOME"],
        }
        make = ["make", "build", "install", f"DESTDIR={out / 'stage'}", *INSTALL_VARS]
        make += [f"CROSS={TRIPLE}-", f"CARGO_TARGET={RUST_TARGET}", f"CFLAGS={GUEST_CFLAGS}"]
        # One target directory for every build of it: the next build is incremental.
        make.append(f"CARGO_TARGET_DIR={group / 'cargo-target'}")
        res = subprocess.run(
            make, cwd=src, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
        )
        return res.returncode, res.stdout

    final = cached_build(build_dir("aarch64", "hugify", key), group / "hugify.lock", group / "hugify-build", build)
    log = (final / "log").read_text()
    assert (final / "rc").read_text() == "0", log[-6000:]
    return final / "stage"


def guest_root() -> Path:
    """Debian 13's python3 for arm64 and what it depends on, unpacked."""
    return debian_root(
        "guest-arm64", "--variant=extract", f"--architectures={ARCH}", "--include=base-files,python3", suite=SUITE
    )


def _stage_guest(dest: Path, root: Path, package: DebBuild, stage: Path) -> None:
    _run(["cp", "-a", f"{root}/.", str(dest)])
    for name in GUEST_DEBS:
        _run(["dpkg-deb", "-x", str(package.deb(name)), str(dest)])
    _run(["cp", "-a", f"{stage}/.", str(dest)])
    nobti = dest / "opt" / "nobti"
    nobti.mkdir(parents=True)
    shutil.copy(package.dir / "nobti" / "hugified.so", nobti / "libhugdebtest.so.1")
    work = dest / "hugify-bti"
    work.mkdir()
    for tool in (package.dir / "tools").iterdir():
        shutil.copy(tool, work)
    for name in (DRIVER.name, "guest_driver.py"):
        shutil.copy(GUEST / name, work)
    (work / DRIVER.name).chmod(0o755)
    init = dest / "usr" / "sbin" / "init"
    init.parent.mkdir(parents=True, exist_ok=True)
    init.symlink_to(f"/hugify-bti/{DRIVER.name}")


def root_image() -> tuple[Path, str]:
    """The guest's root on an XFS image (raw), and its key; cached by its inputs."""
    root, package, stage = guest_root(), cross_built_package().ok(), hugify_stage()
    drivers = [("driver", DRIVER), ("guest_driver", GUEST / "guest_driver.py")]
    key = files_key(drivers, root.parent.name, package.dir.name, stage.parent.name, tool_versions("xfsprogs"))
    final = build_dir("aarch64", f"root-{FS}", key)

    def make(work: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="hugify-aarch64-root-", dir=cache_root() / "aarch64") as tmp:
            _run(["truncate", "-s", IMAGE_SIZE, str(work / "root.img")])
            _run(["mkfs.xfs", "-q", "-f", str(work / "root.img")])
            staged = Path(tmp) / "root"
            staged.mkdir()
            _stage_guest(staged, root, package, stage)
            with loop_mounted(work / "root.img") as mnt:
                _run(["cp", "-a", f"{staged}/.", str(mnt)])

    return build_once(final, cache_root() / "aarch64" / "root.lock", make, "root.img"), key


def _machine(k_vmlinuz: Path, initrd: Path) -> Callable[[Path, Path], list[str]]:
    def command(disk: Path, work: Path) -> list[str]:
        with (work / "results.log").open("wb") as f:
            f.truncate(RESULTS_SIZE)
        return [
            "qemu-system-aarch64",
            "-M",
            "virt",
            "-cpu",
            CPU,
            "-accel",
            "tcg",
            "-m",
            str(MEMORY_MIB),
            "-smp",
            "1",
            *headless(work),
            "-kernel",
            str(k_vmlinuz),
            "-initrd",
            str(initrd),
            "-append",
            KERNEL_ARGS,
            "-drive",
            f"file={disk},if=virtio,format=qcow2,cache=unsafe",
            "-drive",
            f"file={work / 'results.log'},if=virtio,format=raw",
        ]

    return command


def boot() -> BootResult:
    """Debian 13's arm64 kernel booted on the guest's root once per inputs."""
    k = kernel(SUITE, ARCH)
    busybox = unpacked(SUITE, "busybox-static", ARCH) / "usr" / "bin" / "busybox"
    initrd = initramfs(k, busybox)
    image, image_key = root_image()
    qemu = tool_versions("qemu-system-arm")
    key = files_key([("initrd", initrd)], image_key, k.package, k.version, qemu, CPU, str(MEMORY_MIB), KERNEL_ARGS)
    name = f"boot-{k.release}-{FS}"
    final = build_dir("aarch64", name, key)
    with locked(cache_root() / "aarch64" / f"{name}.lock"):
        if not (final / "results.json").exists():
            machine = _machine(k.vmlinuz, initrd)
            retried_on_panic(
                lambda: boot_uncached(
                    k, FS, THP, initrd=initrd, image=image, final=final, timeout=BOOT_TIMEOUT, machine=machine
                ),
                final,
            )
    return finished(k, FS, final)
