"""The next userland: the rpm and debhelper integration tests, the DWARF matrix, the
Debian corpus and the repack oracle, run again inside a Debian 13 (trixie) root
(testkit/trixie.py: rpm 4.20, debhelper 13.2x, gcc 14, clang 19, binutils 2.44, elfutils
0.192, glibc 2.41).

The suite runs every test of those files there but five of test_debhelper's: the three
opt-outs compared byte for byte with a build without the add-on, the add-on enabled
through DH_EXTRA_ADDONS and a later tool undoing the layout. Each is a whole
dpkg-buildpackage run (60-90 s apiece under trixie, 6 of the 10 minutes this test took)
of the add-on's own decisions, which the suite asserts on bookworm's debhelper; what
depends on the userland's debhelper, the hugified program and library, the Multi-Arch
build and the sequence order, stays. bench/next_userland.py runs all of every file.
"""

from __future__ import annotations

import re

import pytest

from testkit.trixie import TEST_FILES, run_inside, trixie_root

#: The selection's exceptions (node id prefixes, as pytest's --deselect takes them).
HEAVY_ADD_ON_BUILDS = (
    "tests/test_debhelper.py::test_opt_out_is_byte_identical_to_a_build_without_the_add_on",
    "tests/test_debhelper.py::test_dh_extra_addons_enables_it_without_changing_the_package",
    "tests/test_debhelper.py::test_a_later_tool_that_undoes_the_layout_fails_the_build",
)


#: The versions this userland is chosen for (dpkg-query -W name and version).
VERSIONS = {
    "rpm": r"4\.20\.",
    "debhelper": r"13\.2\d",
    "gcc-14": r"14\.",
    "binutils": r"2\.44",
    "elfutils": r"0\.19\d",
    "libc6": r"2\.41",
    "dwz": r"0\.15",
    "python3": r"3\.13",
}


@pytest.mark.slow
def test_trixie_userland_passes_the_integration_tests() -> None:
    root = trixie_root()
    res = run_inside(root, "dpkg-query", "-W", "-f", "${Package} ${Version}\\n", *VERSIONS)
    assert res.returncode == 0, res.stderr
    have = dict(line.split() for line in res.stdout.splitlines())
    for name, version in VERSIONS.items():
        assert re.match(version, have[name]), (name, have[name])
    deselect = [f"--deselect={node}" for node in HEAVY_ADD_ON_BUILDS]
    res = run_inside(
        root,
        "python3",
        "-m",
        "pytest",
        "-n",
        "2",
        "-q",
        "-rfE",
        "--durations=15",
        "-p",
        "no:cacheprovider",
        *deselect,
        *TEST_FILES,
    )
    print(res.stdout[-4000:])  # the slowest inner items too: the suite's time is watched
    assert res.returncode == 0, f"{res.stdout[-30000:]}\n{res.stderr[-5000:]}"
