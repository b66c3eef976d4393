"""The distro-wide policy: which files `hugify tree` transforms, and how.

Policies are TOML files read in layers; a later layer wins key by key:

1. built-in defaults (the values documented in the shipped ``policy/policy.toml``),
2. the vendor file ``/usr/lib/hugify/policy.toml``,
3. the administrator's ``/etc/hugify/policy.toml``,
4. ``--policy FILE``.

``include``/``exclude`` lists are replaced as a whole. ``[packages.NAME]`` tables
override the top-level keys for one package and win over the top-level keys of
every layer (the more specific setting wins; among package tables, the later
layer). The environment variable ``HUGIFY_POLICY_PATH`` (colon-separated files)
replaces layers 2 and 3, for build chroots and tests. ``HUGIFY_SIGNING_KEY``, when
set, wins over ``signing.key`` of every layer: builders inject their key there.

The schema is strict: unknown keys, wrong types and bad values are reported with
file, line and a hint, all at once, and nothing is built with a policy that has
any of them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from hugify import _core, reasons
from hugify.sizes import exact, parse_size

VENDOR_POLICY = Path("/usr/lib/hugify/policy.toml")
ADMIN_POLICY = Path("/etc/hugify/policy.toml")
ENV_PATH = "HUGIFY_POLICY_PATH"
#: A signing key reference that wins over signing.key of every layer.
SIGNING_KEY_ENV = "HUGIFY_SIGNING_KEY"
DEFAULT_SOURCE = "built-in default"

#: A setting's place in the policy: ("threshold",), ("huge_page_size", "x86_64"),
#: ("packages", "foo", "enabled"), ...
Key = tuple[str, ...]

# --- architectures -----------------------------------------------------------------


def canonical_arch(name: str) -> str | None:
    """The canonical name of an architecture (``amd64`` -> ``x86_64``), or None; the
    names live in the core's one table (core/src/arch.rs)."""
    return _core.canonical_arch(name)


def _arch_spellings() -> list[str]:
    return sorted(n for canon, aliases in _core.arch_names() for n in (canon, *aliases))


# --- problems ------------------------------------------------------------------------


class Problem(NamedTuple):
    file: str
    line: int | None
    message: str
    hint: str | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        text = f"{where}: {self.message}"
        return f"{text}\n  hint: {self.hint}" if self.hint else text


