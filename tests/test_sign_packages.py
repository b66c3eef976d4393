"""Signing after the build (docs/signing.md, "The recommended setup: sign after the build"): `hugify
sign-packages` on what real builds produced, with real cosign v2.6.5, and `hugify
verify` (and cosign alone) accepting the detached bundles.

The packages are the test suite's cached builds, built with `signing.mode = "off"`
(no key anywhere near the build): tests/deb/hugify-deb-test with the add-on
(dpkg-buildpackage, its .changes) and tests/rpm/hugify-test.spec with
`%{?hugify_attestation}` (rpmbuild). Every test works on copies; bad input is made
from them with the packaging tools themselves (dpkg-deb -R/--build).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from hugify import signing
from testkit.cli import hugify
from testkit.debian import LIB, LINK, LLD_LIB, LLD_PLUGIN, LLD_PROG, PROG, build_variant
from testkit.signing import ATTEST, PASSWORD, RPM_FILES, cosign_verify, env, keypair, verdicts, verify
from testkit.signing import built as built_signing

slow = pytest.mark.slow
DEB_FILES = {"prog": PROG, "link": LINK, "lib": LIB, "lld-prog": LLD_PROG, "lld-lib": LLD_LIB}
#: What the Debian build signs: a statement in three of its packages (the library's
#: named after its architecture, Multi-Arch: same; the lld package's, amd64 only).
DEB_SIGNED = {
    "hugify-deb-test_1.0_amd64": "hugify-deb-test",
    "libhugdebtest1_1.0_amd64": "libhugdebtest1:amd64",
    "hugify-deb-test-lld_1.0_amd64": "hugify-deb-test-lld",
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sign_packages(*args: str | Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return hugify("sign-packages", *args, check=False, env=env(**extra))


def one_line_refusal(res: subprocess.CompletedProcess[str], reason: str, status: int) -> str:
    assert res.returncode == status, (res.returncode, res.stdout, res.stderr)
    assert len(res.stderr.splitlines()) == 1 and res.stderr.rstrip().endswith(f"({reason})"), res.stderr
    return res.stderr


@pytest.fixture
def debs(tmp_path: Path) -> Path:
    """A copy of the Debian build's upload: its .changes and the files it lists."""
    b = build_variant("with").ok()
    out = tmp_path / "debs"
    shutil.copytree(b.dir / "debs", out)
    return out


def changes(d: Path) -> Path:
    (c,) = d.glob("*.changes")
    return c


def bundles(d: Path) -> list[str]:
    return sorted(p.name for p in d.glob("*" + signing.BUNDLE_SUFFIX))


@slow
def test_debian_upload_signed_after_the_build_verifies_every_way(debs: Path, tmp_path: Path) -> None:
    b = build_variant("with").ok()
    key, pub = keypair(tmp_path / "keys")
    before = {p.name: sha256(p) for p in debs.iterdir()}
    res = sign_packages(changes(debs), "--key", key)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "hugify: sign-packages: 3 statement(s) signed" in res.stdout
    assert "/usr/libexec/hugify-deb-exec is hugified but in no statement" in res.stdout, "the as-is file is named"
    assert f"/{LLD_PLUGIN} is hugified but in no statement" in res.stdout, "the as-is plugin is named"
    assert PASSWORD not in res.stdout + res.stderr and f"signed with {key} (--key; no transparency log)" in res.stdout
    # Detached: the packages (and so the .changes) are untouched; beside them, per
    # signed package, the bundle and the statement it signs, exactly as it ships.
    assert {p.name: sha256(p) for p in debs.iterdir() if p.name in before} == before
    added = sorted(set(p.name for p in debs.iterdir()) - set(before))
    assert added == sorted(f"{s}{x}" for s in DEB_SIGNED for x in (signing.STATEMENT_SUFFIX, signing.BUNDLE_SUFFIX))
    for stem, name in DEB_SIGNED.items():
        package = stem.split("_")[0]
        shipped = b.pkg(package) / ATTEST / f"{name}{signing.STATEMENT_SUFFIX}"
        assert (debs / f"{stem}{signing.STATEMENT_SUFFIX}").read_bytes() == shipped.read_bytes()
        assert signing.signed_payload((debs / f"{stem}{signing.BUNDLE_SUFFIX}").read_bytes()) == shipped.read_bytes()
    # hugify verify on the installed files: without the bundles unsigned, as built. The
    # two as-is files, hugified but in no statement, are "no statement" (as sign-packages
    # warned above: nothing vouches for them).
    as_is = {"/usr/libexec/hugify-deb-exec": "no-statement", f"/{LLD_PLUGIN}": "no-statement"}
    res = verify(b.root, "--all", "--json", "--key", pub)
    assert res.returncode == signing.Verdict.UNSIGNED.status, res.stdout + res.stderr
    assert verdicts(res) == {"/" + f: "unsigned" for f in DEB_FILES.values()} | as_is
    # Given the directory of the bundles...
    res = verify(b.root, "--all", "--json", "--key", pub, "--bundles", debs)
    assert res.returncode == signing.Verdict.NO_STATEMENT.status, res.stdout + res.stderr
    assert verdicts(res) == {"/" + f: "verified" for f in DEB_FILES.values()} | as_is
    # ... or checking against the published statements...
    res = verify(b.root, "--all", "--key", pub, "--attestations", debs)
    assert res.returncode == signing.Verdict.NO_STATEMENT.status, res.stdout + res.stderr
    assert res.stdout.count(": verified ") == 5 and res.stdout.count(": no statement") == 2, res.stdout
    # ... or with the bundles installed where a package of signatures puts them.
    root = tmp_path / "root"
    for f in [*DEB_FILES.values(), *(f"{ATTEST}/{n}{signing.STATEMENT_SUFFIX}" for n in DEB_SIGNED.values())]:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(b.root / f, root / f)
    installed = root / signing.SIGNATURE_DIR.lstrip("/")
    installed.mkdir(parents=True)
    for stem in DEB_SIGNED:
        shutil.copy(debs / f"{stem}{signing.BUNDLE_SUFFIX}", installed)
    res = verify(root, "--all", "--key", pub)
    assert res.returncode == 0 and res.stdout.count(": verified ") == 5, res.stdout + res.stderr
    # cosign alone, as an administrator would run it.
    stems = {
        PROG: "hugify-deb-test_1.0_amd64",
        LINK: "hugify-deb-test_1.0_amd64",
        LIB: "libhugdebtest1_1.0_amd64",
        LLD_PROG: "hugify-deb-test-lld_1.0_amd64",
        LLD_LIB: "hugify-deb-test-lld_1.0_amd64",
    }
    for f, stem in stems.items():
        bundle = tmp_path / "cosign" / f"{stem}{signing.BUNDLE_SUFFIX}"
        bundle.parent.mkdir(exist_ok=True)
        shutil.copy(debs / bundle.name, bundle)
        check = cosign_verify(pub, bundle, b.root / f)
        assert check.returncode == 0 and "Verified OK" in check.stderr, (f, check.stderr)
    # Another key's signature is no signature of the distribution's.
    _, other = keypair(tmp_path / "other")
    res = verify(b.root, "--all", "--key", other, "--bundles", debs)
    assert res.returncode == signing.Verdict.BAD_SIGNATURE.status and res.stdout.count(": bad signature ") == 5


