"""The changes to debusine that the project proposes (debusine/patches/), against the
debusine its test instance runs: 0.16.2~bpo13+1 as Debian ships it, in the container's
root (testkit/debusine/root.py: made by mmdebstrap from trixie and trixie-backports,
cached; the test of the instance itself, tests/test_debusine.py, uses the same root).

Each patch applies to a copy of debusine's Python package, dry run first, with nothing
but "checking file" lines (no offset, no fuzz); every file a patch touches compiles with
the root's own Python 3.13, run in the root with chroot (the host's Python is older than
debusine's syntax); and with Django set up as debusine's server sets it up, the
make_hugified_source patch's task and workflow are found by debusine's own lookups by
name, and their task data validates. The oracles are patch(1), CPython's compiler and
debusine's registries. On main there is no make_hugified_source patch: the test fails
there.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from testkit import REPO
from testkit.debusine.root import container_root

pytestmark = pytest.mark.slow

PATCHES = sorted((REPO / "debusine" / "patches").glob("*.patch"))
SITE = "usr/lib/python3/dist-packages"


def touched(patch: Path) -> list[str]:
    """The files a patch writes, relative to the tree it applies to (-p1)."""
    return re.findall(r"^\+\+\+ b/(\S+)", patch.read_text(), re.M)


def in_root(root: Path, tree: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python3.13 -B -c SCRIPT ARGS` of the root, in the root (chroot) made read-only,
    the patched tree at /mnt and an empty /tmp (mounts of a private mount namespace, gone
    with it: the cached root is left as it was), Django's settings those of debusine's
    server, and no variable of the caller's environment (pytest's put debusine's
    settings into their test mode)."""
    command = (
        'mount --bind "$2" "$2" && mount -o remount,bind,ro "$2" && mount --bind "$1" "$2/mnt" && '
        'mount -t tmpfs tmpfs "$2/tmp" && root=$2 script=$3 && shift 3 && exec chroot "$root" '
        "env -i PATH=/usr/bin:/bin LANG=C.UTF-8 DJANGO_SETTINGS_MODULE=debusine.project.settings "
        '/usr/bin/python3.13 -B -c "$script" "$@"'
    )
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", command, "sh", tree, root, script, *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def patched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The root, and a copy of its debusine package with every patch applied."""
    root = container_root()
    tree = tmp_path_factory.mktemp("site")
    shutil.copytree(root / SITE / "debusine", tree / "debusine", symlinks=True)
    assert [p.name for p in PATCHES][:2] == ["0001-singleton-lookup-by-identity.patch",
                                             "0002-make-hugified-source-workflow.patch"]  # fmt: skip
    for patch in PATCHES:
        dry = subprocess.run(
            ["patch", "--dry-run", "-p1", "-i", patch], cwd=tree, capture_output=True, text=True, check=False
        )
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert [line.split()[:2] for line in dry.stdout.splitlines()] == [["checking", "file"]] * len(touched(patch)), (
            dry.stdout
        )
        subprocess.run(["patch", "-p1", "-s", "-i", patch], cwd=tree, check=True)
    return root, tree


def test_every_patch_applies_cleanly_and_what_it_touches_compiles(patched: tuple[Path, Path]) -> None:
    root, tree = patched
    files = sorted({f for patch in PATCHES for f in touched(patch)})
    assert "debusine/server/workflows/make_hugified_source.py" in files
    script = "import sys\nfor f in sys.argv[1:]:\n    compile(open(f).read(), f, 'exec')\nprint(len(sys.argv) - 1)"
    res = in_root(root, tree, script, *(f"/mnt/{f}" for f in files))
    assert res.returncode == 0 and res.stdout == f"{len(files)}\n", res.stdout + res.stderr


REGISTERED = """
import sys
sys.path.insert(0, "/mnt")
import django
django.setup()
from debusine.artifacts.models import TaskTypes
from debusine.server.workflows import Workflow
from debusine.server.workflows.models import MakeHugifiedSourceWorkflowData
from debusine.tasks import BaseExternalTask
from debusine.tasks.models import HugifySourceData
workflow = Workflow.from_name("make_hugified_source")
task = BaseExternalTask.class_from_name(TaskTypes.WORKER, "hugifysource")
print(workflow.__module__, task.__module__)
data = MakeHugifiedSourceWorkflowData(
    source_artifacts=[12, 13], vendor="debian", codename="trixie", architectures=["amd64"],
    maintainer="A B <ab@example.org>", suite="trixie-hugify@debian:suite",
)
print(data.suffix, data.suite)
HugifySourceData(
    environment="debian/match:codename=trixie", input={"source_artifact": 12},
    maintainer="A B <ab@example.org>", build_architecture="amd64",
)
for wrong in ({"maintainer": "nobody"}, {"suffix": "-1"}):
    try:
        HugifySourceData(**{
            "environment": "debian/match:codename=trixie", "input": {"source_artifact": 12},
            "maintainer": "A B <ab@example.org>", "build_architecture": "amd64", **wrong,
        })
    except ValueError:
        print("refused", *wrong)
"""


def test_the_hugified_source_workflow_and_its_task_register(patched: tuple[Path, Path]) -> None:
    res = in_root(*patched, REGISTERED)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines() == [
        "debusine.server.workflows.make_hugified_source debusine.tasks.hugify_source",
        "+hugify1 trixie-hugify@debian:suite",
        "refused maintainer",
        "refused suffix",
    ], res.stdout + res.stderr
