"""The signing tests' packages and tools, shared by tests/test_signing.py,
tests/test_sign_packages.py and tests/test_repack.py: cosign v2.6.5 from the test cache
(built by tools/setup-dev-env), a key pair per build, and the test packages built with
hugify's signing turned on (tests/rpm's spec with `%files %{?hugify_attestation}`, the
Debian package tests/sign/deb with dh_hugify and dh_hugify_sign), each cached under the
test cache by the digest of everything it depends on, with the key pair made for it."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hugify import signing
from testkit import REPO
from testkit.cache import cache_root, locked
from testkit.cli import hugify, write_launcher
from testkit.rpm import BRP, MACROS

COSIGN = Path(os.environ.get("HUGIFY_COSIGN") or cache_root() / "cosign-v2.6.5" / "bin" / "cosign")
PASSWORD = "hugify-tests-Passw0rd"
RPM_DIR = REPO / "tests" / "rpm"
DEB_DIR = REPO / "tests" / "sign" / "deb"
DH_DIR = REPO / "dh-hugify"
SHIPPED_POLICY = REPO / "policy" / "policy.toml"
ATTEST = "usr/share/hugify/attestations"
#: Bump when the way the packages are built below changes.
BUILD_VERSION = 1

RPM_FILES = {"prog": "usr/bin/hugify-test", "link": "usr/bin/hugify-test-link", "lib": "usr/lib64/libhugtest.so.1"}
RPM_SMALL = "usr/bin/hugify-small"
DEB_FILES = {
    "prog": "usr/bin/hugify-sign-test",
    "link": "usr/bin/hugify-sign-test-link",
    "lib": "usr/lib/x86_64-linux-gnu/libhugsigntest.so.1",
}
DEB_SMALL = "usr/bin/hugify-sign-small"


def _cosign() -> Path:
    assert os.access(COSIGN, os.X_OK), f"cosign is missing at {COSIGN}: run tools/setup-dev-env, which builds it"
    return COSIGN


def env(**extra: str) -> dict[str, str]:
    """The environment of a build or a hugify run: the shipped policy only, cosign
    from the cache, the test key's password."""
    base = {k: v for k, v in os.environ.items() if k not in ("HUGIFY_SIGNING_KEY", "SOURCE_DATE_EPOCH")}
    return {
        **base,
        "HUGIFY_POLICY_PATH": str(SHIPPED_POLICY),
        "HUGIFY_COSIGN": str(_cosign()),
        "COSIGN_PASSWORD": PASSWORD,
        **extra,
    }


def keypair(directory: Path, prefix: str = "cosign") -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [str(_cosign()), "generate-key-pair", "--output-key-prefix", str(directory / prefix)],
        env=env(),
        capture_output=True,
        check=True,
    )
    return directory / f"{prefix}.key", directory / f"{prefix}.pub"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cosign_verify(pub: Path, bundle: Path, blob: Path) -> subprocess.CompletedProcess[str]:
    """cosign alone, as an administrator would run it: no hugify code involved."""
    root = bundle.parent / "offline-trusted-root.json"
    if not root.exists():
        root.write_text('{"mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1"}\n')
    cmd = [str(_cosign()), "verify-blob-attestation", "--key", str(pub), "--bundle", str(bundle)]
    cmd += ["--trusted-root", str(root), "--insecure-ignore-tlog", "--type", signing.PREDICATE_TYPE, str(blob)]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


# --- package builds, cached by their inputs ---------------------------------------------------


@dataclass(frozen=True)
class Variant:
    kind: str  # rpm | deb
    #: The test policy layered over the shipped one; @KEY@ is the generated key.
    policy: str


SIGNED = '[signing]\nmode = "required"\nkey = "@KEY@"\n'
VARIANTS = {
    "rpm-signed": Variant("rpm", SIGNED),
    "rpm-off": Variant("rpm", ""),
    "rpm-required-nokey": Variant("rpm", '[signing]\nmode = "required"\n'),
    "deb-signed": Variant("deb", SIGNED),
}


@dataclass
class Built:
    dir: Path
    rc: int
    log: str
    packages: list[Path]
    root: Path  # every package of the build extracted here
    published: Path  # the build-output directory with the publication copies
    key: Path
    pub: Path


