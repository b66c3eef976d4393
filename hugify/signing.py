"""Signed statements of what hugify changed, and their verification.

Rewriting a file invalidates whatever vouched for its bytes, so hugify vouches for
what it changed. ``hugify tree`` writes a report with each transformed file's
sha256 and build-id before the rewrite and what the rewriter did. Later tools
(find-debuginfo, strip) rewrite the files again, so ``hugify sign`` runs after the
last of them: it hashes the files as they ship and writes an in-toto Statement v1
whose subjects are those files and whose predicate (``PREDICATE_TYPE``, documented
in signing/predicate-v1.md) records the transformation. ``cosign attest-blob``
signs it into a Sigstore bundle: a DSSE envelope whose payload is exactly the
statement's bytes.

``hugify verify`` checks a bundle with ``cosign verify-blob-attestation``, that the
statement beside it is the payload that was signed, and each file's current
sha256 against its subject. cosign alone can check a file too (docs/signing.md).

Secrets never pass through hugify: cosign reads ``COSIGN_PASSWORD`` (or a KMS's
credentials) from the environment it inherits, key references are shown with any
PKCS#11 PIN masked, and cosign's messages are passed on with the same masking.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import enum
import hashlib
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from hugify import manifest
from hugify.files import directory_for, source_date_epoch, write_text_atomic
from hugify.policy import is_package_name

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
#: hugify's predicate, version 1 (signing/predicate-v1.md). Verifiers pin it.
PREDICATE_TYPE = "https://hugify.dev/attestation/transform/v1"
#: The DSSE payload type of in-toto statements.
PAYLOAD_TYPE = "application/vnd.in-toto+json"
#: Where packages install their statement (NAME.intoto.json) and bundle (NAME.bundle).
ATTESTATION_DIR = "/usr/share/hugify/attestations"
#: Where signatures made after the build (`hugify sign-packages`) are installed, by a
#: package of the distribution's own: any bundle there that signs an installed
#: statement counts for it (docs/signing.md).
SIGNATURE_DIR = "/usr/share/hugify/signatures"
STATEMENT_SUFFIX = ".intoto.json"
BUNDLE_SUFFIX = ".bundle"
#: The cosign executable; default: `cosign` on PATH.
COSIGN_ENV = "HUGIFY_COSIGN"
#: A Sigstore trusted root that trusts no CA, log or timestamp authority. cosign
#: needs a trusted root to read a Sigstore bundle; with a public key and no
#: transparency log, the key is the only trust anchor and this is all it needs.
OFFLINE_TRUSTED_ROOT = '{"mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1"}\n'
#: Seconds one cosign call may take (KMS round trips, a tlog upload).
COSIGN_TIMEOUT = 600


class SigningError(Exception):
    """Signing or verification could not be attempted, or cosign failed; the
    message is safe to log."""


class ReportError(Exception):
    """The `hugify tree` report cannot be used."""


# --- secrets ---------------------------------------------------------------------------

_PIN = re.compile(r"(pin-value=)[^;&?\s]*", re.IGNORECASE)


def redact(text: str) -> str:
    """Text safe for a build log: PKCS#11 PINs and the value of COSIGN_PASSWORD masked."""
    text = _PIN.sub(r"\1***", text)
    password = os.environ.get("COSIGN_PASSWORD", "")
    if len(password) >= 4:  # a short value would mask ordinary words
        text = text.replace(password, "***")
    return text


# --- statements -------------------------------------------------------------------------


def file_sha256(file: Path | int, *, follow: bool = True) -> str:
    """The digest of a file's content: of the file open at the descriptor `file`
    (read from its start with pread, the descriptor's offset untouched), so that a
    caller that opened a file once hashes that very inode (`hugify tree`, the file it
    transforms); or of the file at the path `file`, and then without `follow` of the
    file the path names itself (a build tree's file swapped for a symlink is not
    followed)."""
    if not isinstance(file, int):
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
        try:
            return file_sha256(fd)
        finally:
            os.close(fd)
    h, offset = hashlib.sha256(), 0
    while chunk := os.pread(file, 1 << 20, offset):
        h.update(chunk)
        offset += len(chunk)
    return h.hexdigest()


