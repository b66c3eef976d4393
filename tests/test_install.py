"""README's install step works on a clean machine after nothing else.

The clean machine is a minbase Debian 12 root made by mmdebstrap (cached by its
package list, testkit.debian_roots), with a C compiler, make, Python and perl but no
help2man and nothing of hugify's; each test uses it through a copy-on-write overlay in
a private mount namespace, so the cached root stays clean:

- for a user: README's `make install PREFIX=~/.local`, run as a user of that root on a
  copy of the tracked sources (the Rust extension built here beforehand: the root has
  no Rust, and the build is what every other test runs; the C runtime and the man
  pages are built there), then the installed hugify runs --version, transforms a
  program of the root (which then runs), reports its status, and has its man pages;
- for the system: README's `make deb` (testkit.debian.build_hugify_deb runs exactly
  that, cached with test_packages.py) and `apt install` of the hugify and
  hugify-policy-debian .debs it makes in the root,
  then the same checks, as root.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from testkit import REPO
from testkit.debian import build_hugify_deb, copy_sources, hugify_sources
from testkit.debian_repro import in_chroot
from testkit.debian_roots import debian_root, hugify_depends

slow = pytest.mark.slow

#: PATH in the root, as a login shell of root's has it.
STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: What a fresh machine has that builds C and runs Python: no help2man, no Rust.
BASE = ("make", "gcc", "libc6-dev", "python3", "perl", "passwd")


def clean_root() -> Path:
    return debian_root("install-root", "--variant=minbase", f"--include={','.join(BASE)}")


def in_root(lower: Path, work: Path, script: str, user: bool = False) -> subprocess.CompletedProcess[str]:
    """Runs `script` with sh in an overlay of `lower` (its changes under `work`), with
    /proc and /dev, in a private mount namespace; as the root's user "u" if `user`."""
    upper, wd, merged = work / "upper", work / "wd", work / "merged"
    for d in (upper, wd, merged):
        d.mkdir(parents=True, exist_ok=True)
    as_user = ["runuser", "-u", "u", "--"] if user else []
    overlay = f'mount -t overlay overlay -o lowerdir={lower},upperdir={upper},workdir={wd} "$1"'
    return subprocess.run(
        in_chroot(
            merged,
            *("env", "-i", f"PATH={STD_PATH}", "HOME=/root", "LC_ALL=C.UTF-8", *as_user, "sh", "-ec", script),
            prepare=overlay,
        ),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


#: What the installed hugify must do, whoever installed it: the program transformed is
#: the root's own `make` (a 230 KiB PIE: --threshold 0).
CHECKS = r"""
hugify --version
hugify transform --threshold 0 /usr/bin/make -o "$HOME/make.huge"
"$HOME/make.huge" --version | head -n 1
hugify status --manifest-dir /nonexistent | head -n 1
hugify inspect --help | grep -c '^examples:'
{ hugify status --manifest-dir /nonexistent
  for c in $(hugify --help | sed -n 's/^    \([a-z-]*\).*/\1/p'); do hugify "$c" --help; done
} | grep -o '[^ ()"]*\.md' | sort -u | while read -r d; do
  if test -f "$d"; then echo "document there: $d"; else echo "document missing: $d"; fi
done
"""


#: Every document a --help or status names, by the path it gives, is there.
def documents_named(out: str) -> tuple[set[str], set[str]]:
    there = set(re.findall(r"^document there: (.*)$", out, re.M))
    return there, set(re.findall(r"^document missing: (.*)$", out, re.M))


@slow
def test_make_install_for_a_user_on_a_clean_root(tmp_path: Path) -> None:
    root = clean_root()
    assert not (root / "usr/bin/help2man").exists() and not (root / "usr/bin/cargo").exists()
    # The tracked sources, with the extension built here (newer than its sources, as
    # make sees it: nothing to rebuild) and no runtime binaries (built in the root).
    src = tmp_path / "upper" / "home/u/src"
    copy_sources(hugify_sources(), src)
    shutil.copy(REPO / "hugify" / "_core.abi3.so", src / "hugify" / "_core.abi3.so")  # newer than its sources
    setup = in_root(root, tmp_path, "useradd -m -u 4242 u && chown -R u: /home/u")
    assert setup.returncode == 0, setup.stderr
    script = f"""
export HOME=/home/u
cd ~/src
make install PREFIX=$HOME/.local
export PATH="$HOME/.local/bin:$PATH" PERL5LIB="$HOME/.local/share/perl5"
{CHECKS}
ls ~/.local/share/man/man1
perl -MDebian::Debhelper::Sequence::hugify -e 1 2>/dev/null || echo "no debhelper here: the add-on is only installed"
"""
    res = in_root(root, tmp_path, script, user=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout
    assert "installed hugify" in out and "README.md (Install)" in out, out[-2000:]
    assert "hugify 0.1.0" in out or "\nhugify " in out
    assert "make.huge: transformed" in out and "GNU Make" in out, out[-2000:]
    assert "what hugified code gets on this machine" in out
    there, missing = documents_named(out)
    assert missing == set() and "/home/u/.local/share/doc/hugify/try.md" in there, (there, missing)
    for page in ("hugify.1", "hugify-transform.1", "hugify-try.1", "hugify-run.1", "dh_hugify.1"):
        assert f"\n{page}\n" in out, out[-2000:]
    assert (tmp_path / "upper/home/u/.local/share/perl5/Debian/Debhelper/Sequence/hugify.pm").is_file()


@slow
def test_apt_install_of_the_deb_on_a_clean_root(tmp_path: Path) -> None:
    root = clean_root()
    built = build_hugify_deb().ok()
    deb = built.deb("hugify")
    installed = (root / "var/lib/dpkg/status").read_text()
    assert all(f"\nPackage: {p}\n" in f"\n{installed}" for p in hugify_depends(deb)), "the root has its Depends"
    (tmp_path / "upper/tmp").mkdir(parents=True)
    # README's line: hugify and the policy package it depends on, both built by make deb
    debs = [deb, built.deb("hugify-policy-debian")]
    for d in debs:
        shutil.copy(d, tmp_path / "upper/tmp" / d.name)
    script = f"""
apt-get install -y -q {" ".join(f"/tmp/{d.name}" for d in debs)} >/tmp/apt.log 2>&1 || {{ cat /tmp/apt.log; exit 1; }}
{CHECKS}
ls /usr/share/man/man1 | grep -c '^hugify'
test -f /usr/share/doc/hugify/exit-status.md && test -f /usr/share/doc/hugify/security.md && echo docs-ok
"""
    res = in_root(root, tmp_path, script)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "make.huge: transformed" in res.stdout and "GNU Make" in res.stdout, res.stdout
    assert "what hugified code gets on this machine" in res.stdout and "docs-ok" in res.stdout
    there, missing = documents_named(res.stdout)
    assert missing == set() and "/usr/share/doc/hugify/try.md" in there, (there, missing)