def _files(*dirs: Path) -> Iterable[Path]:
    for d in dirs:
        yield from sorted(p for p in d.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def _tool_versions() -> str:
    out = []
    for cmd in (["rpm", "--version"], ["gcc", "--version"], ["dpkg-query", "-W", "debhelper", "dpkg-dev", "debugedit"]):
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        out.append(res.stdout.strip())
    out.append(subprocess.run([str(_cosign()), "version"], capture_output=True, text=True, check=False).stdout)
    return "\n".join(out)


@functools.cache
def _key(name: str) -> str:
    v = VARIANTS[name]
    h = hashlib.sha256(f"{BUILD_VERSION}\n{name}\n{v}\n{_tool_versions()}\n{sys.executable}".encode())
    for p in _files(REPO / "hugify", REPO / "brp-scripts", DH_DIR, RPM_DIR, DEB_DIR):
        h.update(str(p.relative_to(REPO)).encode() + b"\0" + p.read_bytes())
    for p in (SHIPPED_POLICY, REPO / "tests" / "programs" / "gen_code.py"):
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _wrapper(work: Path) -> Path:
    """The `hugify` command of the build: this checkout, the shipped policy and the test's."""
    return write_launcher(work / "bin" / "hugify", f"{SHIPPED_POLICY}:{work / 'policy.toml'}")


def _run_logged(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> int:
    res = subprocess.run(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
    )
    log.write_text(res.stdout)
    return res.returncode


def _build_rpm(work: Path, build_env: dict[str, str]) -> None:
    spec = work / "hugify-test.spec"
    text = (RPM_DIR / "hugify-test.spec").read_text()
    assert "\n%files\n" in text
    spec.write_text(text.replace("\n%files\n", "\n%files %{?hugify_attestation}\n"))
    top = work / "top"
    cmd = ["rpmbuild", "-bb", "--define", f"_topdir {top}", "--define", f"hugify_test_src {RPM_DIR}"]
    cmd += ["--load", str(MACROS), "--define", f"__hugify {_wrapper(work)}", "--define", f"__hugify_brp {BRP}"]
    rc = _run_logged([*cmd, str(spec)], work, {**build_env, "HOME": str(work)}, work / "log")
    (work / "rc").write_text(str(rc))
    (work / "packages").mkdir()
    (work / "published").mkdir()
    for f in sorted((top / "RPMS").rglob("*")):
        if f.suffix == ".rpm":
            shutil.move(f, work / "packages" / f.name)
        elif f.is_file():
            shutil.move(f, work / "published" / f.name)
    shutil.rmtree(top)


def _build_deb(work: Path, build_env: dict[str, str]) -> None:
    src = work / "src" / "hugify-sign-test-1.0"
    shutil.copytree(DEB_DIR, src)
    for f in (RPM_DIR / "main.c", RPM_DIR / "lib.c", RPM_DIR / "small.c", REPO / "tests/programs/gen_code.py"):
        shutil.copy(f, src)
    _wrapper(work)
    path = f"{work / 'bin'}:{DH_DIR}:{build_env['PATH']}"
    cmd = ["dpkg-buildpackage", "-us", "-uc", "-b"]
    # The add-on's commands from this checkout (PATH) with the module they share (PERL5LIB).
    env = {**build_env, "PATH": path, "PERL5LIB": str(DH_DIR), "HOME": str(work)}
    rc = _run_logged(cmd, src, env, work / "log")
    (work / "rc").write_text(str(rc))
    (work / "packages").mkdir()
    (work / "published").mkdir()
    for f in sorted((work / "src").iterdir()):
        if f.suffix == ".deb":
            shutil.move(f, work / "packages" / f.name)
        elif f.name.endswith((signing.STATEMENT_SUFFIX, signing.BUNDLE_SUFFIX)):
            shutil.move(f, work / "published" / f.name)
    shutil.rmtree(work / "src")


def _extract(work: Path) -> None:
    root = work / "root"
    root.mkdir()
    for p in sorted((work / "packages").iterdir()):
        if p.suffix == ".rpm":
            subprocess.run(f"rpm2cpio {p} | cpio -idm --quiet", shell=True, cwd=root, check=True)
        else:
            subprocess.run(["dpkg-deb", "-x", str(p), str(root)], check=True)


def _load(d: Path) -> Built:
    return Built(
        d,
        int((d / "rc").read_text()),
        (d / "log").read_text(),
        sorted((d / "packages").iterdir()),
        d / "root",
        d / "published",
        d / "keys" / "cosign.key",
        d / "keys" / "cosign.pub",
    )


def built(name: str) -> Built:
    """The variant's build, from the cache or built now (one builder at a time)."""
    v = VARIANTS[name]
    base = cache_root()
    final = base / f"sign-{name}-{_key(name)}"
    if (final / "done").exists():
        return _load(final)
    with locked(base / f"sign-{name}.lock"):
        if not (final / "done").exists():
            # Built in place (the policy names the key by its path); complete once "done" exists.
            shutil.rmtree(final, ignore_errors=True)
            key, _ = keypair(final / "keys")
            (final / "policy.toml").write_text(v.policy.replace("@KEY@", str(key)))
            try:
                (_build_rpm if v.kind == "rpm" else _build_deb)(final, env())
                _extract(final)
            except BaseException:
                shutil.rmtree(final, ignore_errors=True)
                raise
            (final / "done").touch()
            for stale in base.glob(f"sign-{name}-*"):
                if stale != final and re.fullmatch(r"[0-9a-f]{16}", stale.name.rsplit("-", 1)[-1]):
                    shutil.rmtree(stale, ignore_errors=True)
    return _load(final)


def succeeded(b: Built) -> Built:
    assert b.rc == 0, b.log[-5000:]
    return b


def signed_build(kind: str) -> tuple[Built, dict[str, str], str]:
    """A signed build, its hugified files and the statement's name."""
    if kind == "rpm":
        return succeeded(built("rpm-signed")), RPM_FILES, "hugify-test"
    return succeeded(built("deb-signed")), DEB_FILES, "hugify-sign-test"


def verify(root: Path, *args: str | Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return hugify("verify", "--root", root, *args, check=False, env=env(HUGIFY_POLICY_PATH="", **extra))


def verdicts(res: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return {f["path"]: f["verdict"] for f in json.loads(res.stdout)["files"]}
