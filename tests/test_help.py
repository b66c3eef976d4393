"""Help a newcomer can use: every command's --help ends with
examples and its exit statuses; a man page per command, made from the same parsers
without help2man, that groff renders without a warning; and inspect's picture of the
windows as wide as the terminal (it was about 210 columns whatever the terminal)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hugify.commands import COMMANDS
from testkit import REPO
from testkit.cli import hugify

#: The nested commands, which have their own --help.
NESTED = [("policy", "show"), ("policy", "check"), ("manifest", "record"), ("manifest", "forget")]


@pytest.mark.parametrize("args", [(), *((c,) for c in COMMANDS), *NESTED], ids=lambda a: " ".join(a) or "hugify")
def test_every_help_ends_with_examples_and_exit_statuses(args: tuple[str, ...]) -> None:
    text = hugify(*args, "--help", add_env={"COLUMNS": "100"}).stdout
    examples = text.split("\nexamples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    commands = [line.strip() for line in examples if not line.startswith("      ")]
    assert commands and all(re.search(r"(^|\| |sudo |fakeroot )hugify ", c) for c in commands), examples
    assert len(examples) == 2 * len(commands), "each example says what it does"
    assert "\nExit status: 0" in text, text
    assert max(len(line) for line in text.splitlines()) <= 100, "the examples fit the width"


def test_man_pages_for_every_command_render_without_warnings(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    make = [sys.executable, REPO / "tools/manpages"]
    subprocess.run([*make, tmp_path, REPO / "runtime/hugify-run"], env=env, check=True)
    pages = sorted(p.name for p in tmp_path.iterdir())
    assert pages == sorted(["hugify.1", "hugify-run.1", *(f"hugify-{c}.1" for c in COMMANDS)])
    for page in tmp_path.iterdir():
        res = subprocess.run(
            ["man", "--warnings", "-l", str(page)],
            capture_output=True,
            text=True,
            env={**os.environ, "MANWIDTH": "80", "LC_ALL": "C.UTF-8"},
            check=False,
        )
        assert res.returncode == 0 and res.stderr == "", (page.name, res.stderr)
        if page.name.startswith("hugify-") and page.name != "hugify-run.1":
            assert "\nEXAMPLES\n" in res.stdout and "\nEXIT STATUS\n" in res.stdout, page.name
    main = (tmp_path / "hugify.1").read_text()
    dash = "\\-"
    assert all(f".BR hugify{dash}{c.replace('-', dash)} (1)" in main for c in COMMANDS)
    again = tmp_path / "again"
    again.mkdir()
    subprocess.run([*make, again, REPO / "runtime/hugify-run"], env=env, check=True)
    assert all((again / p).read_bytes() == (tmp_path / p).read_bytes() for p in pages), "the same bytes"


def test_inspect_picture_fits_the_terminal(tmp_path: Path) -> None:
    """A PIE whose loads span 100 windows (a 200 MiB .bss): at 80 columns its picture
    elides the middle, at 320 it shows every window; never wider than the terminal."""
    src = tmp_path / "wide.c"
    src.write_text("static char big[200 << 20];\nint main(int c, char **v) { big[c] = 1; return big[c + 1]; }\n")
    prog = tmp_path / "wide"
    subprocess.run(["gcc", "-O2", "-pie", "-fPIE", "-o", prog, src], check=True)
    for columns in (80, 120, 320):
        out = hugify("inspect", "--threshold", "0", prog, add_env={"COLUMNS": str(columns)}, check=False).stdout
        picture = [line for line in out.splitlines() if line.startswith("  before  |")]
        assert picture, out
        assert max(len(line) for line in out.splitlines() if "|" in line) <= columns, (columns, out)
        assert ("windows…" in picture[0]) == (columns < 320), (columns, picture)


def test_the_rpm_maintainer_section_ships_the_manifest_and_the_statement() -> None:
    """docs/packaging-rpm.md's "For package maintainers" gives the %files lines a spec
    needs: the manifest's and the statement's (without the latter `hugify
    sign-packages` refuses the build later: statement-missing). It gave the manifest's
    only; the statement's was in docs/signing.md alone. The form is the one the rpm
    signing test builds with (testkit/signing.py)."""
    text = (REPO / "docs" / "packaging-rpm.md").read_text()
    section = text.split("\n## For package maintainers\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```\n(.*?)```", section, re.S)
    files = next(b for b in blocks if "%files" in b)
    assert files.splitlines()[0] == "%files %{?hugify_attestation}" and "%{?hugify_manifest}" in files, files
    assert "statement-missing" in section
    assert '"\\n%files %{?hugify_attestation}\\n"' in (REPO / "testkit" / "signing.py").read_text()
