"""firefox-esr's own libraries are linked by lld with .rodata before the code
(rodata-first). Their code is less than a huge-page window long, so no shift puts any
of it on a whole window without the read-only data below it: by default every mode
refuses them (no-gain). With the policy's opt-in (--exposure-limit) they are shifted,
the read-only data moving with the code and sharing its window, exactly the bytes the
report names; they still run firefox. The libraries come from Debian's archive
(apt-get download, cached); the firefox that loads them is the installed one
(tools/setup-dev-env installs it), run from a copy of its directory that holds the
rewritten libraries."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from testkit import HP
from testkit.cli import hugify, transform
from testkit.elf import elflint, newly_executable, readelf_loads
from testkit.recipes import debian_packages

INSTALLED = Path("/usr/lib/firefox-esr")
#: Loaded at start-up: sqlite for the profile, NSS for certificates, the glue libraries.
#: libxul itself is rewritten too, aligned (test_libxul_cannot_be_shifted_and_is_aligned).
SHIFTED = [
    "libmozsqlite3.so",
    "libnss3.so",
    "libnssutil3.so",
    "libsoftokn3.so",
    "libfreeblpriv3.so",
    "libssl3.so",
    "libsmime3.so",
    "liblgpllibs.so",
    "libmozgtk.so",
]
PAGE = "<html><body><h1>hugify</h1><p>rodata-first, shifted: <script>document.write(6 * 7)</script></p></body></html>\n"


@pytest.fixture(scope="module")
def archive_dir() -> Path:
    return debian_packages("firefox-esr", ["firefox-esr"]) / "usr/lib/firefox-esr"


def _firefox_copy(root: Path, replaced: dict[str, Path]) -> Path:
    """A directory that firefox takes for its own: the executable copied (the loader
    finds the libraries next to /proc/self/exe), everything else linked to the
    installed files, the `replaced` libraries in their place."""
    root.mkdir()
    for entry in INSTALLED.iterdir():
        if entry.name in replaced:
            os.link(replaced[entry.name], root / entry.name)
        elif entry.name == "firefox-esr":
            (root / entry.name).write_bytes(entry.read_bytes())
            (root / entry.name).chmod(0o755)
        else:
            (root / entry.name).symlink_to(entry)
    return root


def _screenshot(firefox: Path, work: Path, name: str) -> tuple[bytes, list[str]]:
    """The PNG that `firefox --headless --screenshot` makes of the page, and the paths
    of libmozsqlite3 and libxul that the dynamic loader initialised in any process."""
    page = work / "page.html"
    page.write_text(PAGE)
    profile, trace = work / f"profile-{name}", work / f"ld-{name}"
    profile.mkdir()
    trace.mkdir()
    env = {
        "HOME": str(work),
        "PATH": "/usr/bin:/bin",
        "LC_ALL": "C",
        "MOZ_HEADLESS": "1",
        "LD_DEBUG": "libs",
        "LD_DEBUG_OUTPUT": str(trace / "trace"),
    }
    out = work / f"{name}.png"
    cmd = [firefox / "firefox-esr", "--headless", "--no-remote", "--profile", profile, "--screenshot", out]
    res = subprocess.run(
        [*map(str, cmd), page.as_uri()], env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert res.returncode == 0 and out.is_file(), res.stdout + res.stderr
    inits = [
        line.split("calling init:")[1].strip()
        for f in trace.iterdir()
        for line in f.read_text(errors="replace").splitlines()
        if "calling init:" in line
    ]
    return out.read_bytes(), sorted({p for p in inits if "libmozsqlite3" in p or "libxul" in p})


def test_shifted_libraries_still_run_firefox(archive_dir: Path, tmp_path: Path) -> None:
    installed = (INSTALLED / "libmozsqlite3.so").read_bytes()
    assert (archive_dir / "libmozsqlite3.so").read_bytes() == installed, (
        "the installed firefox-esr is not the archive's: apt-get install firefox-esr"
    )
    libs = tmp_path / "libs"
    libs.mkdir()
    for name in SHIFTED:
        # Without the opt-in: refused in every mode, nothing written.
        for mode in ("auto", "shift"):
            res = hugify(
                "transform", "--threshold", "0", "--mode", mode, archive_dir / name, "-o", libs / name, check=False
            )
            assert res.returncode == 4 and "(no-gain)" in res.stderr and not (libs / name).exists(), (name, mode)
        report = transform(archive_dir / name, libs / name, "--mode", "shift", "--exposure-limit", "1M")
        res = report["result"]
        assert report["layout"] == "rodata-first", name
        assert res["covered_code"] == report["code_bytes"], name
        # What became executable, by readelf of both files, is what the report says.
        assert 0 < res["exposed_read_only"] < res["covered_code"], (name, res["exposed_read_only"])
        assert newly_executable(archive_dir / name, libs / name) == res["exposed_sections"], name
        (x,) = [seg for seg in readelf_loads(libs / name) if "E" in seg.flags]
        assert x.vaddr % HP == 0 and x.offset % HP == 0 and x.memsz % HP == 0, name
    assert elflint(libs / "libmozsqlite3.so") - elflint(archive_dir / "libmozsqlite3.so") == set()
    report = transform(archive_dir / "libxul.so", libs / "libxul.so")
    assert report["result"]["mode"] == "align", report["result"]
    assert newly_executable(archive_dir / "libxul.so", libs / "libxul.so") == {}

    rewritten = _firefox_copy(tmp_path / "firefox", {n: libs / n for n in [*SHIFTED, "libxul.so"]})
    expected, plain_loaded = _screenshot(INSTALLED, tmp_path, "plain")
    got, loaded = _screenshot(rewritten, tmp_path, "shifted")
    assert plain_loaded == [str(INSTALLED / n) for n in ("libmozsqlite3.so", "libxul.so")]
    assert loaded == [str(rewritten / n) for n in ("libmozsqlite3.so", "libxul.so")]
    assert got == expected


def test_libxul_cannot_be_shifted_and_is_aligned(archive_dir: Path) -> None:
    """libxul's code calls address 0 (an undefined weak function that lld resolved to
    0, the ELF header, which stays in place): the decoder names that instruction and
    refuses the shift; auto aligns it. The instruction is checked against objdump."""
    r = json.loads(hugify("inspect", "--json", archive_dir / "libxul.so").stdout)
    r = r[0] if isinstance(r, list) else r
    shift, align = r["plans"]["shift"], r["plans"]["align"]
    assert r["layout"] == "rodata-first" and align["ok"] and not shift["ok"]
    assert shift["reason"] == "ehdr-reference", shift
    m = re.match(r"`call 0h` \(([0-9a-f ]+)\) at (0x[0-9a-f]+) in \.text refers by a branch to 0x0", shift["detail"])
    assert m, shift["detail"]
    at = int(m.group(2), 16)
    dump = subprocess.run(
        ["objdump", "-d", "--start-address", hex(at), "--stop-address", hex(at + 5), str(archive_dir / "libxul.so")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert re.search(rf"{at:x}:\s+{m.group(1)}\s+call\s+0\b", dump), dump
    assert r["chosen"] == "align"
