"""Signing, proven with the real tools: cosign v2.6.5 (built into the test cache by
tools/setup-dev-env), rpmbuild with find-debuginfo and brp-strip, and
dpkg-buildpackage with dh_strip.

Package builds (tests/rpm/hugify-test.spec with `%files %{?hugify_attestation}`,
and the Debian package tests/sign/deb, which runs dh_hugify and dh_hugify_sign) are
cached under the test cache directory by the digest of everything they depend on,
each with the key pair cosign generated for it. Tampering tests work on copies in
tmp_path. Every check that a file is covered is made twice: by `hugify verify` and
by cosign alone (verify-blob-attestation with the public key).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from hugify import _core, policy, signing
from testkit.cli import hugify, rpm_env
from testkit.elf import bits_differing, readelf_build_id
from testkit.recipes import BY_NAME, build
from testkit.rpm import BRP, WITH_MACROS, rpm_eval
from testkit.signing import (
    ATTEST,
    DEB_DIR,
    DEB_SMALL,
    DH_DIR,
    PASSWORD,
    RPM_SMALL,
    SHIPPED_POLICY,
    Built,
    built,
    cosign_verify,
    env,
    keypair,
    sha256,
    signed_build,
    succeeded,
    verdicts,
    verify,
)

slow = pytest.mark.slow

# --- rpm ---------------------------------------------------------------------------------------


@slow
def test_rpm_signing_runs_after_the_last_step_that_rewrites_files() -> None:
    b = succeeded(built("rpm-signed"))
    log = b.log
    fdi = log.index("/usr/bin/find-debuginfo -j")
    strip = log.index("+ /usr/lib/rpm/brp-strip ")
    last = log.index("+ /usr/lib/rpm/brp-remove-la-files")  # the last step of Debian's %__os_install_post
    sign = log.index(f"+ {BRP} --sign ")
    assert fdi < strip < last < sign
    assert "hugify: hugify-test: statement of 2 file(s), 3 name(s), signed with " in log[sign:]
    assert log.count(f"{BRP} --sign") == 1
    assert PASSWORD not in log


@slow
def test_rpm_ships_the_statement_and_bundle_and_publishes_them_beside_the_rpms() -> None:
    b = succeeded(built("rpm-signed"))
    main = next(p for p in b.packages if p.name == "hugify-test-1.0-1.x86_64.rpm")
    listed = subprocess.run(["rpm", "-qlp", str(main)], capture_output=True, text=True, check=True).stdout.split()
    for suffix in (".intoto.json", ".bundle"):
        installed = b.root / ATTEST / f"hugify-test{suffix}"
        assert f"/{ATTEST}/hugify-test{suffix}" in listed
        assert (b.published / f"hugify-test-1.0-1.x86_64{suffix}").read_bytes() == installed.read_bytes()


@slow
def test_rpm_required_mode_without_a_key_fails_the_build_with_the_reason() -> None:
    b = built("rpm-required-nokey")
    assert b.rc != 0 and b.packages == []
    assert 'signing.mode is "required" but no signing.key is configured' in b.log
    assert "transformed (shift)" not in b.log, "it fails at the first hugify step, before any change"
    assert "Bad exit status" in b.log


@slow
def test_rpm_off_ships_a_statement_without_a_bundle(tmp_path: Path) -> None:
    b = succeeded(built("rpm-off"))
    assert 'hugify: hugify-test: statement of 2 file(s), 3 name(s), not signed: signing.mode = "off"' in b.log
    main = next(p for p in b.packages if p.name == "hugify-test-1.0-1.x86_64.rpm")
    listed = subprocess.run(["rpm", "-qlp", str(main)], capture_output=True, text=True, check=True).stdout.split()
    assert f"/{ATTEST}/hugify-test.intoto.json" in listed
    assert not any(p.endswith(".bundle") for p in listed)
    assert sorted(p.name for p in b.published.iterdir()) == ["hugify-test-1.0-1.x86_64.intoto.json"]
    _, pub = keypair(tmp_path)
    res = verify(b.root, "--all", "--key", pub)
    assert res.returncode == signing.Verdict.UNSIGNED.status, res.stdout + res.stderr
    assert "/usr/bin/hugify-test: unsigned" in res.stdout


# --- Debian ------------------------------------------------------------------------------------


@slow
def test_deb_dh_hugify_sign_runs_after_dh_strip_and_installs_into_the_package() -> None:
    b = succeeded(built("deb-signed"))
    log = b.log
    assert log.index("\ndh_hugify\n") < log.index("\ndh_strip\n") < log.index("\ndh_hugify_sign\n")
    assert "hugify: hugify-sign-test: statement of 2 file(s), 3 name(s), signed with " in log
    assert PASSWORD not in log
    deb = next(p for p in b.packages if p.name == "hugify-sign-test_1.0_amd64.deb")
    listed = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    for suffix in (".intoto.json", ".bundle"):
        assert f"./{ATTEST}/hugify-sign-test{suffix}" in listed
    # Nothing beside the .debs: a copy there would not be in the .changes and go stale.
    assert list(b.published.iterdir()) == []


# --- both: what the statement says, and who can check it ---------------------------------------------


@slow
@pytest.mark.parametrize("kind", ["rpm", "deb"])
def test_statement_describes_the_shipped_files(kind: str) -> None:
    b, files, name = signed_build(kind)
    text = (b.root / ATTEST / f"{name}.intoto.json").read_text()
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n", "canonical: sorted keys"
    doc = json.loads(text)
    assert doc["_type"] == "https://in-toto.io/Statement/v1"
    assert doc["predicateType"] == signing.PREDICATE_TYPE
    assert {s["name"]: s["digest"]["sha256"] for s in doc["subject"]} == {
        "/" + f: sha256(b.root / f) for f in files.values()
    }
    pred = doc["predicate"]
    assert pred["hugify"] == {"version": _core.VERSION} and pred["package"] == name
    layers = policy.load(files=[SHIPPED_POLICY, b.dir / "policy.toml"])
    assert pred["policy"] == {"sha256": policy.resolve(layers, name).digest()}
    by_path = {e["paths"][0]: e for e in pred["files"]}
    assert sorted(by_path) == sorted(["/" + files["prog"], "/" + files["lib"]])
    assert by_path["/" + files["prog"]]["paths"] == ["/" + files["prog"], "/" + files["link"]]
    for f in (files["prog"], files["lib"]):
        e = by_path["/" + f]
        assert e["shipped"]["build_id"] == readelf_build_id(b.root / f).hex()
        before, after = (bytes.fromhex(e[k]["build_id"]) for k in ("original", "transformed"))
        assert bits_differing(before, after) == 1
        t = e["transformed"]
        assert t["mode"] == "shift" and t["dv"] > 0 and t["dv"] % 4096 == 0 and t["growth"] > 0
        assert t["huge_page"] == 2 << 20 and t["predicted_coverage"] == 1.0 and t["covered_code"] == t["code_bytes"]
        assert re.fullmatch(r"[0-9a-f]{64}", e["original"]["sha256"])
        assert e["original"]["sha256"] != sha256(b.root / f)
    if kind == "deb":  # Debian never recomputes build-ids: the flipped one ships
        assert all(e["shipped"]["build_id"] == e["transformed"]["build_id"] for e in pred["files"])


@slow
@pytest.mark.parametrize("kind", ["rpm", "deb"])
def test_hugify_verify_reports_every_hugified_file_verified(kind: str) -> None:
    b, files, _ = signed_build(kind)
    res = verify(b.root, "--all", "--key", b.pub)
    assert res.returncode == 0, res.stdout + res.stderr
    for f in files.values():
        assert re.search(rf"^/{re.escape(f)}: verified ", res.stdout, re.M), res.stdout
    res = verify(b.root, "--json", "--key", b.pub, *(b.root / f for f in files.values()))
    assert res.returncode == 0 and verdicts(res) == {"/" + f: "verified" for f in files.values()}


@slow
@pytest.mark.parametrize("kind", ["rpm", "deb"])
def test_cosign_alone_verifies_each_hugified_file(kind: str, tmp_path: Path) -> None:
    b, files, name = signed_build(kind)
    bundle = tmp_path / f"{name}.bundle"  # a copy: cosign_verify writes a trusted root beside it
    shutil.copy(b.root / ATTEST / bundle.name, bundle)
    # The bundle's DSSE envelope carries exactly the installed statement.
    envelope = json.loads(bundle.read_text())["dsseEnvelope"]
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    assert base64.b64decode(envelope["payload"]) == (b.root / ATTEST / f"{name}.intoto.json").read_bytes()
    for f in files.values():
        res = cosign_verify(b.pub, bundle, b.root / f)
        assert res.returncode == 0 and "Verified OK" in res.stderr, (f, res.stderr)
    small = RPM_SMALL if kind == "rpm" else DEB_SMALL
    res = cosign_verify(b.pub, bundle, b.root / small)
    assert res.returncode != 0 and "does not match any digest in statement" in res.stderr


def _copy_tree(b: Built, files: dict[str, str], small: str, dest: Path) -> Path:
    for rel in [*files.values(), small, *(f"{ATTEST}/{p.name}" for p in (b.root / ATTEST).iterdir())]:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(b.root / rel, dest / rel)
    return dest


@slow
@pytest.mark.parametrize("kind", ["rpm", "deb"])
def test_tampering_gives_each_verdict_its_own_exit_status(kind: str, tmp_path: Path) -> None:
    b, files, name = signed_build(kind)
    small = RPM_SMALL if kind == "rpm" else DEB_SMALL
    statuses = {}

    # One byte of a hugified file changed.
    root = _copy_tree(b, files, small, tmp_path / "byte")
    lib = root / files["lib"]
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0x01
    lib.write_bytes(data)
    res = verify(root, "--all", "--json", "--key", b.pub)
    got = verdicts(res)
    assert got.pop("/" + files["lib"]) == "modified" and set(got.values()) == {"verified"}
    assert f"/{files['lib']}: modified since signing" in verify(root, "--all", "--key", b.pub).stdout
    statuses["modified"] = res.returncode

    # The statement edited (a subject's digest replaced by the tampered file's).
    root = _copy_tree(b, files, small, tmp_path / "statement")
    statement = root / ATTEST / f"{name}.intoto.json"
    statement.write_text(statement.read_text().replace(sha256(root / files["lib"]), "0" * 64))
    res = verify(root, "--all", "--key", b.pub)
    assert res.stdout.count(": bad signature ") == 3 and "is not the statement signed in" in res.stdout
    statuses["statement edited"] = res.returncode

    # The right files, the wrong public key.
    root = _copy_tree(b, files, small, tmp_path / "key")
    _, other = keypair(tmp_path / "other")
    res = verify(root, "--all", "--key", other)
    assert res.stdout.count(": bad signature ") == 3, res.stdout
    wrong_key = res.returncode
    assert wrong_key == statuses["statement edited"]

    # The bundle removed.
    root = _copy_tree(b, files, small, tmp_path / "bundle")
    (root / ATTEST / f"{name}.bundle").unlink()
    res = verify(root, "--all", "--key", b.pub)
    assert res.stdout.count(": unsigned ") == 3, res.stdout
    statuses["unsigned"] = res.returncode

    # A file no statement lists.
    res = verify(root, "--key", b.pub, "/" + small)
    assert res.stdout.startswith(f"/{small}: no statement")
    statuses["no statement"] = res.returncode

    assert statuses == {
        "modified": signing.Verdict.MODIFIED.status,
        "statement edited": signing.Verdict.BAD_SIGNATURE.status,
        "unsigned": signing.Verdict.UNSIGNED.status,
        "no statement": signing.Verdict.NO_STATEMENT.status,
    }
    assert len(set(statuses.values())) == 4 and 0 not in statuses.values()
    # A run with several verdicts exits with the most serious one.
    res = verify(tmp_path / "byte", "--key", b.pub, "/" + files["lib"], "/" + small)
    assert res.returncode == signing.Verdict.MODIFIED.status


# --- hugify sign and hugify verify on a small tree (fast) --------------------------------------------


@dataclass
class Tree:
    root: Path
    report: Path


def make_tree(base: Path) -> Tree:
    """A build root with a program (and a hardlink) and a library, transformed by
    `hugify tree`, and its report."""
    prog = build(BY_NAME["gcc-bfd"])
    root = base / "root"
    for d in ("usr/bin", "usr/lib64"):
        (root / d).mkdir(parents=True)
    shutil.copy(prog / "prog", root / "usr/bin/prog")
    os.link(root / "usr/bin/prog", root / "usr/bin/prog-link")
    shutil.copy(prog / "libhug.so", root / "usr/lib64/libhug.so")
    report = base / "report.json"
    hugify("tree", root, "--package", "demo", "--report", report, "--no-progress", env=env())
    return Tree(root, report)


@pytest.fixture(scope="module")
def tree_template(tmp_path_factory: pytest.TempPathFactory) -> Tree:
    return make_tree(tmp_path_factory.mktemp("signing-tree"))


@pytest.fixture
def tree(tree_template: Tree, tmp_path: Path) -> Tree:
    shutil.copytree(tree_template.root, tmp_path / "root", symlinks=True)
    shutil.copy(tree_template.report, tmp_path / "report.json")
    return Tree(tmp_path / "root", tmp_path / "report.json")


def write_policy(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def sign(t: Tree, *args: str | Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return hugify("sign", t.root, "--report", t.report, "--package", "demo", *args, check=False, env=env(**extra))


def test_tree_report_records_what_the_statement_needs(tmp_path: Path) -> None:
    prog = build(BY_NAME["gcc-bfd"]) / "prog"
    t = make_tree(tmp_path)
    report = json.loads(t.report.read_text())
    assert report["hugify_version"] == _core.VERSION
    assert report["policy_digest"] == policy.resolve(policy.load(files=[SHIPPED_POLICY]), "demo").digest()
    entry = next(f for f in report["files"] if f["path"] == "/usr/bin/prog")
    assert entry["sha256_before"] == sha256(prog)
    assert entry["build_id_before"] == readelf_build_id(prog).hex()
    assert entry["build_id_after"] == readelf_build_id(t.root / "usr/bin/prog").hex()
    assert entry["huge_page"] == 2 << 20


def test_policy_digest_ignores_origins_and_signing_but_not_values(tmp_path: Path) -> None:
    a = write_policy(tmp_path / "a.toml", 'threshold = "1M"\n[signing]\nmode = "optional"\nkey = "/k"\n')
    b = write_policy(tmp_path / "b.toml", "\n\nthreshold = 1048576\n")
    c = write_policy(tmp_path / "c.toml", 'threshold = "2M"\n')
    digest = [policy.check_file(p).digest() for p in (a, b, c)]
    assert digest[0] == digest[1] != digest[2]
    assert digest[1] == policy.check_file(SHIPPED_POLICY).digest()


def test_statements_are_deterministic(tree: Tree, tmp_path: Path) -> None:
    key, _ = keypair(tmp_path / "keys")
    pol = write_policy(tmp_path / "p.toml", f'[signing]\nmode = "required"\nkey = "{key}"\n')
    first = sign(tree, "--policy", pol, "--no-install", "--output", tmp_path / "one")
    second = sign(tree, "--policy", pol, "--no-install", "--output", tmp_path / "two")
    off = sign(tree, "--no-install", "--output", tmp_path / "off")
    assert first.returncode == second.returncode == off.returncode == 0, first.stderr + second.stderr + off.stderr
    statements = [(tmp_path / f"{n}.intoto.json").read_bytes() for n in ("one", "two", "off")]
    assert statements[0] == statements[1] == statements[2]
    assert not (tmp_path / "off.bundle").exists() and (tmp_path / "two.bundle").exists()
    assert not (tree.root / "usr/share").exists(), "--no-install writes nothing into the tree"


def test_sign_installs_and_lists_what_it_wrote(tree: Tree, tmp_path: Path) -> None:
    key, pub = keypair(tmp_path / "keys")
    pol = write_policy(tmp_path / "p.toml", f'[signing]\nmode = "optional"\nkey = "{key}"\n')
    listing = tmp_path / "files.list"
    res = sign(tree, "--policy", pol, "--file-list", listing)
    assert res.returncode == 0, res.stderr
    assert listing.read_text() == f"/{ATTEST}/demo.intoto.json\n/{ATTEST}/demo.bundle\n"
    assert verify(tree.root, "--all", "--key", pub).returncode == 0
    # Signing off again: the stale bundle goes, the list says so.
    res = sign(tree, "--file-list", listing)
    assert res.returncode == 0 and listing.read_text() == f"/{ATTEST}/demo.intoto.json\n"
    assert not (tree.root / ATTEST / "demo.bundle").exists()


def test_sign_names_the_statement_of_a_multi_arch_same_package_after_its_architecture(
    tree: Tree, tmp_path: Path
) -> None:
    key, pub = keypair(tmp_path / "keys")
    pol = write_policy(tmp_path / "p.toml", f'[signing]\nmode = "required"\nkey = "{key}"\n')
    res = sign(tree, "--policy", pol, "--name", "demo:amd64")
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in (tree.root / ATTEST).iterdir()) == ["demo:amd64.bundle", "demo:amd64.intoto.json"]
    statement = json.loads((tree.root / ATTEST / "demo:amd64.intoto.json").read_text())
    assert statement["predicate"]["package"] == "demo", "the package keeps its name"
    assert verify(tree.root, "--all", "--key", pub).returncode == 0
    for bad in ("../demo", "demo:AMD/64", ".demo"):
        res = sign(tree, "--name", bad)
        assert res.returncode == 2 and "is not a file name" in res.stderr, (bad, res.stderr)


def test_required_signing_that_fails_fails_with_the_reason_and_writes_nothing(tree: Tree, tmp_path: Path) -> None:
    key, _ = keypair(tmp_path / "keys")
    pol = write_policy(tmp_path / "p.toml", f'[signing]\nmode = "required"\nkey = "{key}"\n')
    no_password = {k: v for k, v in env().items() if k != "COSIGN_PASSWORD"}
    res = hugify(
        "sign", tree.root, "--report", tree.report, "--package", "demo", "--policy", pol, check=False, env=no_password
    )
    assert res.returncode == 1
    assert "hugify: error: demo: cannot sign: COSIGN_PASSWORD is not set" in res.stdout
    wrong = "Wr0ng-Secret-Value"
    res = sign(tree, "--policy", pol, COSIGN_PASSWORD=wrong)
    assert res.returncode == 1 and "cannot sign: cosign attest-blob failed: " in res.stdout
    assert "decrypt" in res.stdout and wrong not in res.stdout + res.stderr
    assert not (tree.root / "usr/share").exists()


def test_optional_signing_that_fails_ships_an_unsigned_statement(tree: Tree, tmp_path: Path) -> None:
    pol = write_policy(tmp_path / "p.toml", f'[signing]\nmode = "optional"\nkey = "{tmp_path / "absent.key"}"\n')
    res = sign(tree, "--policy", pol)
    assert res.returncode == 0
    assert re.search(r"hugify: warning: demo: not signed: the signing key \S+ does not exist", res.stdout)
    assert (tree.root / ATTEST / "demo.intoto.json").exists() and not (tree.root / ATTEST / "demo.bundle").exists()


def test_signing_key_from_the_environment_and_never_shown(tree: Tree, tmp_path: Path) -> None:
    key, pub = keypair(tmp_path / "keys")
    pol = write_policy(tmp_path / "p.toml", '[signing]\nmode = "required"\n')
    res = sign(tree, "--policy", pol, HUGIFY_SIGNING_KEY=str(key))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "($HUGIFY_SIGNING_KEY (environment); no transparency log)" in res.stdout
    assert verify(tree.root, "--all", "--key", pub).returncode == 0
    secret = "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY----- abc"
    res = sign(tree, "--policy", pol, HUGIFY_SIGNING_KEY=secret)
    assert res.returncode == 3 and "HUGIFY_SIGNING_KEY" in res.stderr and "BEGIN" not in res.stdout + res.stderr
    # A PKCS#11 PIN in a key reference is masked.
    pin = "pkcs11:token=distro;object=release?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-value=123456"
    assert signing.redact(f"cannot use {pin}") == f"cannot use {pin.replace('123456', '***')}"


def test_nothing_transformed_gives_no_statement(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    shutil.copy(build(BY_NAME["gcc-bfd-small"]) / "prog", root / "usr/bin/small")
    t = Tree(root, tmp_path / "report.json")
    hugify("tree", root, "--report", t.report, "--no-progress", env=env())
    listing = tmp_path / "files.list"
    res = sign(t, "--file-list", listing)
    assert res.returncode == 0 and "demo: no file was transformed: no statement" in res.stdout
    assert listing.read_text() == "" and not (root / "usr/share").exists()


def test_any_of_several_public_keys_may_vouch(tree: Tree, tmp_path: Path) -> None:
    key, pub = keypair(tmp_path / "new")
    _, old = keypair(tmp_path / "old")
    pol = write_policy(tmp_path / "p.toml", f'[signing]\nmode = "required"\nkey = "{key}"\n')
    assert sign(tree, "--policy", pol).returncode == 0
    rotation = write_policy(tmp_path / "v.toml", f'[signing]\npublic_key = ["{old}", "{pub}"]\n')
    res = verify(tree.root, "--all", "--policy", rotation)
    assert res.returncode == 0 and res.stdout.count(": verified ") == 3, res.stdout + res.stderr
    only_old = write_policy(tmp_path / "o.toml", f'[signing]\npublic_key = ["{old}"]\n')
    assert verify(tree.root, "--all", "--policy", only_old).returncode == signing.Verdict.BAD_SIGNATURE.status


def test_verify_usage_errors(tree: Tree, tmp_path: Path) -> None:
    assert verify(tree.root).returncode == 2
    assert verify(tree.root, "--all", "/usr/bin/prog").returncode == 2
    res = verify(tree.root, "/usr/bin/absent")
    assert res.returncode == 5 and "hugify: /usr/bin/absent: no such file (io-error)" in res.stderr
    key, _ = keypair(tmp_path / "keys")
    sign(tree, "--policy", write_policy(tmp_path / "p.toml", f'[signing]\nmode = "required"\nkey = "{key}"\n'))
    res = verify(tree.root, "--all")  # a bundle to check, and no public key
    assert res.returncode == 2 and "no public key" in res.stderr


# --- the rpm glue (fast) ------------------------------------------------------------------------------


def test_brp_sign_mode_passes_rpms_environment_to_hugify_sign(tmp_path: Path, fake_hugify: tuple[Path, Path]) -> None:
    fake, calls = fake_hugify
    brp_env = rpm_env(tmp_path)
    base = [str(BRP), "--sign", "--hugify", str(fake)]
    subprocess.run([*base, "--file-list", "/l", "--output-dir", "/out", "--policy", "/p"], env=brp_env, check=True)
    subprocess.run(base, env=brp_env, check=True)
    subprocess.run(base, env={**brp_env, "RPM_BUILD_ROOT": "/"}, check=True)
    report = f"{tmp_path}/foo-1.2-3.x86_64.hugify.json"
    assert calls.read_text().splitlines() == [
        f"sign {tmp_path}/root --report {report} --recorded-policy --package foo --file-list /l "
        "--output /out/foo-1.2-3.x86_64 --policy /p",
        f"sign {tmp_path}/root --report {report} --recorded-policy --package foo --no-install",
    ]


def test_attestation_macro_lists_the_files_and_appends_the_step_once() -> None:
    """The macros.d file is read before the platform's, so only the expansion of
    %{?hugify_attestation} (while rpm reads the spec) can add the step."""
    spec = ["--define", "__debug_package 1", "--define", "name foo", "--define", "version 1", "--define", "release 2"]
    assert rpm_eval("--eval", "[%{?hugify_attestation}]", files=WITH_MACROS)[0] == "[]", "hugify does not run"
    assert rpm_eval(*spec, "--define", "_hugify 0", "--eval", "[%{?hugify_attestation}]")[0] == "[]"
    before = [x.strip() for x in rpm_eval(*spec, "--eval", "%{__spec_install_post}") if x.strip()]
    assert not any("--sign" in x for x in before)
    twice = ["--eval", "%{?hugify_attestation}"] * 2
    out = rpm_eval(*spec, *twice, "--eval", "%{__spec_install_post}")
    assert re.fullmatch(r"-f /\S+/foo-1-2\.x86_64\.hugify-attestation\.files", out[0]) and out[1] == out[0]
    after = [x.strip() for x in out[2:] if x.strip()]
    assert after[:-1] == before, "the platform's steps stay, in order"
    assert re.fullmatch(
        r"/usr/lib/rpm/brp-hugify --sign --hugify '/usr/bin/hugify' --report-dir '/\S+/BUILD' "
        r"--file-list '/\S+/foo-1-2\.x86_64\."
        r"hugify-attestation\.files' --output-dir '/\S+/RPMS/x86_64'",
        after[-1],
    ), after[-1]


def test_attestation_macro_keeps_shell_continuations_and_distro_integrations(tmp_path: Path) -> None:
    host = tmp_path / "macros.host"
    host.write_text(
        "%__spec_install_post\\\n    sign-modules --opt \\\\\\\n      'a\\\\.b'\\\n    %{__os_install_post}\\\n%{nil}\n"
    )
    spec = ["--define", "__debug_package 1", "--define", "name foo", "--define", "version 1", "--define", "release 2"]
    files = (*WITH_MACROS, (host, "etc"))
    before = rpm_eval(*spec, "--eval", "%{macrobody:__spec_install_post}", files=files)
    assert "    sign-modules --opt \\" in before and "      'a\\.b'" in before
    out = rpm_eval(*spec, "--eval", "%{?hugify_attestation}", "--eval", "%{macrobody:__spec_install_post}", files=files)
    assert out[1 : len(before)] == before[: len(before) - 1]
    assert out[len(before) :][:2] == ["%{?__brp_hugify_sign}", "%{nil}"]
    # A distribution that runs the step itself says so; nothing is appended then.
    distro = ["--define", "__hugify_sign_in_spec_install_post 1"]
    out = rpm_eval(
        *spec, *distro, "--eval", "%{?hugify_attestation}", "--eval", "%{macrobody:__spec_install_post}", files=files
    )
    assert out[0].startswith("-f ") and "__brp_hugify_sign" not in "\n".join(out)


# --- dh_hugify_sign (fast: a debian/ directory, a stand-in hugify) --------------------------------------


def test_dh_hugify_sign_signs_each_package_dh_hugify_reported(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "debian").mkdir(parents=True)
    shutil.copy(DEB_DIR / "debian" / "changelog", src / "debian" / "changelog")
    control = (DEB_DIR / "debian" / "control").read_text()
    control += "\nPackage: hugify-sign-data\nArchitecture: all\nDescription: data\n data\n"
    control += "\nPackage: hugify-sign-other\nArchitecture: any\nDescription: other\n other\n"
    control += "\nPackage: libhugify-sign1\nArchitecture: any\nMulti-Arch: same\nDescription: lib\n lib\n"
    (src / "debian" / "control").write_text(control)
    changelog = (src / "debian" / "changelog").read_text()
    (src / "debian" / "changelog").write_text(changelog.replace("(1.0)", "(1:1.0)"))
    for pkg in ("hugify-sign-test", "hugify-sign-data", "libhugify-sign1"):  # hugify-sign-other: no report
        report = src / "debian/.debhelper/generated" / pkg / "hugify-report.json"
        report.parent.mkdir(parents=True)
        report.write_text("{}")
    calls = tmp_path / "calls"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "hugify").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    (tmp_path / "bin" / "hugify").chmod(0o755)
    run_env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{DH_DIR}:{os.environ['PATH']}", "PERL5LIB": str(DH_DIR)}
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run(["dh_hugify_sign", "--", "--policy", "p.toml"], cwd=src, env=run_env, check=True)
    report = "debian/.debhelper/generated/hugify-sign-test/hugify-report.json"
    lib_report = "debian/.debhelper/generated/libhugify-sign1/hugify-report.json"
    # No copy beside the packages (it would not be in the .changes, and go stale there).
    assert calls.read_text().splitlines() == [
        f"sign debian/hugify-sign-test --report {report} --package hugify-sign-test --recorded-policy --policy p.toml",
        # Multi-Arch: same: installed once per architecture, so named after it.
        f"sign debian/libhugify-sign1 --report {lib_report} --package libhugify-sign1 "
        f"--name libhugify-sign1:{arch} --recorded-policy --policy p.toml",
    ]
    calls.unlink()
    subprocess.run(["dh_hugify_sign", "--destdir=/pub"], cwd=src, env=run_env, check=True)
    assert f"--output /pub/hugify-sign-test_1.0_{arch}" in calls.read_text()
    calls.unlink()
    subprocess.run(["dh_hugify_sign"], cwd=src, env={**run_env, "DEB_BUILD_OPTIONS": "nohugify"}, check=True)
    subprocess.run(["dh_hugify_sign", "-Nhugify-sign-test", "-Nlibhugify-sign1"], cwd=src, env=run_env, check=True)
    assert not calls.exists()
    # A failing hugify sign fails the build.
    (tmp_path / "bin" / "hugify").write_text("#!/bin/sh\nexit 1\n")
    res = subprocess.run(["dh_hugify_sign"], cwd=src, env=run_env, capture_output=True, text=True, check=False)
    assert res.returncode != 0


def test_dh_hugify_sign_man_page_is_valid_pod() -> None:
    res = subprocess.run(["podchecker", str(DH_DIR / "dh_hugify_sign")], capture_output=True, text=True, check=False)
    assert res.returncode == 0 and "pod syntax OK" in res.stdout + res.stderr, res.stderr


def test_verify_all_tells_no_statement_from_no_hugified_file(tmp_path: Path) -> None:
    """A root whose manifest lists a hugified file that no statement lists: each such
    file is "no statement" (exit 10), not "no hugified files" with exit 0, which the old
    code said; a root with neither says there is nothing, and exits 0."""
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    hugify("transform", "--threshold", "0", build(BY_NAME["gcc-bfd"]) / "prog", "-o", root / "usr/bin/prog")
    listing = root / "usr/lib/hugify/manifest.d/demo.list"
    listing.parent.mkdir(parents=True)
    hugify("tree", root, "--manifest-only", "--manifest", listing, "--policy", "/dev/null")
    res = verify(root, "--all")
    assert res.returncode == signing.Verdict.NO_STATEMENT.status == 10, res.stdout + res.stderr
    assert res.stdout.splitlines() == ["/usr/bin/prog: no statement", "hugify: verify: 1 no statement"]
    listing.unlink()
    res = verify(root, "--all")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines() == ["hugify: verify: no hugified files (no statement lists any, and no manifest)"]
