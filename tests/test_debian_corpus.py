"""Real Debian binaries of the running release (testkit/corpus.py): packages
fetched with apt-get download, unpacked, and run through `hugify tree` as a package
build would. Every ELF file with code over the threshold is transformed and passes
eu-elflint with nothing new, or is refused with a reason; never failed. Each
package's workload prints the same with the transformed files as with the
originals, and really loads the transformed files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testkit import corpus as cs
from testkit.elf import elflint


@pytest.fixture(scope="module")
def original() -> Path:
    return cs.corpus()


@pytest.fixture(scope="module")
def transformed(original: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("corpus") / "root"
    cs.copy_tree(original, root)
    report, _ = cs.transform_tree(root, jobs=2)
    return root, report


@pytest.fixture(scope="module")
def inputs(original: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("corpus-inputs")
    cs.prepare_inputs(original, data)
    return data


def test_every_file_is_transformed_or_refused_with_a_reason(
    original: Path, transformed: tuple[Path, dict[str, Any]]
) -> None:
    root, report = transformed
    files = report["files"]
    assert not [f for f in files if f["status"] == "failed"]
    for f in files:
        rel = f["path"].lstrip("/")
        if f["status"] == "transformed":
            assert elflint(root / rel) - elflint(original / rel) == set(), rel
        else:
            assert f["reason"] and f["detail"], f  # a reason id and a one-line message
            assert (root / rel).read_bytes() == (original / rel).read_bytes(), rel
    summary = cs.summarize(report, root)
    print("\n".join(summary.lines()))
    assert summary.transformed >= 25, summary
    assert summary.share >= 0.85, summary
    assert set(summary.refused) <= {"no-gain", "unsupported-layout", "already-aligned", "no-whole-window"}, summary


def test_every_package_has_a_workload(transformed: tuple[Path, dict[str, Any]]) -> None:
    root, report = transformed
    done = {p.lstrip("/") for f in report["files"] if f["status"] == "transformed" for p in f["paths"]}
    for name, w in cs.WORKLOADS.items():
        assert w.used_inodes(root) <= done, name  # a workload that used nothing transformed proves nothing
    assert {p for w in cs.WORKLOADS.values() for p in w.packages} == set(cs.PACKAGES)


@pytest.mark.parametrize("name", sorted(cs.WORKLOADS))
def test_workload_prints_the_same(
    name: str, original: Path, transformed: tuple[Path, dict[str, Any]], inputs: Path
) -> None:
    w = cs.WORKLOADS[name]
    root, _ = transformed
    want = cs.run_workload(w, original, inputs)
    assert want.returncode == 0, want.stderr
    assert want.stdout.strip(), "the workload printed nothing"
    got = cs.run_workload(w, root, inputs)
    assert (got.returncode, got.stdout) == (0, want.stdout), got.stderr
    assert cs.missing_files(w, root, inputs) == set()
