"""Exit statuses, one table for every command (docs/exit-status.md), and messages that
name the file they are about once.

The table is read from the document itself: every reason id of the core's table exits
with the status the document gives its kind (through `hugify explain`, which says
both), and each case below — the same mistake made with each command that can meet it
— exits with the status the case says, which the document allows for that command. A
refusal is one line naming the path it is about exactly once, with no text of another
language's runtime ("(os error 2)") in it; an output path whose directory is missing is
an error and no directory is made."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest

from hugify import _core
from hugify.commands import COMMANDS
from testkit import REPO
from testkit.cli import hugify
from testkit.recipes import BY_NAME, build

DOC = REPO / "docs" / "exit-status.md"


def _rows(marker: str) -> list[list[str]]:
    """The rows of the table that follows `marker` in the document."""
    text = DOC.read_text()
    rows = []
    for line in text[text.index(marker) :].splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows[2:]  # past the header and its rule


def kind_statuses() -> dict[str, int]:
    return {kind: int(status) for status, _, kind in _rows("<!-- statuses:") if kind}


def command_statuses() -> dict[str, set[int]]:
    return {cmd.strip("`"): {int(s) for s in statuses.split(",")} for cmd, statuses in _rows("<!-- commands:")}


def test_every_reason_id_exits_with_the_status_the_table_gives_its_kind() -> None:
    table = kind_statuses()
    explained = hugify("explain").stdout
    seen = {}
    for line in explained.splitlines():
        m = re.match(r"^([a-z0-9-]+) \(([a-z]+), exit status (\d+)\): ", line)
        assert m, line
        seen[m.group(1)] = (m.group(2), int(m.group(3)))
    assert set(seen) == {rid for rid, _, _ in _core.reasons()}
    for rid, (kind, status) in seen.items():
        assert kind in table, f"{rid}: kind {kind} is not in {DOC.name}"
        assert status == table[kind], (rid, kind, status, table[kind])
    assert set(command_statuses()) == set(COMMANDS), "every command has its row"


class Case(NamedTuple):
    args: tuple[str, ...]
    status: int
    reason: str | None = None
    #: What the one line of the message must name exactly once.
    names: tuple[str, ...] = ()
    #: Where the reason is said: stderr (a refusal), or stdout (inspect's report).
    report: bool = False


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Files of each kind a command can be given: a PIE, a small non-PIE program (its
    code congruent at its fixed address, no whole 2 MiB window: Debian's python3.11 in
    small), text, a directory, a FIFO, a policy with a syntax error, a build root."""
    d = tmp_path_factory.mktemp("inputs")
    out = {"dir": d / "adir", "fifo": d / "fifo", "text": d / "notes.txt", "bad": d / "bad.toml"}
    out["dir"].mkdir()
    os.mkfifo(out["fifo"])
    out["text"].write_text("not a program\n")
    out["bad"].write_text("threshold = \n")
    out["pie"] = d / "prog"
    shutil.copy(build(BY_NAME["gcc-bfd"]) / "prog", out["pie"])
    (d / "hello.c").write_text("int main(void) { return 0; }\n")
    out["nonpie"] = d / "hello"
    subprocess.run(["gcc", "-O2", "-no-pie", "-o", out["nonpie"], d / "hello.c"], check=True)
    out["root"] = d / "root"
    (out["root"] / "usr/bin").mkdir(parents=True)
    out["missing"] = d / "absent"
    out["nodir"] = d / "nodir"
    return out


