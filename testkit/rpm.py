"""This checkout's rpm glue as the tests give it to rpm: the macro files and the
build-root policy script, rpm's macro path with those files where a package or the
admin would put them, and macro expansion through that path."""

from __future__ import annotations

import glob
import os
import re
import subprocess
from pathlib import Path

from testkit import REPO

MACROS = REPO / "brp-scripts" / "macros.hugify"
HOST_MACROS = REPO / "brp-scripts" / "etc-rpm-macros.hugify"
BRP = REPO / "brp-scripts" / "brp-hugify"
#: Macro files and where rpm reads them: "macros.d" (a package's
#: /usr/lib/rpm/macros.d/macros.hugify) or "etc" (/etc/rpm/macros.hugify).
MacroFiles = tuple[tuple[Path, str], ...]
#: The package's macros, installed.
WITH_MACROS: MacroFiles = ((MACROS, "macros.d"),)


def macro_path(files: MacroFiles) -> str:
    """rpm's own macro path with our files where a package or the admin would put them."""
    out = subprocess.run(["rpm", "--showrc"], capture_output=True, text=True, check=True).stdout
    path = re.search(r"^Macro path: (.*)$", out, re.M)
    assert path, "rpm --showrc shows no macro path"
    entries = path.group(1).split(":")
    for f, where in files:
        anchor = {"macros.d": "/usr/lib/rpm/macros.d/macros.*", "etc": "/etc/rpm/macros.*"}[where]
        i = entries.index(anchor)
        # The directory's files one by one, without a system-wide copy of ours (make
        # install, the hugify rpm): rpm would load both, and a definition made twice
        # survives one %undefine.
        entries[i : i + 1] = [*(p for p in sorted(glob.glob(anchor)) if Path(p).name != f.name), str(f)]
    return ":".join(entries)


def rpm_eval(*args: str, files: MacroFiles = WITH_MACROS) -> list[str]:
    """Expands each --eval argument in one rpm process (in order, so definitions made
    by one expansion are seen by the next); one output line per line of expansion."""
    cmd = ["rpm", "--macros", macro_path(files), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HOME": "/nonexistent"}, check=True)
    return res.stdout.split("\n")
