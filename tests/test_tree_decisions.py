"""Tree and policy decisions in process, in milliseconds: which files `hugify tree`
considers (ELF by content, pruned debug trees, hard links inside and outside the
tree, special files), what it decides for each under a policy (exclude and include
globs, --exclude-regex, a package's architecture, the policy's threshold and mode),
and how a policy file's values and a package's opt-out are read. The files are ELF headers written here
with the gABI's struct layout; no compiler, no transform."""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import pytest

from hugify import files, manifest, policy, tree
from hugify.rewrite import Settings
from testkit import HP

ELFCLASS64, ELFDATA2LSB, EV_CURRENT = 2, 1, 1
ET_EXEC, ET_DYN = 2, 3
EM_X86_64, EM_AARCH64 = 62, 183
EHDR64 = "<16sHHIQQQIHHHHHH"  # Elf64_Ehdr
PHDR64 = "<IIQQQQQQ"  # Elf64_Phdr
PT_LOAD, PF_X, PF_R = 1, 1, 4


def elf_header(e_type: int = ET_DYN, machine: int = EM_X86_64) -> bytes:
    """An ELF64 little-endian header with no program or section headers."""
    ident = b"\x7fELF" + bytes([ELFCLASS64, ELFDATA2LSB, EV_CURRENT]) + bytes(9)
    size = struct.calcsize(EHDR64)
    return struct.pack(EHDR64, ident, e_type, machine, EV_CURRENT, 0, 0, 0, 0, size, 56, 0, 64, 0, 0)


def elf_on_windows(code: int) -> bytes:
    """An ELF64 executable whose one R+X PT_LOAD maps its first `code` bytes at an
    address congruent to its offset modulo 2 MiB: code on whole huge-page windows as
    it is (the ELF header inside it), no section headers. Zero-filled past the
    headers."""
    ident = b"\x7fELF" + bytes([ELFCLASS64, ELFDATA2LSB, EV_CURRENT]) + bytes(9)
    ehsize, phentsize = struct.calcsize(EHDR64), struct.calcsize(PHDR64)
    vaddr = 2 * HP
    header = struct.pack(
        EHDR64, ident, ET_EXEC, EM_X86_64, EV_CURRENT, vaddr, ehsize, 0, 0, ehsize, phentsize, 1, 64, 0, 0
    )
    load = struct.pack(PHDR64, PT_LOAD, PF_R | PF_X, 0, vaddr, vaddr, code, code, HP)
    return (header + load).ljust(code, b"\0")


