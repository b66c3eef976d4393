"""The policy: the shipped file, layering and the origin of every value, the strict
schema (file, line and hint for every problem, all at once), path globs, and the
`hugify policy show|check` commands."""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path

import pytest

from hugify import policy
from testkit import REPO
from testkit.cli import hugify

SHIPPED = REPO / "policy" / "policy.toml"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def problems(path: Path) -> list[policy.Problem]:
    with pytest.raises(policy.PolicyError) as e:
        policy.check_file(path)
    return e.value.problems


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "HUGIFY_POLICY_PATH": "", **extra}


# --- the shipped file ----------------------------------------------------------------


def test_shipped_policy_documents_exactly_the_built_in_defaults() -> None:
    shipped = policy.read_file(SHIPPED)
    defaults = policy.defaults()
    assert {k: s.value for k, s in shipped.items()} == {k: s.value for k, s in defaults.items()}
    assert all(s.line for s in shipped.values()), "every value is written out in the file"


def test_shipped_defaults_are_what_the_issue_asks_for() -> None:
    p = policy.check_file(SHIPPED)
    assert p.enabled and p.threshold == 1 << 20 and p.on_error == "warn" and p.refuse_stripped
    assert not p.drop_signatures, "IMA/EVM-signed files are refused unless the distro says otherwise"
    for arch in ("amd64", "x86_64", "arm64", "aarch64", "i386"):
        assert p.huge_page(arch) == 2 << 20, arch
    assert (p.signing("mode"), p.signing("key"), p.signing("public_key"), p.signing("tlog_upload")) == (
        "off",
        "",
        "",
        False,
    )
    assert p.excluded_by("/usr/bin/gdb") is None
    assert p.excluded_by("/usr/lib/modules/6.1/kernel/x.ko") is not None


# --- layering -------------------------------------------------------------------------


def test_layers_win_key_by_key_and_say_where_each_value_came_from(tmp_path: Path) -> None:
    vendor = write(tmp_path / "vendor.toml", 'threshold = "2M"\non_error = "fail"\n[huge_page_size]\narm64 = "512M"\n')
    admin = write(tmp_path / "admin.toml", '\non_error = "warn"\ninclude = ["/usr/bin/*"]\n')
    extra = write(tmp_path / "extra.toml", 'mode = "align"\n')
    layers = policy.load(extra, files=[vendor, tmp_path / "absent.toml", admin])
    p = policy.resolve(layers)
    assert (p.threshold, p.on_error, p.mode, p.include) == (2 << 20, "warn", "align", ("/usr/bin/*",))
    assert p.huge_page("aarch64") == 512 << 20 and p.huge_page("x86_64") == 2 << 20
    assert p.where("threshold") == f"{vendor}:1"
    assert p.where("on_error") == f"{admin}:2"
    assert p.where("mode") == f"{extra}:1"
    assert p.where("huge_page_size", "aarch64") == f"{vendor}:4"
    assert p.where("refuse_stripped") == policy.DEFAULT_SOURCE
    assert layers.files == [(vendor, True), (tmp_path / "absent.toml", False), (admin, True), (extra, True)]


def test_package_tables_win_over_top_level_keys_of_every_layer(tmp_path: Path) -> None:
    vendor = write(tmp_path / "v.toml", '[packages.firefox]\nenabled = false\nexclude = ["/opt/**"]\n')
    admin = write(tmp_path / "a.toml", 'enabled = true\nexclude = ["/srv/**"]\n[packages.firefox]\nthreshold = 0\n')
    layers = policy.load(None, files=[vendor, admin])
    ff = policy.resolve(layers, "firefox")
    assert (ff.enabled, ff.threshold, ff.exclude) == (False, 0, ("/opt/**",))
    assert ff.where("enabled") == f"{vendor}:2 [packages.firefox]"
    other = policy.resolve(layers, "bash")
    assert (other.enabled, other.exclude) == (True, ("/srv/**",))


def test_missing_explicit_policy_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(policy.PolicyError) as e:
        policy.load(tmp_path / "nope.toml", files=[])
    assert "cannot read" in str(e.value)


def test_environment_replaces_the_system_layers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = write(tmp_path / "a.toml", "enabled = false\n"), tmp_path / "b.toml"
    monkeypatch.setenv(policy.ENV_PATH, f"{a}:{b}")
    assert policy.system_files() == [a, b]
    monkeypatch.delenv(policy.ENV_PATH)
    assert policy.system_files()[-1] == policy.ADMIN_POLICY


# --- the strict schema ----------------------------------------------------------------