@slow
def test_a_clearsigned_changes_file_is_read_like_a_plain_one(debs: Path, tmp_path: Path) -> None:
    """Upload queues hand over .changes files with an OpenPGP clear signature (checked
    by the queue, not here): its armour and dash-escaping are taken off."""
    c = changes(debs)
    text = c.read_text()
    c.write_text(
        "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA512\n\n"
        + text.replace("\n-", "\n- -")
        + "-----BEGIN PGP SIGNATURE-----\n\niQIzBAEBCgAdFiEE\n-----END PGP SIGNATURE-----\n"
    )
    key, _ = keypair(tmp_path / "keys")
    (tmp_path / "out").mkdir()
    res = sign_packages(c, "--key", key, "-o", tmp_path / "out")
    assert res.returncode == 0, res.stdout + res.stderr
    assert bundles(tmp_path / "out") == sorted(f"{s}{signing.BUNDLE_SUFFIX}" for s in DEB_SIGNED)


@slow
def test_rpm_set_signed_after_the_build_verifies(tmp_path: Path) -> None:
    b = built_signing("rpm-off")
    assert b.rc == 0, b.log[-3000:]
    rpms = tmp_path / "rpms"
    rpms.mkdir()
    for p in b.packages:
        shutil.copy(p, rpms)
    key, pub = keypair(tmp_path / "keys")
    # -o names a directory that must exist: refused before anything is signed
    res = sign_packages(*sorted(rpms.iterdir()), "--key", key, "-o", tmp_path / "out")
    assert res.returncode == 5 and "signed with" not in res.stdout, res.stdout + res.stderr
    assert res.stderr == f"hugify: {tmp_path / 'out'}: no such directory for the bundles (io-error)\n", res.stderr
    (tmp_path / "out").mkdir()
    res = sign_packages(*sorted(rpms.iterdir()), "--key", key, "-o", tmp_path / "out")
    assert res.returncode == 0, res.stdout + res.stderr
    assert bundles(tmp_path / "out") == [f"hugify-test-1.0-1.x86_64{signing.BUNDLE_SUFFIX}"]
    shipped = (b.root / ATTEST / f"hugify-test{signing.STATEMENT_SUFFIX}").read_bytes()
    assert (tmp_path / "out" / f"hugify-test-1.0-1.x86_64{signing.STATEMENT_SUFFIX}").read_bytes() == shipped
    res = verify(b.root, "--all", "--json", "--key", pub, "--bundles", tmp_path / "out")
    assert res.returncode == 0 and verdicts(res) == {"/" + f: "verified" for f in RPM_FILES.values()}, res.stdout
    for f in RPM_FILES.values():
        check = cosign_verify(pub, tmp_path / "out" / f"hugify-test-1.0-1.x86_64{signing.BUNDLE_SUFFIX}", b.root / f)
        assert check.returncode == 0 and "Verified OK" in check.stderr, (f, check.stderr)
    # A damaged rpm: rpm's own digests find it, nothing is signed.
    main = rpms / "hugify-test-1.0-1.x86_64.rpm"
    data = bytearray(main.read_bytes())
    data[-100] ^= 0xFF
    main.write_bytes(data)
    res = sign_packages(main, "--key", key, "-o", tmp_path / "damaged")
    one_line_refusal(res, "not-a-package", 3)
    assert not (tmp_path / "damaged").exists()