def _shipped_build_id(path: Path) -> str | None:
    from hugify import _core

    try:
        found = _core.probe(path)
    except (_core.HugifyError, OSError):
        return None
    return found["build_id"] if found else None


def _need(mapping: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in mapping or mapping[key] is None:
        raise ReportError(f"{where} has no {key!r}: written by an older hugify tree? build again")
    return mapping[key]


class Statement(NamedTuple):
    text: str
    files: int  # hugified inodes it describes
    subjects: int  # installed names, one subject each
    #: Transformed paths no longer in the tree (not in the statement).
    missing: list[str]


def build_statement(report: Mapping[str, Any], root: Path, package: str) -> Statement | None:
    """The statement for the files `hugify tree` transformed under `root`, hashed as
    they are now; None when it transformed none. Same inputs, same bytes."""
    version = manifest.TREE_REPORT_VERSION
    if report.get("hugify_tree_report") != version:
        why = f"not a hugify tree report of this hugify's version ({version}): written by another hugify tree?"
        raise ReportError(why)
    subjects: dict[str, str] = {}
    entries: list[dict[str, Any]] = []
    missing: list[str] = []
    for f in report.get("files", []):
        if f.get("status") != "transformed":
            continue
        where = f"the report's entry for {f.get('path')}"
        hashed: dict[tuple[int, int], str] = {}  # names of one inode are hashed once
        present = []
        for p in _need(f, "paths", where):
            file = root / p.lstrip("/")
            try:
                st = file.lstat()
            except FileNotFoundError:
                missing.append(p)
                continue
            if not file.is_file() or file.is_symlink():
                missing.append(p)
                continue
            key = (st.st_dev, st.st_ino)
            if key not in hashed:
                hashed[key] = file_sha256(file, follow=False)
            subjects[p] = hashed[key]
            present.append(p)
        if not present:
            continue
        huge_page = int(_need(f, "huge_page", where))
        code = int(_need(f, "code_bytes", where))
        entries.append(
            {
                "paths": present,
                "original": {"sha256": _need(f, "sha256_before", where), "build_id": f.get("build_id_before")},
                "transformed": {
                    "build_id": f.get("build_id_after"),
                    "mode": _need(f, "mode", where),
                    "dv": int(_need(f, "dv", where)),
                    "df": int(_need(f, "df", where)),
                    "growth": int(_need(f, "growth", where)),
                    "huge_page": huge_page,
                    "code_bytes": code,
                    "covered_code": int(_need(f, "covered_code", where)),
                    "predicted_coverage": _need(f, "coverage", where),
                    # What became executable that was not (policy exposure_limit): bytes and sections.
                    "exposed": {
                        "bytes": int(_need(f, "exposed_bytes", where)),
                        "sections": dict(_need(f, "exposed_sections", where)),
                    },
                    # The program header table left e_phoff (dwz and eu-strip zero it there).
                    # Reports written before the field existed say nothing, so neither does
                    # their statement.
                    **(
                        {"phdr_table_displaced": bool(f["phdr_table_displaced"])} if "phdr_table_displaced" in f else {}
                    ),
                },
                "shipped": {"build_id": _shipped_build_id(root / present[0].lstrip("/"))},
            }
        )
    if not entries:
        return None
    doc = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": p, "digest": {"sha256": d}} for p, d in sorted(subjects.items())],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "hugify": {"version": _need(report, "hugify_version", "the report")},
            "package": package,
            "arch": report.get("arch"),
            "policy": {"sha256": _need(report, "policy_digest", "the report")},
            "files": sorted(entries, key=lambda e: e["paths"][0]),
        },
    }
    text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    return Statement(text, len(entries), len(subjects), missing)