def test_every_problem_is_reported_with_file_line_and_hint(tmp_path: Path) -> None:
    f = write(
        tmp_path / "bad.toml",
        "# comment\n"
        "enabeld = true\n"  # 2
        "threshold = true\n"  # 3
        'mode = "shfit"\n'  # 4
        'include = ["usr/bin/*", "/ok/**"]\n'  # 5
        "[huge_page_size]\n"  # 6
        'x86_64 = "3M"\n'  # 7
        'sparc = "2M"\n'  # 8
        "[signing]\n"  # 9
        'key = "relative/key.pem"\n'  # 10
        "tlog = false\n"  # 11
        "[packages.foo]\n"  # 12
        "signing = {}\n"  # 13
        '[packages."bad name"]\n'  # 14
        "enabled = 1\n",
    )
    got = {(p.line, p.message.split(":")[0]): p for p in problems(f)}
    assert sorted(got) == [
        (2, "unknown key enabeld"),
        (3, "threshold"),
        (4, "mode"),
        (5, "include"),
        (7, "huge_page_size.x86_64"),
        (8, 'unknown architecture "sparc" in huge_page_size'),
        (10, "signing.key"),
        (11, "unknown key signing.tlog"),
        (13, "unknown key packages.foo.signing"),
        (14, '"bad name" is not a package name'),
    ]
    assert 'did you mean "enabled"' in (got[(2, "unknown key enabeld")].hint or "")
    assert 'did you mean "shift"' in (got[(4, "mode")].hint or "")
    assert 'did you mean "tlog_upload"' in (got[(11, "unknown key signing.tlog")].hint or "")
    assert "expected a size, got a boolean" in got[(3, "threshold")].message
    assert "power of two" in (got[(7, "huge_page_size.x86_64")].hint or "")
    assert all(p.file == str(f) and p.hint for p in got.values())
    text = str(policy.PolicyError(list(got.values())))
    assert f"{f}:3: threshold: expected a size" in text and "\n  hint: " in text


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("threshold = -1\n", 1, "cannot be negative"),
        ('threshold = "2 pages"\n', 1, "is not a size"),
        ("threshold = 1.5\n", 1, "got a float"),
        ('on_error = "ignore"\n', 1, 'expected one of "warn", "fail"'),
        ("refuse_stripped = 1\n", 1, "expected true or false"),
        ('ima_signatures = "keep"\n', 1, 'expected one of "refuse", "drop"'),
        ('exclude = "/usr/**"\n', 1, "expected an array"),
        ("include = [1]\n", 1, "not a string"),
        ('\ninclude = ["/usr/[bin"]\n', 2, "unclosed ["),
        ('include = ["/usr/bin/"]\n', 1, "empty component"),
        ('huge_page_size = "2M"\n', 1, "expected a table"),
        ('[huge_page_size]\namd64 = "2M"\nx86_64 = "2M"\n', 3, "name the same architecture"),
        ('[huge_page_size]\ni386 = "4K"\n', 2, "not a huge-page size"),
        ('[signing]\nmode = "always"\n', 2, 'expected one of "off", "optional", "required"'),
        ("[signing]\ntlog_upload = 'yes'\n", 2, "expected true or false"),
        ('[signing]\nmode = "required"\n', 2, "no signing.key is configured"),
        ('[runtime]\nanonymous = "/usr/bin/x"\n', 2, "expected an array of program paths"),
        ('[runtime]\nanonymous = ["bin/x"]\n', 2, "is not an absolute path"),
        ("[runtime]\nanonymus = []\n", 2, "unknown key runtime.anonymus"),
        ('[packages.foo.runtime]\nanonymous = ["/x"]\n', 1, "unknown key packages.foo.runtime"),
        ("packages = 3\n", 1, "expected a table"),
        ("[packages]\nfoo = 3\n", 2, "packages.foo: expected a table"),
        ("[[packages]]\nname = 'x'\n", 1, "expected a table"),
        ("x = [\n", 2, "TOML syntax error"),
        ("enabled = true\nenabled = false\n", 2, "TOML syntax error"),
    ],
)
def test_bad_values_are_rejected(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    (p,) = problems(write(tmp_path / "p.toml", text))
    assert (p.line, fragment in p.message) == (line, True), p
    assert p.hint


def test_non_utf8_is_rejected_with_its_line(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_bytes(b'enabled = true\nmode = "\xff"\n')
    (p,) = problems(f)
    assert (p.line, p.message) == (2, "not valid UTF-8")


def test_values_in_all_their_accepted_forms(tmp_path: Path) -> None:
    f = write(
        tmp_path / "p.toml",
        'threshold = 65536\n[huge_page_size]\narm64 = "64KiB"\n"i686" = "4M"\n'
        '[signing]\nmode = "required"\nkey = "pkcs11:token=distro;object=release"\n'
        'public_key = "/etc/hugify/release.pub"\ntlog_upload = true\n'
        '[packages."libstdc++6"]\nthreshold = "8M"\n[packages."python3.11"]\nmode = "align"\n',
    )
    p = policy.check_file(f)
    assert (p.threshold, p.huge_page("aarch64"), p.huge_page("i386")) == (65536, 64 << 10, 4 << 20)
    assert p.signing("key").startswith("pkcs11:") and p.signing("tlog_upload") is True
    layers = policy.load(f, files=[])
    assert policy.resolve(layers, "libstdc++6").threshold == 8 << 20
    assert policy.resolve(layers, "python3.11").mode == "align"
    for uri in ("awskms:///alias/k", "gcpkms://projects/p/locations/l/keyRings/r/cryptoKeys/k", "hashivault://k"):
        policy.check_file(write(tmp_path / "k.toml", f'[signing]\nkey = "{uri}"\n'))


# --- globs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("glob", "path", "match"),
    [
        ("/**", "/usr/bin/gdb", True),
        ("/usr/bin/*", "/usr/bin/gdb", True),
        ("/usr/bin/*", "/usr/bin/x/gdb", False),
        ("/usr/lib/debug/**", "/usr/lib/debug/usr/bin/gdb.debug", True),
        ("/usr/lib/debug/**", "/usr/lib/debugger", False),
        ("/usr/**/gdb", "/usr/gdb", True),
        ("/usr/**/gdb", "/usr/a/b/gdb", True),
        ("/usr/lib*/lib?.so", "/usr/lib64/liba.so", True),
        ("/usr/lib*/lib?.so", "/usr/lib64/libab.so", False),
        ("/usr/bin/[!g]*", "/usr/bin/gdb", False),
        ("/usr/bin/[!g]*", "/usr/bin/bash", True),
        ("/usr/bin/[a-c]ash", "/usr/bin/bash", True),
        ("/usr/bin/gdb.1", "/usr/bin/gdbx1", False),
    ],
)
def test_globs(glob: str, path: str, match: bool) -> None:
    import re

    assert bool(re.match(policy.glob_regex(glob), path)) == match


# --- the commands ----------------------------------------------------------------------


def test_policy_check_command(tmp_path: Path) -> None:
    good = write(tmp_path / "good.toml", 'threshold = "2M"\n')
    bad = write(tmp_path / "bad.toml", "threshhold = 1\n")
    res = hugify("policy", "check", good, SHIPPED, check=False)
    assert res.returncode == 0 and res.stdout == f"{good}: ok\n{SHIPPED}: ok\n"
    res = hugify("policy", "check", good, bad, check=False)
    assert res.returncode == 3
    assert f"{bad}:1: unknown key threshhold" in res.stderr and 'did you mean "threshold"' in res.stderr


def test_policy_show_prints_effective_values_and_sources(tmp_path: Path) -> None:
    admin = write(tmp_path / "admin.toml", 'on_error = "fail"\n[packages.foo]\nthreshold = "4M"\n')
    res = hugify("policy", "show", env=env(HUGIFY_POLICY_PATH=f"{SHIPPED}:{admin}"))
    lines = res.stdout.splitlines()
    assert lines[1] == f"# layers, later wins: built-in default, {SHIPPED}, {admin}"
    assert any(line.startswith('on_error = "fail"') and line.endswith(f"# {admin}:1") for line in lines)
    assert any(line.startswith('threshold = "1M"') and line.endswith(f"# {SHIPPED}:27") for line in lines)
    assert "[packages.foo]" in lines
    res = hugify("policy", "show", "--package", "foo", env=env(HUGIFY_POLICY_PATH=f"{SHIPPED}:{admin}"))
    assert any(
        line.startswith('threshold = "4M"') and line.endswith(f"# {admin}:3 [packages.foo]")
        for line in res.stdout.splitlines()
    )


def test_policy_show_output_is_a_policy_with_the_same_values(tmp_path: Path) -> None:
    admin = write(
        tmp_path / "admin.toml",
        'threshold = 12345\nexclude = ["/opt/**", "/usr/lib/x/[!a]*"]\n[huge_page_size]\narm64 = "32M"\n'
        '[signing]\nmode = "optional"\nkey = "/etc/k.pem"\n[packages."g++"]\nenabled = false\n',
    )
    shown = write(tmp_path / "shown.toml", hugify("policy", "show", "--policy", admin, env=env()).stdout)
    tomllib.loads(shown.read_text())
    layers = policy.load(admin, files=[])
    again = policy.load(shown, files=[])
    for pkg in (None, "g++"):
        a, b = policy.resolve(layers, pkg), policy.resolve(again, pkg)
        assert {k: s.value for k, s in a.settings.items()} == {k: s.value for k, s in b.settings.items()}


def test_policy_show_json(tmp_path: Path) -> None:
    res = hugify("policy", "show", "--json", "--policy", SHIPPED, env=env())
    doc = json.loads(res.stdout)
    assert doc["layers"] == [{"path": str(SHIPPED), "present": True}]
    assert doc["values"]["threshold"] == {"value": 1 << 20, "source": str(SHIPPED), "line": 27, "via": None}
    assert doc["values"]["huge_page_size.x86_64"]["value"] == 2 << 20


def test_policy_show_rejects_an_unusable_policy(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.toml", "[signing]\nmode = 1\n")
    res = hugify("policy", "show", "--policy", bad, check=False, env=env())
    assert res.returncode == 3 and f"{bad}:2: signing.mode: expected one of" in res.stderr


def test_policy_show_says_what_happens_to_signed_files(tmp_path: Path) -> None:
    out = hugify("policy", "show", env=env()).stdout
    assert re.search(r'^ima_signatures = "refuse" +# built-in default$', out, re.M), out
    drop = write(tmp_path / "drop.toml", '\nima_signatures = "drop"\n')
    out = hugify("policy", "show", "--policy", drop, env=env()).stdout
    assert re.search(rf'^ima_signatures = "drop" +# {re.escape(str(drop))}:2$', out, re.M), out
