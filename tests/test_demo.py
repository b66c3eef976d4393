"""`make demo` (tools/demo) leaves nothing behind: it left 24 MB in
/tmp and wrote the runtime's records to /run/hugify without a word."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from testkit import REPO


@pytest.mark.slow
def test_make_demo_leaves_nothing_behind(tmp_path: Path) -> None:
    """tools/demo (make demo's run) on a smaller example: its scratch directory (in
    TMPDIR) is gone afterwards and it says so; the runtime's records went there, not to
    /run/hugify (conftest compares the host's runtime directory before and after the
    session)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "HUGIFY_DEMO_FUNCS": "1400"}
    env.pop("HUGIFY_RUNTIME_DIR", None)
    res = subprocess.run([REPO / "tools" / "demo"], capture_output=True, text=True, env=env, timeout=900, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "identical output" in res.stdout and "== removed " in res.stdout, res.stdout[-2000:]
    assert list(scratch.iterdir()) == []