def is_statement_stem(stem: str) -> bool:
    """A statement's file stem: a package name, or NAME:ARCH (Multi-Arch: same)."""
    name, _, arch = stem.partition(":")
    return is_package_name(name) and (not arch or re.fullmatch(r"[a-z0-9][a-z0-9-]*", arch) is not None)


def read_report(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ReportError(f"{path}: not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ReportError(f"{path}: not a hugify tree report")
    return doc


# --- cosign ---------------------------------------------------------------------------------


def cosign_executable() -> str:
    return os.environ.get(COSIGN_ENV) or "cosign"


def _cosign(args: list[str]) -> subprocess.CompletedProcess[str]:
    exe = cosign_executable()
    try:
        return subprocess.run(
            [exe, *args],
            stdin=subprocess.DEVNULL,  # never a password prompt in a build
            capture_output=True,
            text=True,
            timeout=COSIGN_TIMEOUT,
            check=False,
        )
    except FileNotFoundError:
        raise SigningError(f"cosign not found ({exe}): install it, or name it in ${COSIGN_ENV}") from None
    except PermissionError:
        raise SigningError(f"cannot run cosign ({exe}): permission denied") from None
    except subprocess.TimeoutExpired:
        raise SigningError(f"cosign {args[0]} did not finish within {COSIGN_TIMEOUT} s") from None


def _cosign_error(res: subprocess.CompletedProcess[str]) -> str:
    """cosign's own reason, from its "Error: ..." line."""
    lines = [line.strip() for line in res.stderr.splitlines() if line.strip()]
    reason = next((line[len("Error: ") :] for line in lines if line.startswith("Error: ")), None)
    return redact(reason or (lines[-1] if lines else f"exit status {res.returncode}"))


def _is_key_file(ref: str) -> bool:
    return ref.startswith("/")


def attest(statement: Path, bundle: Path, key: str, tlog_upload: bool) -> None:
    """Signs the statement file with cosign into a Sigstore bundle; raises SigningError."""
    if _is_key_file(key):
        if not os.path.isfile(key):
            raise SigningError(f"the signing key {key} does not exist or is not a file")
        if "COSIGN_PASSWORD" not in os.environ:
            raise SigningError(
                "COSIGN_PASSWORD is not set: cosign needs the password of the key file "
                "(set it to the empty string for a key without one)"
            )
    res = _cosign(
        [
            "attest-blob",
            "--yes",
            "--statement",
            str(statement),
            "--key",
            key,
            "--new-bundle-format",
            f"--tlog-upload={'true' if tlog_upload else 'false'}",
            "--bundle",
            str(bundle),
        ]
    )
    if res.returncode != 0 or not bundle.is_file():
        raise SigningError(f"cosign attest-blob failed: {_cosign_error(res)}")


def check_bundle(bundle: Path, public_key: str, tlog: bool, trusted_root: Path | None) -> str | None:
    """Checks the bundle's signature with cosign: None if good, else cosign's reason.
    Without tlog, `trusted_root` (an OFFLINE_TRUSTED_ROOT file) must be given."""
    args = [
        "verify-blob-attestation",
        "--key",
        public_key,
        "--bundle",
        str(bundle),
        "--new-bundle-format",
        "--type",
        PREDICATE_TYPE,
        "--check-claims=false",  # hugify compares the digests itself, per file
    ]
    if not tlog:
        assert trusted_root is not None
        args += ["--insecure-ignore-tlog", "--trusted-root", str(trusted_root)]
    res = _cosign(args)
    return None if res.returncode == 0 else _cosign_error(res)


def signed_payload(bundle: bytes) -> bytes:
    """The in-toto statement inside a Sigstore bundle's DSSE envelope (unverified)."""
    try:
        envelope = json.loads(bundle)["dsseEnvelope"]
        if envelope["payloadType"] != PAYLOAD_TYPE:
            raise ValueError(f"payload type {envelope['payloadType']!r}")
        return base64.b64decode(envelope["payload"], validate=True)
    except (ValueError, KeyError, TypeError, binascii.Error) as e:
        raise ValueError(f"not a Sigstore bundle with an in-toto statement ({e})") from None


# --- signing a package -------------------------------------------------------------------


class SignRequest(NamedTuple):
    root: Path
    report: Mapping[str, Any]  # the tree report (hugify.tree.Report, or one read from a file)
    name: str  # NAME of NAME.intoto.json
    mode: str  # off | optional | required
    mode_where: str
    key: str
    key_where: str
    tlog_upload: bool
    install: bool  # into root/ATTESTATION_DIR
    output: Path | None  # also write OUTPUT.intoto.json and OUTPUT.bundle
    file_list: Path | None  # installed paths written, one a line (rpm %files -f)
    #: STEM of the installed STEM.intoto.json, when not the name: a Multi-Arch: same
    #: package's is NAME:ARCH, so that its builds for two architectures install together.
    stem: str | None = None


def _write(path: Path, text: str, tree: Path | None = None) -> None:
    write_text_atomic(path, text, source_date_epoch(), tree=tree)


def _place(prefix: Path, statement: str, bundle: str | None, tree: Path | None = None) -> list[Path]:
    """Writes PREFIX.intoto.json and PREFIX.bundle (or removes a stale bundle);
    `tree`: the build root PREFIX lies in, whose directories are never reached
    through a symlink (hugify/files.py)."""
    written = [prefix.with_name(prefix.name + STATEMENT_SUFFIX)]
    _write(written[0], statement, tree)
    stale = prefix.with_name(prefix.name + BUNDLE_SUFFIX)
    if bundle is None:
        with directory_for(stale, tree=tree) as (d, name), contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=d.fd)
    else:
        _write(stale, bundle, tree)
        written.append(stale)
    return written


def sign(req: SignRequest, say: Callable[[str], None]) -> bool:
    """Writes (and signs) the package's statement. False when signing failed and
    the mode is "required" (nothing is written then). Raises ReportError, OSError."""
    who = f"hugify: {req.name}:"
    installed: list[str] = []
    stmt = build_statement(req.report, req.root, req.name)
    for p in stmt.missing if stmt else []:
        say(f"hugify: warning: {p} was transformed but is no longer in the tree; it is not in the statement")
    if stmt is None:
        say(f"{who} no file was transformed: no statement")
    else:
        what = f"statement of {stmt.files} file(s), {stmt.subjects} name(s)"
        bundle = None
        if req.mode == "off":
            say(f'{who} {what}, not signed: signing.mode = "off" ({req.mode_where})')
        elif not req.key:
            say(f'{who} {what}, not signed: signing.mode = "optional" and no signing.key ({req.mode_where})')
        else:
            try:
                bundle = attest_text(stmt.text, req.key, req.tlog_upload)
            except SigningError as e:
                if req.mode == "required":
                    say(f'hugify: error: {req.name}: cannot sign: {e}; signing.mode = "required" ({req.mode_where})')
                    return False
                say(
                    f"hugify: warning: {req.name}: not signed: {e}; "
                    f'signing.mode = "optional" ({req.mode_where}): the statement ships unsigned'
                )
            else:
                tlog = "uploaded to the transparency log" if req.tlog_upload else "no transparency log"
                say(f"{who} {what}, signed with {redact(req.key)} ({req.key_where}; {tlog})")
        if req.install:
            for f in _place(
                req.root / ATTESTATION_DIR.lstrip("/") / (req.stem or req.name), stmt.text, bundle, req.root
            ):
                installed.append("/" + f.relative_to(req.root).as_posix())
                say(f"{who} wrote {installed[-1]}")
        if req.output is not None:
            for f in _place(req.output, stmt.text, bundle):
                say(f"{who} wrote {f}")
    if req.file_list is not None:
        _write(req.file_list, "".join(f"{p}\n" for p in installed))
    return True


def attest_text(statement: str, key: str, tlog_upload: bool) -> str:
    """The Sigstore bundle (text) of cosign's signature over exactly `statement`."""
    with tempfile.TemporaryDirectory(prefix="hugify-sign-") as tmp:
        path, bundle = Path(tmp) / "statement.json", Path(tmp) / "bundle.json"
        path.write_text(statement, encoding="utf-8")
        attest(path, bundle, key, tlog_upload)
        text = bundle.read_text(encoding="utf-8")
    if signed_payload(text.encode()) != statement.encode():
        raise SigningError("cosign signed something other than the statement")
    return text if text.endswith("\n") else text + "\n"


# --- verifying installed files ---------------------------------------------------------------


class Verdict(enum.Enum):
    """Per-file outcome of `hugify verify`: (id, text, exit status). A run exits
    with the highest status of its files."""

    VERIFIED = ("verified", "verified", 0)
    NOT_INSTALLED = ("not-installed", "not installed", 0)  # --all only
    NO_STATEMENT = ("no-statement", "no statement", 10)
    UNSIGNED = ("unsigned", "unsigned", 11)
    MODIFIED = ("modified", "modified since signing", 12)
    BAD_SIGNATURE = ("bad-signature", "bad signature", 13)

    @property
    def id(self) -> str:
        return self.value[0]

    @property
    def text(self) -> str:
        return self.value[1]

    @property
    def status(self) -> int:
        return self.value[2]


class Result(NamedTuple):
    path: str
    verdict: Verdict
    detail: str = ""
    statement: str | None = None  # the statement file that lists the path

    def as_json(self) -> dict[str, Any]:
        return {"path": self.path, "verdict": self.verdict.id, "detail": self.detail, "statement": self.statement}

    def line(self) -> str:
        text = f"{self.path}: {self.verdict.text}"
        if self.statement:
            text += f" ({self.statement})"
        return f"{text}: {self.detail}" if self.detail else text


def _subjects(data: bytes) -> dict[str, str] | None:
    """name -> sha256 of a statement's subjects; None unless it is a statement."""
    try:
        doc = json.loads(data)
        if doc["_type"] != STATEMENT_TYPE:
            return None
        return {str(s["name"]): str(s["digest"]["sha256"]) for s in doc["subject"]}
    except (ValueError, KeyError, TypeError):
        return None


class BundleIndex:
    """Detached bundles (signatures made after the build, docs/signing.md), found by
    the statement they sign: the payload of a bundle's DSSE envelope is the statement's
    exact bytes, whatever the two files are called. What is not a bundle is skipped."""

    def __init__(self, directories: Iterable[Path]) -> None:
        self.directories = [d for d in directories if d.is_dir()]
        self._by_payload: dict[bytes, Path] = {}
        for d in self.directories:
            for bundle in sorted(d.glob("*" + BUNDLE_SUFFIX)):
                try:
                    payload = signed_payload(bundle.read_bytes())
                except (OSError, ValueError):
                    continue
                self._by_payload.setdefault(hashlib.sha256(payload).digest(), bundle)

    def find(self, statement: bytes) -> Path | None:
        return self._by_payload.get(hashlib.sha256(statement).digest())


class Attestation:
    """One package's statement, its bundle if any (beside it, NAME.bundle, as an
    in-build signing installs it; else a detached one that signs it), and (once
    checked) whether the bundle's signature is good and signs exactly this statement."""

    def __init__(self, statement: Path, detached: BundleIndex | None = None) -> None:
        self.statement = statement
        self.name = statement.name[: -len(STATEMENT_SUFFIX)]
        self.bundle = statement.with_name(self.name + BUNDLE_SUFFIX)
        self.data = statement.read_bytes()
        self.searched = list(detached.directories) if detached else []
        if not self.bundle.exists() and detached is not None:
            self.bundle = detached.find(self.data) or self.bundle
        self.payload: bytes | None = None
        self.problem: str | None = None  # with the bundle, found before any signature check
        if self.bundle.exists():
            try:
                self.payload = signed_payload(self.bundle.read_bytes())
            except (OSError, ValueError) as e:
                self.problem = f"{self.bundle.name}: {e}"
        # The signed statement says which files it covers, even if the file beside it was edited.
        subjects = _subjects(self.data)
        if subjects is None and self.payload is not None:
            subjects = _subjects(self.payload)
        self.subjects = subjects or {}
        self._checked: tuple[str | None] | None = None

    def signature_problem(self, check: Callable[[Path], str | None]) -> str | None:
        """None when the bundle is signed by a trusted key and signs this statement
        (checked once)."""
        if self._checked is None:
            if self.problem:
                self._checked = (self.problem,)
            elif self.payload != self.data:
                self._checked = (f"{self.statement.name} is not the statement signed in {self.bundle.name}",)
            else:
                self._checked = (check(self.bundle),)
        return self._checked[0]


def load_attestations(directory: Path, detached: BundleIndex | None = None) -> list[Attestation]:
    if not directory.is_dir():
        return []
    return [Attestation(p, detached) for p in sorted(directory.glob("*" + STATEMENT_SUFFIX)) if p.is_file()]


class Verifier:
    """Checks bundles with cosign against any of the trusted public keys."""

    def __init__(self, keys: Iterable[str], tlog: bool, workdir: Path) -> None:
        self.keys = list(keys)
        self.tlog = tlog
        self.trusted_root: Path | None = None
        if not tlog:
            self.trusted_root = workdir / "offline-trusted-root.json"
            self.trusted_root.write_text(OFFLINE_TRUSTED_ROOT, encoding="utf-8")

    def __call__(self, bundle: Path) -> str | None:
        if not self.keys:
            raise SigningError("no public key to verify signatures with: pass --key or set signing.public_key")
        problems = []
        for key in self.keys:
            why = check_bundle(bundle, key, self.tlog, self.trusted_root)
            if why is None:
                return None
            problems.append(f"cosign: {why}" if len(self.keys) == 1 else f"{redact(key)}: cosign: {why}")
        return "; ".join(problems)


def _judge(path: Path, installed: str, att: Attestation, check: Callable[[Path], str | None]) -> Result:
    where = str(att.statement)
    if not att.bundle.exists():
        detail = f"no bundle {att.bundle.name} beside the statement"
        if att.searched:
            detail += f", none in {', '.join(map(str, att.searched))} signs it"
        return Result(installed, Verdict.UNSIGNED, detail, where)
    problem = att.signature_problem(check)
    if problem:
        return Result(installed, Verdict.BAD_SIGNATURE, problem, where)
    if not path.is_file():
        return Result(installed, Verdict.NOT_INSTALLED, "", where)
    want, got = att.subjects[installed], file_sha256(path)
    if got != want:
        return Result(installed, Verdict.MODIFIED, f"sha256 {got}, signed {want}", where)
    return Result(installed, Verdict.VERIFIED, "", where)


def verify(
    root: Path, installed: list[str] | None, attestations: list[Attestation], check: Callable[[Path], str | None]
) -> list[Result]:
    """The verdict for each installed path (None: every subject of every statement).
    When several statements list a path, the best verdict counts."""
    if installed is None:
        installed = sorted({p for a in attestations for p in a.subjects})
    results = []
    for name in installed:
        listing = [a for a in attestations if name in a.subjects]
        path = root / name.lstrip("/")
        if not listing:
            results.append(Result(name, Verdict.NO_STATEMENT))
            continue
        judged = [_judge(path, name, a, check) for a in listing]
        results.append(min(judged, key=lambda r: (r.verdict.status, r.verdict is Verdict.NOT_INSTALLED)))
    return results


def exit_status(results: Iterable[Result]) -> int:
    return max((r.verdict.status for r in results), default=0)