class PolicyError(Exception):
    """One or more policy files are unusable; ``problems`` says where and why."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(map(str, problems)))
        self.problems = problems


class _Bad(Exception):
    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


# --- values ------------------------------------------------------------------------


def _type_name(v: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a float", str: "a string"}
    if type(v) in names:
        return f"{names[type(v)]} ({json.dumps(v)})"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "a table"
    return f"a {type(v).__name__}"


def _closest(word: str, options: Iterable[str]) -> str | None:
    import difflib  # only needed to explain a mistake

    options = list(options)
    match = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if match:
        return match[0]
    return next((o for o in sorted(options) if word and o.startswith(word)), None)


def _check_bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise _Bad(f"expected true or false, got {_type_name(v)}", "write true or false, without quotes")
    return v


def _check_size(v: Any) -> int:
    hint = 'a number of bytes or a string with a binary unit, such as 4096, "64K" or "1M"'
    if isinstance(v, bool) or not isinstance(v, int | str):
        raise _Bad(f"expected a size, got {_type_name(v)}", hint)
    if isinstance(v, str):
        try:
            return parse_size(v)
        except ValueError as e:
            raise _Bad(str(e), hint) from None
    if v < 0:
        raise _Bad(f"a size cannot be negative ({v})", hint)
    return int(v)


def _check_huge_page(v: Any) -> int:
    n = _check_size(v)
    if n < 64 << 10 or n > 1 << 30 or n & (n - 1):
        raise _Bad(
            f"{n} bytes is not a huge-page size",
            'a power of two between "64K" and "1G"; "2M" on x86_64, and on aarch64 with 4K base pages',
        )
    return n


def _check_page_size(v: Any) -> int:
    n = _check_size(v)
    if n < 4 << 10 or n > 256 << 10 or n & (n - 1):
        raise _Bad(
            f"{n} bytes is not a page size",
            'a power of two between "4K" and "256K": the largest base page your kernels for it use; "4K" on '
            'x86_64 and i386, "64K" on aarch64 where kernel-64k (RHEL) or -64k (Ubuntu) kernels may run the files',
        )
    return n


def _choice(*options: str) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if isinstance(v, str) and v in options:
            return v
        listed = ", ".join(f'"{o}"' for o in options)
        near = _closest(v, options) if isinstance(v, str) else None
        hint = f'did you mean "{near}"? ' if near else ""
        raise _Bad(f"expected one of {listed}, got {_type_name(v)}", f"{hint}write it as a quoted string")

    return check


def _check_globs(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list):
        raise _Bad(f"expected an array of path globs, got {_type_name(v)}", 'for example ["/usr/bin/*"]')
    problems: list[_Bad] = []
    for i, g in enumerate(v):
        if not isinstance(g, str):
            problems.append(_Bad(f"element {i + 1} is {_type_name(g)}, not a string", 'for example ["/usr/bin/*"]'))
            continue
        try:
            glob_regex(g)
        except _Bad as e:
            problems.append(_Bad(f"element {i + 1} ({json.dumps(g)}): {e.message}", e.hint))
    if problems:
        raise _Bad("; ".join(p.message for p in problems), "; ".join(dict.fromkeys(p.hint or "" for p in problems)))
    return tuple(v)


#: Key references cosign understands besides file paths.
KEY_SCHEMES = ("awskms://", "gcpkms://", "azurekms://", "hashivault://", "k8s://", "pkcs11:", "env://")


def _check_programs(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise _Bad(f"expected an array of program paths, got {_type_name(v)}", 'e.g. ["/usr/sbin/postgres"]')
    for x in v:
        if not x.startswith("/") or "\n" in x:
            raise _Bad(f"{json.dumps(x)} is not an absolute path", "name the installed program by its full path")
    return tuple(v)


def _check_key_ref(v: Any) -> str:
    hint = "an absolute path to a key file, or a URI starting with " + ", ".join(KEY_SCHEMES)
    if not isinstance(v, str):
        raise _Bad(f"expected a string, got {_type_name(v)}", hint)
    if v and not v.startswith("/") and not v.startswith(KEY_SCHEMES):
        raise _Bad(f"{json.dumps(v)} is neither an absolute path nor a known key URI", hint)
    return v


def _check_key_refs(v: Any) -> str | tuple[str, ...]:
    """One public key reference, or an array of them (any one may vouch: key rotation)."""
    if not isinstance(v, list):
        return _check_key_ref(v)
    if not v or not all(isinstance(k, str) and k for k in v):
        raise _Bad("expected a non-empty array of key references", 'for example ["/usr/share/keys/old.pub", ...]')
    return tuple(_check_key_ref(k) for k in v)


# --- path globs --------------------------------------------------------------------


def _glob_component(part: str) -> str:
    out, i = [], 0
    while i < len(part):
        c = part[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = i + 1
            if j < len(part) and part[j] in "!^":
                j += 1
            if j < len(part) and part[j] == "]":
                j += 1
            end = part.find("]", j)
            if end < 0:
                raise _Bad("unclosed [ in the glob", "close the character class, or write [[] for a literal [")
            body = part[i + 1 : end]
            negate = body[:1] in ("!", "^")
            body = body[1:] if negate else body
            body = body.replace("\\", "\\\\").replace("[", "\\[")
            out.append(f"[^/{body}]" if negate else f"[{body}]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def glob_regex(pattern: str) -> str:
    """The regular expression for a path glob: ``*`` and ``?`` stay within one
    path component, ``**`` spans any number of them (zero included)."""
    if not pattern.startswith("/"):
        raise _Bad("a path glob must be absolute", f'start it with "/", for example "/{pattern}"')
    parts = pattern.split("/")[1:]
    if any(p == "" for p in parts):
        raise _Bad("a path glob has an empty component (// or a trailing /)", 'to match a tree, end with "/**"')
    rx = ""
    for p in parts:
        rx += "(?:/[^/]+)*" if p == "**" else "/" + _glob_component(p)
    return rf"\A{rx}\Z"


# --- the schema --------------------------------------------------------------------


class Field(NamedTuple):
    check: Callable[[Any], Any]
    default: Any
    doc: str
    is_size: bool = False


#: Keys allowed at the top level and in [packages.NAME].
FIELDS: dict[str, Field] = {
    "enabled": Field(_check_bool, True, "transform anything at all"),
    "threshold": Field(_check_size, 1 << 20, "minimum executable-segment size", is_size=True),
    "mode": Field(_choice("auto", "shift", "align"), "auto", "auto, shift or align"),
    "exposure_limit": Field(
        _check_size,
        0,
        "bytes per file that were not executable (read-only data) allowed to become executable; 0: none",
        is_size=True,
    ),
    "on_error": Field(_choice("warn", "fail"), "warn", "exit status when a file cannot be transformed"),
    "on_regression": Field(
        _choice("fail", "warn"),
        "fail",
        "hugify check: fail or warn when a tool after hugify undid a file's layout (not in the digest)",
    ),
    "refuse_stripped": Field(_check_bool, True, "skip files without a symbol table"),
    "ima_signatures": Field(
        _choice("refuse", "drop"), "refuse", "files signed with security.ima/evm: refuse them, or drop the signature"
    ),
    "include": Field(_check_globs, ("/**",), "installed paths to consider (globs)"),
    "exclude": Field(
        _check_globs,
        ("/boot/**", "/usr/lib/firmware/**", "/usr/lib/modules/**"),
        "installed paths never to touch (globs)",
    ),
}
HUGE_PAGE = Field(_check_huge_page, _core.DEFAULT_HUGE_PAGE, "huge-page size", is_size=True)
#: Per architecture the rewriter supports, from the core's architecture table.
DEFAULT_HUGE_PAGES = dict(_core.default_huge_pages())
PAGE_SIZE = Field(
    _check_page_size, 4096, "largest base page size the files run with (exposure is measured in it)", is_size=True
)
#: The largest page size each architecture's distribution kernels use (core's table).
DEFAULT_PAGE_SIZES = dict(_core.default_page_sizes())
#: Per-architecture tables: key -> the schema of each entry.
ARCH_TABLES = {"huge_page_size": HUGE_PAGE, "page_size": PAGE_SIZE}
SIGNING: dict[str, Field] = {
    "mode": Field(_choice("off", "optional", "required"), "off", "off, optional or required"),
    "key": Field(_check_key_ref, "", "private key file or KMS/PKCS#11 URI"),
    "public_key": Field(_check_key_refs, "", "public key file or URI, or an array of them (rotation)"),
    "tlog_upload": Field(_check_bool, False, "upload to a transparency log"),
}
#: [runtime]: what the installed runtime (hugify prefetch and the boot service, the
#: audit library) does on this host; nothing here changes what a build does (not in
#: the policy digest, not per package).
RUNTIME: dict[str, Field] = {
    "boot_budget": Field(
        _check_size,
        512 << 20,
        "bytes of code the first prefetch of a boot reads into the page cache at most",
        is_size=True,
    ),
    "anonymous": Field(
        _check_programs, (), "programs whose code is copied into anonymous huge pages where files get none"
    ),
    "shared": Field(
        _choice("auto", "off"),
        "auto",
        "auto: root keeps one copy of each file whose filesystem gives it no huge pages on a huge-page tmpfs",
    ),
    "shared_budget": Field(_check_size, 256 << 20, "bytes the shared copies may hold in memory at most", is_size=True),
}
_PACKAGE_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._+~-]*\Z")


def is_package_name(name: str) -> bool:
    """Whether a name is usable as a package name (rpm's or Debian's)."""
    return bool(_PACKAGE_NAME.match(name))


def field_for(key: Key) -> Field:
    """The schema entry of a (valid) key, package overrides included."""
    if key[0] == "packages":
        key = key[2:]
    if key[0] in ARCH_TABLES:
        return ARCH_TABLES[key[0]]
    if key[0] == "signing":
        return SIGNING[key[1]]
    if key[0] == "runtime":
        return RUNTIME[key[1]]
    return FIELDS[key[0]]


def defaults() -> dict[Key, Setting]:
    out: dict[Key, Setting] = {(k,): Setting(f.default, DEFAULT_SOURCE) for k, f in FIELDS.items()}
    out.update({("huge_page_size", a): Setting(v, DEFAULT_SOURCE) for a, v in DEFAULT_HUGE_PAGES.items()})
    out.update({("page_size", a): Setting(v, DEFAULT_SOURCE) for a, v in DEFAULT_PAGE_SIZES.items()})
    out.update({("signing", k): Setting(f.default, DEFAULT_SOURCE) for k, f in SIGNING.items()})
    out.update({("runtime", k): Setting(f.default, DEFAULT_SOURCE) for k, f in RUNTIME.items()})
    return out


# --- reading files -----------------------------------------------------------------


class Setting(NamedTuple):
    value: Any
    source: str
    line: int | None = None
    #: "packages.NAME" when the value comes from a package table.
    via: str | None = None

    def where(self) -> str:
        place = f"{self.source}:{self.line}" if self.line else self.source
        return f"{place} [{self.via}]" if self.via else place


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _read_key(s: str, i: int) -> tuple[list[str], int] | None:
    """Parses a TOML (dotted, possibly quoted) key at s[i:]; returns parts and the end."""
    parts = []
    while True:
        while i < len(s) and s[i] in " \t":
            i += 1
        if i >= len(s):
            return None
        if s[i] == '"':
            m = re.compile(r'"((?:[^"\\]|\\.)*)"').match(s, i)
            if not m:
                return None
            try:
                parts.append(json.loads(m.group(0)))
            except ValueError:
                parts.append(m.group(1))
        elif s[i] == "'":
            m = re.compile(r"'([^']*)'").match(s, i)
            if not m:
                return None
            parts.append(m.group(1))
        else:
            m = _BARE_KEY.match(s, i)
            if not m:
                return None
            parts.append(m.group(0))
        i = m.end()
        while i < len(s) and s[i] in " \t":
            i += 1
        if i < len(s) and s[i] == ".":
            i += 1
            continue
        return parts, i


def key_lines(text: str) -> dict[Key, int]:
    """Where each key is set (table headers included), by a line scan: tomllib
    reports no positions. Best effort; only used to point at problems."""
    lines: dict[Key, int] = {}
    table: Key = ()
    open_quote: str | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        s = raw.strip()
        if open_quote:
            if raw.count(open_quote) % 2 == 1:
                open_quote = None
            continue
        if not s or s.startswith("#"):
            continue
        if s.startswith("["):
            header = _read_key(s, 2 if s.startswith("[[") else 1)
            if header:
                table = tuple(header[0])
                lines.setdefault(table, n)
            continue
        kv = _read_key(s, 0)
        if kv and kv[1] < len(s) and s[kv[1]] == "=":
            lines.setdefault((*table, *kv[0]), n)
            rest = s[kv[1] + 1 :]
            for q in ('"""', "'''"):
                if rest.count(q) % 2 == 1:
                    open_quote = q
    return lines