def write(root: Path, rel: str, data: bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def policy_of(tmp_path: Path, text: str, package: str | None = None) -> policy.Policy:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return policy.resolve(policy.load(path, files=[]), package)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    write(r, "usr/bin/prog", elf_header(ET_EXEC))
    write(r, "usr/lib/libone.so.1", elf_header())
    os.link(r / "usr/lib/libone.so.1", r / "usr/lib/libone-again.so.1")
    write(r, "usr/lib/aarch64/libarm.so", elf_header(machine=EM_AARCH64))
    write(r, "usr/lib/libscript.so", b"INPUT(-lfoo)\n")  # a linker script named .so
    write(r, "usr/lib/libbroken.so", b"\x7fELF" + bytes([ELFCLASS64]))  # the magic, then nothing
    write(r, "usr/lib/debug/usr/bin/prog.debug", elf_header(ET_EXEC))
    (r / "usr/lib/libone.so").symlink_to("libone.so.1")
    os.mkfifo(r / "usr/lib/fifo")
    return r


def test_candidates_are_elf_by_content_once_per_inode(root: Path) -> None:
    found = {c.paths[0]: c for c in tree.candidates(root)}
    assert list(found) == [
        "/usr/bin/prog",
        "/usr/lib/aarch64/libarm.so",
        "/usr/lib/fifo",
        "/usr/lib/libbroken.so",
        "/usr/lib/libone-again.so.1",
    ]
    # Both names of one inode, in walk order; the symbolic link is not a name of it.
    assert found["/usr/lib/libone-again.so.1"].paths == ["/usr/lib/libone-again.so.1", "/usr/lib/libone.so.1"]
    kinds = {p: (c.probe["arch"], c.probe["kind"]) for p, c in found.items() if c.refusal is None}
    assert kinds == {
        "/usr/bin/prog": ("x86_64", "executable"),
        "/usr/lib/aarch64/libarm.so": ("aarch64", "shared-object"),
        "/usr/lib/libbroken.so": (None, None),
        "/usr/lib/libone-again.so.1": ("x86_64", "shared-object"),
    }
    problem = found["/usr/lib/libbroken.so"].probe["problem"]
    assert problem is not None and problem["reason"] == "truncated"
    assert found["/usr/lib/fifo"].refusal is not None and found["/usr/lib/fifo"].refusal[0] == "not-regular"


def test_a_file_linked_from_outside_the_tree_is_refused(root: Path, tmp_path: Path) -> None:
    os.link(root / "usr/bin/prog", tmp_path / "elsewhere")
    prog = next(c for c in tree.candidates(root) if c.paths == ["/usr/bin/prog"])
    assert prog.refusal is not None
    assert prog.refusal == ("outside-links", "1 hard link outside the tree; replacing it would part them from it")


def decisions(root: Path, pol: policy.Policy, **options: object) -> dict[str, object]:
    opts = tree.Options(root=root, policy=pol)._replace(**options)
    out: dict[str, object] = {}
    for c in tree.candidates(root):
        d = tree.decide(c, opts)
        out[c.paths[0]] = d if isinstance(d, Settings) else (d.status, d.reason)
    return out


def test_decisions_follow_the_policy_globs_regexes_and_architecture(root: Path, tmp_path: Path) -> None:
    text = 'threshold = "64K"\nmode = "shift"\nexclude = ["/usr/lib/aarch64/**"]\n'
    pol = policy_of(tmp_path, text)
    settings = Settings(2 << 20, 64 << 10, "shift", 0, 4 << 10)  # page_size: the shipped [page_size] table
    assert decisions(root, pol) == {
        "/usr/bin/prog": settings,
        "/usr/lib/aarch64/libarm.so": ("skipped", "excluded"),
        "/usr/lib/fifo": ("skipped", "not-regular"),
        # Too damaged to name an architecture: the rewriter reports what is wrong
        # (no architecture's page size: the core's default, 0).
        "/usr/lib/libbroken.so": Settings(2 << 20, 64 << 10, "shift", 0, 0),
        "/usr/lib/libone-again.so.1": settings,
    }
    # A regex that matches the second name of an inode excludes the inode.
    found = decisions(root, pol, exclude_regexes=(re.compile(r"/libone\.so"),), arch="amd64")
    assert found["/usr/lib/libone-again.so.1"] == ("skipped", "excluded")
    assert found["/usr/bin/prog"] == settings
    found = decisions(root, policy_of(tmp_path, ""), arch="arm64")
    assert found["/usr/bin/prog"] == ("skipped", "foreign-arch")
    assert isinstance(found["/usr/lib/aarch64/libarm.so"], Settings)


def test_include_globs_select_and_the_reason_names_the_policy_file(root: Path, tmp_path: Path) -> None:
    pol = policy_of(tmp_path, 'include = ["/usr/lib/**"]\n')
    assert pol.excluded_by("/usr/lib/libone.so.1") is None
    why = pol.excluded_by("/usr/bin/prog")
    assert why is not None and why.startswith("matches no include glob") and "policy.toml" in why
    assert decisions(root, pol)["/usr/bin/prog"] == ("skipped", "excluded")
    # Shipped defaults: /boot, firmware and modules are never touched.
    default = policy_of(tmp_path, "")
    assert default.excluded_by("/usr/lib/modules/6.1.0/kernel/x.ko") is not None
    assert default.excluded_by("/usr/libexec/x") is None


def test_policy_values_and_package_opt_out(tmp_path: Path) -> None:
    text = 'threshold = "1M"\nexposure_limit = 4096\n[huge_page_size]\naarch64 = "64K"\n'
    text += "[packages.quiet]\nenabled = false\n"
    pol = policy_of(tmp_path, text)
    assert (pol.enabled, pol.threshold, pol.exposure_limit) == (True, 1 << 20, 4096)
    assert (pol.huge_page("aarch64"), pol.huge_page("x86_64")) == (64 << 10, 2 << 20)
    assert policy_of(tmp_path, text, package="quiet").enabled is False
    assert policy_of(tmp_path, text, package="loud").enabled is True


def outcome(root: Path, pol: policy.Policy, manifest_only: bool) -> tree.Outcome:
    """What tree does with the tree's only file under `pol`."""
    (c,) = tree.candidates(root)
    settings = tree.decide(c, tree.Options(root=root, policy=pol))
    assert isinstance(settings, Settings)
    with files.Directory.open(root, follow=True) as top:
        job = tree.Job(c, settings, manifest_only, refuse_stripped=None, epoch=None, root=top)
        return tree.process(job)


def test_the_threshold_decides_whether_aligned_code_goes_into_the_manifest(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write(root, "usr/bin/big", elf_on_windows(2 * HP))
    for manifest_only in (True, False):
        listed = outcome(root, policy_of(tmp_path, 'threshold = "4M"'), manifest_only)
        entry = manifest.Entry(path="/usr/bin/big", build_id="-", offset=0, size=2 * HP, huge_page=HP)
        assert (listed.status, listed.entry) == ("as-is", entry), manifest_only
        assert listed.detail == "4.0 MiB of its code on whole huge-page windows as it is"
        report = listed.as_json()
        assert (report["path"], report["paths"], report["status"]) == ("/usr/bin/big", ["/usr/bin/big"], "as-is")
        small = outcome(root, policy_of(tmp_path, 'threshold = "5M"'), manifest_only)
        assert (small.status, small.entry) == ("skipped", None), manifest_only
        if manifest_only:  # windows it has: what keeps it out is the threshold
            assert (small.reason, small.detail) == (
                "below-threshold",
                "its code (4.0 MiB) is under the threshold (5.0 MiB)",
            )
    # Rewriting is refused (no section headers): the core's reason is reported.
    assert outcome(root, policy_of(tmp_path, ""), False).reason == "no-section-headers"
    assert outcome(root, policy_of(tmp_path, 'threshold = "5M"'), False).reason == "no-section-headers"