def _repacked(deb: Path, dest: Path, change) -> Path:
    """The .deb unpacked with dpkg-deb -R, changed, and built again."""
    tree = dest.parent / f"{dest.name}.tree"
    subprocess.run(["dpkg-deb", "-R", str(deb), str(tree)], check=True)
    change(tree)
    subprocess.run(["dpkg-deb", "--build", "-Zxz", str(tree), str(dest)], capture_output=True, check=True)
    return dest


@slow
def test_bad_input_is_refused_in_one_line_and_nothing_is_written(debs: Path, tmp_path: Path) -> None:
    key, _ = keypair(tmp_path / "keys")
    out = tmp_path / "out"
    prog_deb = debs / "hugify-deb-test_1.0_amd64.deb"

    # A package whose bytes are not what the .changes says.
    tampered = tmp_path / "tampered"
    shutil.copytree(debs, tampered)
    data = bytearray((tampered / prog_deb.name).read_bytes())
    data[len(data) // 2] ^= 0x01
    (tampered / prog_deb.name).write_bytes(data)
    line = one_line_refusal(sign_packages(changes(tampered), "--key", key, "-o", out), "changes-mismatch", 3)
    assert f"{prog_deb.name} has SHA-256 " in line
    # One the .changes lists that is not there.
    (tampered / prog_deb.name).unlink()
    line = one_line_refusal(sign_packages(changes(tampered), "--key", key, "-o", out), "changes-mismatch", 3)
    assert f"{prog_deb.name} is missing" in line
    # A truncated package given by itself.
    cut = tmp_path / "cut.deb"
    cut.write_bytes(prog_deb.read_bytes()[:5000])
    one_line_refusal(sign_packages(cut, "--key", key, "-o", out), "not-a-package", 3)

    # A package whose hugified program is not the one its statement lists.
    def patch_program(tree: Path) -> None:
        prog = tree / PROG
        data = bytearray(prog.read_bytes())
        data[-1] ^= 0x01
        prog.write_bytes(data)

    other = _repacked(prog_deb, tmp_path / "other.deb", patch_program)
    line = one_line_refusal(sign_packages(other, "--key", key, "-o", out), "statement-mismatch", 3)
    assert f"lists /{PROG} with SHA-256 " in line

    # A statement listing a file the package does not hold.
    def drop_link(tree: Path) -> None:
        (tree / LINK).unlink()

    missing = _repacked(prog_deb, tmp_path / "missing.deb", drop_link)
    line = one_line_refusal(sign_packages(missing, "--key", key, "-o", out), "statement-mismatch", 3)
    assert f"lists /{LINK}, which no package given holds" in line

    # A statement of another package.
    def rename(tree: Path) -> None:
        statement = tree / ATTEST / "hugify-deb-test.intoto.json"
        doc = json.loads(statement.read_text())
        doc["predicate"]["package"] = "sudo"
        statement.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")

    renamed = _repacked(prog_deb, tmp_path / "renamed.deb", rename)
    line = one_line_refusal(sign_packages(renamed, "--key", key, "-o", out), "statement-mismatch", 3)
    assert "is the statement of sudo, not of hugify-deb-test" in line

    # Hugified files, and no statement to sign.
    unsigned = _repacked(prog_deb, tmp_path / "unsigned.deb", lambda tree: shutil.rmtree(tree / ATTEST))
    line = one_line_refusal(sign_packages(unsigned, "--key", key, "-o", out), "statement-missing", 4)
    assert f"/{PROG}" in line

    # No key, or one cosign cannot use: nothing signed, and the password never shown.
    line = one_line_refusal(sign_packages(changes(debs), "-o", out), "signing-failed", 5)
    assert "no signing key" in line
    wrong = "Wr0ng-Secret-Value"
    out.mkdir()  # -o names a directory that exists (checked before anything is signed)
    res = sign_packages(changes(debs), "--key", key, "-o", out, COSIGN_PASSWORD=wrong)
    line = one_line_refusal(res, "signing-failed", 5)
    assert "decrypt" in line and wrong not in res.stdout + res.stderr
    assert list(out.iterdir()) == [], "nothing is written unless every statement was signed"
    explained = hugify("explain", "statement-missing", "statement-mismatch", "changes-mismatch", "bad-changes")
    assert explained.returncode == 0 and len(explained.stdout.splitlines()) == 4