def _line_of(lines: Mapping[Key, int], key: Key) -> int | None:
    for end in range(len(key), 0, -1):
        if key[:end] in lines:
            return lines[key[:end]]
    return None


def _dotted(key: Key) -> str:
    return ".".join(k if _BARE_KEY.fullmatch(k) else json.dumps(k) for k in key)


class _Reader:
    """Validates one parsed file into flat settings, collecting every problem."""

    def __init__(self, file: str, text: str) -> None:
        self.file = file
        self.lines = key_lines(text)
        self.out: dict[Key, Setting] = {}
        self.problems: list[Problem] = []

    def bad(self, key: Key, message: str, hint: str | None = None) -> None:
        self.problems.append(Problem(self.file, _line_of(self.lines, key), message, hint))

    def leaf(self, key: Key, value: Any, f: Field) -> None:
        try:
            self.out[key] = Setting(f.check(value), self.file, _line_of(self.lines, key))
        except _Bad as e:
            self.bad(key, f"{_dotted(key)}: {e.message}", e.hint)

    def table(self, key: Key, value: Any) -> dict[str, Any] | None:
        if isinstance(value, dict):
            return value
        self.bad(key, f"{_dotted(key)}: expected a table, got {_type_name(value)}", f"write it as [{_dotted(key)}]")
        return None

    def unknown(self, key: Key, allowed: Iterable[str]) -> None:
        allowed = sorted(allowed)
        near = _closest(key[-1], allowed)
        hint = (f'did you mean "{near}"? ' if near else "") + "known keys here: " + ", ".join(allowed)
        self.bad(key, f"unknown key {_dotted(key)}", hint)

    def settings(self, doc: Mapping[str, Any], prefix: Key) -> None:
        top = not prefix
        allowed = [*FIELDS, *ARCH_TABLES, *(["signing", "runtime", "packages"] if top else [])]
        for name, value in doc.items():
            key = (*prefix, name)
            if name in FIELDS:
                self.leaf(key, value, FIELDS[name])
            elif name in ARCH_TABLES:
                self.per_arch(key, value, ARCH_TABLES[name])
            elif name in ("signing", "runtime") and top:
                schema = SIGNING if name == "signing" else RUNTIME
                tbl = self.table(key, value)
                for k, v in (tbl or {}).items():
                    if k in schema:
                        self.leaf((*key, k), v, schema[k])
                    else:
                        self.unknown((*key, k), schema)
            elif name == "packages" and top:
                for pkg, body in (self.table(key, value) or {}).items():
                    if not is_package_name(pkg):
                        self.bad(
                            (*key, pkg),
                            f"{json.dumps(pkg)} is not a package name",
                            "letters, digits and . _ + ~ -, starting with a letter or digit",
                        )
                    elif (tbl := self.table((*key, pkg), body)) is not None:
                        self.settings(tbl, (*key, pkg))
            else:
                self.unknown(key, allowed)

    def per_arch(self, key: Key, value: Any, field: Field) -> None:
        """A table of one value per architecture ([huge_page_size], [page_size])."""
        seen: dict[str, str] = {}
        for arch, v in (self.table(key, value) or {}).items():
            canon = canonical_arch(arch)
            if canon is None:
                known = _arch_spellings()
                near = _closest(arch, known)
                self.bad(
                    (*key, arch),
                    f"unknown architecture {json.dumps(arch)} in {_dotted(key)}",
                    (f'did you mean "{near}"? ' if near else "") + "known: " + ", ".join(known),
                )
            elif canon in seen:
                self.bad((*key, arch), f"{arch} and {seen[canon]} name the same architecture", "keep one of them")
            else:
                seen[canon] = arch
                try:
                    setting = Setting(field.check(v), self.file, _line_of(self.lines, (*key, arch)))
                    self.out[(*key, canon)] = setting
                except _Bad as e:
                    self.bad((*key, arch), f"{_dotted((*key, arch))}: {e.message}", e.hint)


