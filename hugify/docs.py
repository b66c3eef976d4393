"""Where the documents that hugify's messages and --help name are, for this hugify.

Run from a checkout, they are its docs/ (and the predicate's definition beside the
signing glue); installed (make install, hugify's .deb and rpm), the package lies in
PREFIX/lib/hugify/python and the documents in PREFIX/share/doc/hugify, where
dh_installdocs and rpm's %doc put them for PREFIX=/usr and make install for any other
PREFIX. A message names the file a reader of this hugify can open; man pages, written
from the same texts at build time, name the packages' place (INSTALLED) whatever
checkout built them.
"""

from __future__ import annotations

from pathlib import Path

#: Where hugify's packages install the documents (uncompressed).
INSTALLED = "/usr/share/doc/hugify"
_PACKAGE = Path(__file__).resolve().parent
_CHECKOUT = _PACKAGE.parent
#: The checkout's directory of a document that is not under docs/.
_ELSEWHERE = {"predicate-v1.md": "signing"}


def in_checkout() -> bool:
    """Whether this hugify runs from a checkout of its sources."""
    return (_CHECKOUT / "docs" / "try.md").is_file()


def checkout_places() -> list[Path]:
    """The checkout's directories that hold documents."""
    return [_CHECKOUT / d for d in sorted({"docs", *_ELSEWHERE.values()})]


def doc(name: str) -> str:
    """The path of one document for this hugify, e.g. doc("try.md")."""
    if in_checkout():
        return str(_CHECKOUT / _ELSEWHERE.get(name, "docs") / name)
    # PREFIX/lib/hugify/python/hugify, as make install lays it out; anything else (a
    # copy of the package elsewhere, a wheel) is named where the packages put it.
    lib = _PACKAGE.parent
    if lib.name == "python" and lib.parent.name == "hugify" and lib.parent.parent.name == "lib":
        return str(lib.parent.parent.parent / "share" / "doc" / "hugify" / name)
    return f"{INSTALLED}/{name}"
