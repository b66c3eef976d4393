"""Words that must stay true: the tests a comment names exist, test comments point at
nothing outside the repository, the documents name none of the project's issues and no
path of one machine, every document and section the tree points at exists, the manifest
rule as `hugify manifest --help` and docs/manifest.md state it is the core's
(core/src/windows.rs), fixed address included, and one module reads $SOURCE_DATE_EPOCH."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from testkit import REPO
from testkit.cli import hugify


def tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=REPO, capture_output=True, text=True, check=True)
    return [REPO / line for line in out.stdout.splitlines()]


def test_every_test_file_named_exists() -> None:
    named = {
        (path.relative_to(REPO), m)
        for path in tracked("*.py", "*.c", "*.h", "*.rs", "*.md", "Makefile")
        if path.is_file()
        for m in re.findall(r"tests/(?:programs/)?[\w-]+\.(?:py|c)\b", path.read_text(errors="replace"))
    }
    assert named, "no file names a test"
    assert [(where, m) for where, m in sorted(named) if not (REPO / m).is_file()] == []


def test_test_comments_point_at_nothing_outside() -> None:
    outside = [
        f"{p.name}:{n}: {line.strip()}"
        for p in tracked("tests/*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\bissue \d+, item \d+", line)
    ]
    assert outside == []


#: The documents a reader gets: installed with the package (docs/), or read in the tree.
def documents() -> list[Path]:
    return [p for p in tracked("*.md") if p.is_file()]


def test_documents_name_no_issue_of_the_project() -> None:
    """The project's issue numbers mean nothing to a reader of the installed documents:
    a document says what changed and why, or nothing of the history. (An upstream
    project's issue, "rpm issue #2207", is a reference a reader can follow.)"""
    named = [
        f"{p.relative_to(REPO)}:{n}: {m.group(0)}"
        for p in documents()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        for m in re.finditer(r"\bissues? \d+", line, re.I)
    ]
    assert named == []


#: Paths of one machine: the checkout, pytest's temporary directories, root's home, an
#: entry of the test cache (keyed by what built it).
MACHINE_PATH = re.compile(r"/work/|/tmp/pytest-|/root/|/var/cache/hugify-tests/[\w./-]*-[0-9a-f]{16}\b")


def test_installed_documents_hold_no_path_of_one_machine() -> None:
    """docs/*.md and README.md are installed (/usr/share/doc/hugify): what was measured
    on one machine, with its paths, belongs in bench/README.md with its command."""
    found = [
        f"{p.relative_to(REPO)}:{n}: {line.strip()}"
        for p in [*tracked("docs/*.md"), REPO / "README.md"]
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if MACHINE_PATH.search(line)
    ]
    assert found == []


def places(doc: Path) -> list[str]:
    """What a pointer may name in a document: its headings and its bold lead-ins
    ("**Each run checked.**"), without markup."""
    text = doc.read_text()
    named = re.findall(r"^#+ (.*)$", text, re.M) + re.findall(r"\*\*([^*\n]+?)\*\*", text)
    return [plain(n) for n in named]


def plain(s: str) -> str:
    return " ".join(s.replace("`", "").split()).rstrip(".:")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


#: A document under docs/ named by its path, however it is quoted.
DOC_FILE = re.compile(r"(?<![\w./-])docs/[\w.-]+\.md\b")
#: A document's name, then a section in double quotes: after a comma, a space, "'s" or
#: an opening parenthesis.
DOC_SECTION = re.compile(r"(?<![\w./\"-])((?:[\w-]+/)*[\w.-]+\.md)(?:'s|,)? \(?\"([A-Za-z`][^\"(){}\[\]=;]{1,100}?)\"")
#: A Markdown link to a heading of a document: its path, "#", the heading's anchor.
DOC_ANCHOR = re.compile(r"\(((?:[\w.-]+/)*[\w.-]+\.md)#([\w-]+)\)")


def test_every_document_and_section_pointed_at_exists() -> None:
    """Every document under docs/ the tree names exists, and every section a pointer names
    (docs/runtime.md, "Shared copies"; a link's #anchor) is a heading or a bold
    lead-in of that document: a document split or a heading renamed leaves no pointer
    behind in the code, the units, the help texts or the other documents."""

    def resolve(name: str, where: Path) -> Path | None:
        return next((b / name for b in (REPO, REPO / "docs", where.parent) if (b / name).is_file()), None)

    wrong = []
    for path in tracked():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue
        where = path.relative_to(REPO)
        missing = [m.group(0) for m in DOC_FILE.finditer(text) if not (REPO / m.group(0)).is_file()]
        wrong += [f"{where}: {name}: no such file" for name in missing]
        # A pointer continued on the next line of a comment or a docstring reads as one line.
        flat = re.sub(r"[ \t]*\n[ \t]*(?:#+|\*|//|\")?[ \t]*", " ", text)
        for m in DOC_SECTION.finditer(flat):
            doc = resolve(m.group(1), path)
            if doc is None:
                wrong.append(f"{where}: {m.group(1)}: no such file")
            elif not any(p.startswith(plain(m.group(2))) for p in places(doc)):
                wrong.append(f'{where}: {m.group(1)}, "{m.group(2)}": no such section')
        for m in DOC_ANCHOR.finditer(text):
            doc = resolve(m.group(1), path)
            if doc is None or m.group(2) not in {slug(h) for h in re.findall(r"^#+ (.*)$", doc.read_text(), re.M)}:
                wrong.append(f"{where}: {m.group(1)}#{m.group(2)}: no such heading")
    assert wrong == []


def test_manifest_rule_states_the_fixed_address_rule() -> None:
    res = hugify("manifest", "--help")
    help_text = " ".join(res.stdout.split())
    assert "ET_EXEC at its fixed address" in help_text and "p_align of at least" in help_text
    doc = " ".join((REPO / "docs/manifest.md").read_text().split())
    record_rule = doc.split("A file is recorded when")[1].split(".")[0]
    assert "`ET_EXEC` at its fixed link-time address" in record_rule


def test_one_place_reads_source_date_epoch() -> None:
    """hugify/files.py is the one reader of $SOURCE_DATE_EPOCH (others only pass it on
    to the tools they run)."""
    read = re.compile(r"""environ(?:\.get\(|\[)\s*["']SOURCE_DATE_EPOCH""")
    assert [p.name for p in tracked("hugify/*.py") if read.search(p.read_text())] == ["files.py"]