def read_file(path: Path) -> dict[Key, Setting]:
    """Reads and validates one policy file into flat settings; raises PolicyError."""
    file = str(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise PolicyError([Problem(file, None, f"cannot read: {reasons.io_detail(e, with_file=False)}")]) from None
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise PolicyError([Problem(file, line, "not valid UTF-8", "TOML files are UTF-8 text")]) from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = re.search(r"\s*\(at (?:line (\d+), column \d+|end of document)\)$", msg)
        where = (int(m.group(1)) if m.group(1) else text.count("\n") + 1) if m else None
        msg = msg[: m.start()] if m else msg
        hint = 'TOML syntax: key = value, strings in "quotes", [table] headers'
        raise PolicyError([Problem(file, where, f"TOML syntax error: {msg}", hint)]) from None
    reader = _Reader(file, text)
    reader.settings(doc, ())
    if reader.problems:
        raise PolicyError(reader.problems)
    return reader.out


# --- layers and the effective policy ---------------------------------------------


def system_files(*, recorded: bool = False) -> list[Path]:
    """The vendor and administrator files (present or not), in layer order. With
    `recorded` (package builds), only the vendor file, which a package installs, so
    that a rebuild from the build's record (Debian's .buildinfo, the build root's
    package list) reads the same policy: the administrator's file is in no package.
    $HUGIFY_POLICY_PATH, set, is taken as it is (a local, unrecorded choice)."""
    env = os.environ.get(ENV_PATH)
    if env is not None:
        return [Path(p) for p in env.split(":") if p]
    return [_vendor_file()] if recorded else [_vendor_file(), ADMIN_POLICY]


def unrecorded_admin_file() -> tuple[Path, str] | None:
    """The administrator's file and its sha256 when it exists but a package build
    leaves it out (system_files(recorded=True)), so that the build log can say so."""
    if os.environ.get(ENV_PATH) is not None or not ADMIN_POLICY.is_file():
        return None
    try:
        return ADMIN_POLICY, hashlib.sha256(ADMIN_POLICY.read_bytes()).hexdigest()
    except OSError:
        return None


def _vendor_file() -> Path:
    # `make install PREFIX=X` puts the package in X/lib/hugify/python/hugify and the
    # vendor policy in X/lib/hugify/policy.toml.
    pkg = Path(__file__).resolve().parent
    if pkg.parent.name == "python" and pkg.parent.parent.name == "hugify":
        return pkg.parent.parent / "policy.toml"
    return VENDOR_POLICY


class Layers(NamedTuple):
    """The files read, in order, and their settings."""

    files: list[tuple[Path, bool]]  # (path, present)
    settings: list[dict[Key, Setting]]


def load(extra: Path | None = None, files: list[Path] | None = None, *, recorded: bool = False) -> Layers:
    """Reads the system layers (absent ones are skipped; with `recorded`, only those
    packages install: system_files) and `extra` (must exist). Raises PolicyError
    listing the problems of every file."""
    layers = Layers([], [])
    problems: list[Problem] = []
    wanted = [(p, False) for p in (system_files(recorded=recorded) if files is None else files)]
    if extra is not None:
        wanted.append((extra, True))
    for path, required in wanted:
        if not required and not path.exists():
            layers.files.append((path, False))
            continue
        try:
            layers.settings.append(read_file(path))
            layers.files.append((path, True))
        except PolicyError as e:
            problems += e.problems
    if problems:
        raise PolicyError(problems)
    return layers


class Policy:
    """The effective values for one package (or none), each with its origin."""

    def __init__(self, settings: Mapping[Key, Setting], package: str | None) -> None:
        self.settings = dict(settings)
        self.package = package
        self._include = [re.compile(glob_regex(g)) for g in self.include]
        self._exclude = [re.compile(glob_regex(g)) for g in self.exclude]

    def _get(self, *key: str) -> Any:
        return self.settings[key].value

    @property
    def enabled(self) -> bool:
        return bool(self._get("enabled"))

    @property
    def threshold(self) -> int:
        return int(self._get("threshold"))

    @property
    def mode(self) -> str:
        return str(self._get("mode"))

    @property
    def exposure_limit(self) -> int:
        """Bytes per file that may become executable that were not (0: none, in any mode)."""
        return int(self._get("exposure_limit"))

    @property
    def on_error(self) -> str:
        return str(self._get("on_error"))

    @property
    def on_regression(self) -> str:
        """What `hugify check` does about a file whose layout a later tool undid."""
        return str(self._get("on_regression"))

    @property
    def refuse_stripped(self) -> bool:
        return bool(self._get("refuse_stripped"))

    @property
    def drop_signatures(self) -> bool:
        return str(self._get("ima_signatures")) == "drop"

    @property
    def include(self) -> tuple[str, ...]:
        return tuple(self._get("include"))

    @property
    def exclude(self) -> tuple[str, ...]:
        return tuple(self._get("exclude"))

    def huge_page(self, arch: str) -> int | None:
        """The huge-page size for an architecture (any of its names), or None."""
        s = self.settings.get(("huge_page_size", canonical_arch(arch) or arch))
        return int(s.value) if s else None

    def page_size(self, arch: str) -> int:
        """The largest base page size files of an architecture run with, which exposure
        is measured in; 0 (the core's default for it) where the policy has none."""
        s = self.settings.get(("page_size", canonical_arch(arch) or arch))
        return int(s.value) if s else 0

    def signing(self, name: str) -> Any:
        return self._get("signing", name)

    @property
    def boot_budget(self) -> int:
        return int(self._get("runtime", "boot_budget"))

    @property
    def anonymous_programs(self) -> tuple[str, ...]:
        """[runtime] anonymous: the programs run with anonymous copies of their code."""
        return tuple(self._get("runtime", "anonymous"))

    @property
    def shared(self) -> str:
        """[runtime] shared: "auto" (shared copies where files get no huge pages) or "off"."""
        return str(self._get("runtime", "shared"))

    @property
    def shared_budget(self) -> int:
        return int(self._get("runtime", "shared_budget"))

    def where(self, *key: str) -> str:
        return self.settings[key].where()

    def excluded_by(self, path: str) -> str | None:
        """Why an installed path is not selected, or None if it is."""
        for g, rx in zip(self.exclude, self._exclude, strict=True):
            if rx.match(path):
                return f'matches exclude glob "{g}" ({self.where("exclude")})'
        if not any(rx.match(path) for rx in self._include):
            return f"matches no include glob ({self.where('include')})"
        return None

    def as_json(self) -> dict[str, Any]:
        return settings_json(self.settings)

    def digest(self) -> str:
        """sha256 (hex) of the effective values that decide what `hugify tree` does:
        every key but signing.*, runtime.* and on_regression (which decides what `hugify
        check` says afterwards, not what is built), by dotted name, as canonical JSON
        (sorted keys, no spaces, arrays for lists, UTF-8). Where a value came from does
        not count, nor which key signs. signing/predicate-v1.md documents it for verifiers."""
        values = {
            _dotted(k): list(s.value) if isinstance(s.value, tuple) else s.value
            for k, s in self.settings.items()
            if k[0] not in ("signing", "runtime", "on_regression")
        }
        text = json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


def settings_json(settings: Mapping[Key, Setting]) -> dict[str, Any]:
    """Settings by dotted key, each with its value and origin, for --json output."""
    return {
        _dotted(k): {
            "value": list(s.value) if isinstance(s.value, tuple) else s.value,
            "source": s.source,
            "line": s.line,
            "via": s.via,
        }
        for k, s in sorted(settings.items())
    }


def package_overrides(layers: Layers) -> dict[str, dict[Key, Setting]]:
    """Every package table of every layer, merged (later layers win), by package."""
    out: dict[str, dict[Key, Setting]] = {}
    for layer in layers.settings:
        for k, s in layer.items():
            if k[0] == "packages":
                out.setdefault(k[1], {})[k[2:]] = s
    return out


def _signing_key_from_env() -> Setting | None:
    """$HUGIFY_SIGNING_KEY as a setting. Its value is never shown in a message: a
    misplaced secret (key material instead of a reference) must not reach a log."""
    value = os.environ.get(SIGNING_KEY_ENV, "")
    if not value:
        return None
    source = f"${SIGNING_KEY_ENV} (environment)"
    try:
        return Setting(_check_key_ref(value), source)
    except _Bad as e:
        raise PolicyError(
            [Problem(source, None, "neither an absolute path nor a known key URI (the value is not shown)", e.hint)]
        ) from None


def resolve(layers: Layers, package: str | None = None, *, for_build: bool = True) -> Policy:
    """The effective policy: defaults, then the top-level keys of every layer, then
    the package's tables of every layer, then $HUGIFY_SIGNING_KEY. Raises
    PolicyError for combinations that are invalid as a whole; with for_build
    false (verifying installed files), a required signing key may be absent."""
    eff = defaults()
    for layer in layers.settings:
        eff.update({k: s for k, s in layer.items() if k[0] != "packages"})
    if package is not None:
        for k, s in package_overrides(layers).get(package, {}).items():
            eff[k] = Setting(s.value, s.source, s.line, f"packages.{_dotted((package,))}")
    env_key = _signing_key_from_env()
    if env_key is not None:
        eff[("signing", "key")] = env_key
    mode = eff[("signing", "mode")]
    if for_build and mode.value == "required" and not eff[("signing", "key")].value:
        raise PolicyError(
            [
                Problem(
                    mode.source,
                    mode.line,
                    f'signing.mode is "required" but no signing.key is configured in any layer '
                    f"and ${SIGNING_KEY_ENV} is not set",
                    f'set signing.key or ${SIGNING_KEY_ENV}, or use mode = "optional"',
                )
            ]
        )
    return Policy(eff, package)


def check_file(path: Path) -> Policy:
    """Validates one file on its own (over the built-in defaults)."""
    return resolve(load(path, files=[]))


# --- showing -----------------------------------------------------------------------


def size_text(n: int) -> str:
    """A size as a policy file would write it: "2M", "64K", or plain bytes."""
    text = exact(n)
    return text if text.lstrip("-").isdigit() else f'"{text}"'


def toml_value(key: Key, v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int) and field_for(key).is_size:
        return size_text(v)
    if isinstance(v, tuple | list):
        return "[" + ", ".join(json.dumps(x) for x in v) + "]"
    return json.dumps(v)


def render(policy: Policy, layers: Layers, overrides: Mapping[str, Mapping[Key, Setting]] | None = None) -> str:
    """The effective policy as TOML, each value commented with where it came from."""
    read = [DEFAULT_SOURCE] + [f"{p}{'' if present else ' (absent)'}" for p, present in layers.files]
    lines = ["# effective hugify policy" + (f" for package {policy.package}" if policy.package else "")]
    lines.append("# layers, later wins: " + ", ".join(read))

    def emit(key: Key, s: Setting, name: str) -> None:
        text = f"{name} = {toml_value(key, s.value)}"
        lines.append(f"{text:<44} # {s.where()}")

    def section(title: str | None, items: Iterable[tuple[Key, Setting]], strip: int) -> None:
        items = list(items)
        if not items:
            return
        if title:
            lines.extend(["", f"[{title}]"])
        for k, s in items:
            emit(k, s, _dotted(k[strip:]))

    settings = policy.settings
    section(None, [((k,), settings[(k,)]) for k in FIELDS], 0)
    for table in ARCH_TABLES:
        section(table, sorted((k, s) for k, s in settings.items() if k[0] == table), 1)
    section("signing", [(("signing", k), settings[("signing", k)]) for k in SIGNING], 1)
    section("runtime", [(("runtime", k), settings[("runtime", k)]) for k in RUNTIME], 1)
    for pkg in sorted(overrides or {}):
        assert overrides is not None
        section(f"packages.{_dotted((pkg,))}", sorted(overrides[pkg].items()), 0)
    return "\n".join(lines) + "\n"