def cases(f: dict[str, Path]) -> list[Case]:
    s = {k: str(v) for k, v in f.items()}
    usage = [Case((c, "--no-such-option"), 2) for c in COMMANDS]
    policy = [
        Case(("tree", s["root"], "--policy", s["bad"]), 3, None, (s["bad"],)),
        Case(("prefetch", "--policy", s["bad"], s["pie"]), 3, None, (s["bad"],)),
        Case(("sign", s["root"], "--report", s["text"], "--policy", s["bad"]), 3, None, (s["bad"],)),
        Case(("verify", "--all", "--root", s["root"], "--policy", s["bad"]), 3, None, (s["bad"],)),
        Case(("repack", s["text"], "-o", s["dir"], "--policy", s["bad"]), 3, "bad-policy", (s["bad"],)),
        Case(("sign-packages", s["text"], "--policy", s["bad"]), 3, None, (s["bad"],)),
        Case(("try", "--policy", s["bad"], "--", "true"), 3, None, (s["bad"],)),
        Case(("policy", "show", "--policy", s["bad"]), 3, None, (s["bad"],)),
        Case(("policy", "check", s["bad"]), 3, None, (s["bad"],)),
        Case(("check", s["root"], "--policy", s["bad"]), 3, None, (s["bad"],)),
    ]
    wrong_type = [
        Case(("inspect", s["dir"]), 3, "wrong-file-type", (s["dir"],)),
        Case(("inspect", s["fifo"]), 3, "wrong-file-type", (s["fifo"],)),
        Case(("transform", s["dir"], "-o", s["nodir"]), 3, "wrong-file-type", (s["dir"],)),
        Case(("transform", "/dev/null", "-o", s["nodir"]), 3, "wrong-file-type", ("/dev/null",)),
        Case(("transform", "--in-place", s["dir"]), 3, "wrong-file-type", (s["dir"],)),
        Case(("prefetch", s["dir"]), 3, "wrong-file-type", (s["dir"],)),
        Case(("tree", s["text"]), 3, "wrong-file-type", (s["text"],)),
        Case(("sign", s["text"], "--report", s["text"]), 3, "wrong-file-type", (s["text"],)),
        Case(
            ("derive-source", s["dir"], "-o", s["dir"], "--maintainer", "A <a@example.org>"),
            3,
            "wrong-file-type",
            (s["dir"],),
        ),
        Case(
            ("derive-source", s["fifo"], "-o", s["dir"], "--maintainer", "A <a@example.org>"),
            3,
            "wrong-file-type",
            (s["fifo"],),
        ),
    ]
    missing = [
        Case(("inspect", s["missing"]), 5, "io-error", (s["missing"],)),
        Case(("transform", s["missing"], "-o", s["nodir"]), 5, "io-error", (s["missing"],)),
        Case(("transform", "--in-place", s["missing"]), 5, "io-error", (s["missing"],)),
        Case(("prefetch", s["missing"]), 5, "missing", (s["missing"],)),
        Case(("tree", s["missing"]), 5, "io-error", (s["missing"],)),
        Case(("verify", s["missing"]), 5, "io-error", (s["missing"],)),
        Case(("check", s["missing"]), 5, "io-error", (s["missing"],)),
        Case(
            ("derive-source", s["missing"], "-o", s["dir"], "--maintainer", "A <a@example.org>"),
            5,
            "io-error",
            (s["missing"],),
        ),
    ]
    output = [
        Case(("transform", s["pie"], "-o", f"{s['nodir']}/out"), 5, "io-error", (f"{s['nodir']}/out", s["pie"])),
        Case(("transform", s["pie"], "-o", s["fifo"]), 6, "not-regular", (s["fifo"], s["pie"])),
        Case(("transform", s["pie"], "-o", s["dir"]), 6, "not-regular", (s["dir"], s["pie"])),
        Case(("tree", s["root"], "--report", f"{s['nodir']}/r.json"), 5, "io-error", (f"{s['nodir']}/r.json",)),
        Case(("tree", s["root"], "--manifest", f"{s['nodir']}/m.list"), 5, "io-error", (f"{s['nodir']}/m.list",)),
    ]
    refused = [
        Case(("transform", "--threshold", "0", s["nonpie"], "-o", s["nodir"]), 4, "no-whole-window", (s["nonpie"],)),
        Case(("inspect", "--threshold", "0", s["nonpie"]), 4, "no-whole-window", report=True),
        Case(("transform", s["text"], "-o", s["nodir"]), 3, "not-elf", (s["text"],)),
        Case(("prefetch", s["nonpie"]), 3, "not-hugified", (s["nonpie"],)),
        Case(("tree", "/"), 4, "live-root"),
        Case(("repack", s["text"], "-o", s["dir"]), 3, "not-a-package", (s["text"],)),
        Case(("check", s["text"]), 3, "not-a-package", (s["text"],)),
        Case(
            ("derive-source", s["text"], "-o", s["dir"], "--maintainer", "A <a@example.org>"),
            3,
            "not-a-source",
            (s["text"],),
        ),
        Case(("explain", "no-such-reason"), 2),
        Case(("verify",), 2),
        Case(("try",), 2),
        Case(("manifest", "record"), 2),
    ]
    return usage + policy + wrong_type + missing + output + refused


def test_each_command_exits_with_the_tables_status_and_names_the_file_once(inputs: dict[str, Path]) -> None:
    documented = command_statuses()
    wrong = []
    for case in cases(inputs):
        res = hugify(*case.args, check=False)
        err = res.stderr.strip()
        at = f"hugify {' '.join(case.args)}: exit {res.returncode}, stderr {err[-400:]!r}"
        if res.returncode != case.status:
            wrong.append(f"{at}: expected {case.status}")
        if case.status not in documented[case.args[0]]:
            wrong.append(f"{at}: {case.status} is not in {DOC.name}'s row for {case.args[0]}")
        if "Traceback" in err or "os error" in err:
            wrong.append(f"{at}: leaks another runtime's text")
        if case.report:
            if "refused: " not in res.stdout or f"({case.reason})" not in res.stdout:
                wrong.append(f"{at}: its report does not say ({case.reason})")
        elif case.reason is not None:
            if len(err.splitlines()) != 1 or not err.endswith(f"({case.reason})"):
                wrong.append(f"{at}: not one line ending in ({case.reason})")
            if ".hugify-" in err:
                wrong.append(f"{at}: names a temporary file")
        for name in case.names:
            if len(re.findall(rf"(?<![\w/.-]){re.escape(name)}(?![\w/.-])", err)) != 1:
                wrong.append(f"{at}: does not name {name} exactly once")
    assert not wrong, "\n".join(wrong)
    assert not inputs["nodir"].exists(), "a directory was made for an output path"
    assert inputs["fifo"].is_fifo() and inputs["dir"].is_dir() and not any(inputs["dir"].iterdir())
