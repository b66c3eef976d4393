"""debusine 0.16.2 (trixie-backports), deployed on this machine by testkit/debusine
(tools/debusine-deploy): a trixie system container made by mmdebstrap and booted by
systemd-nspawn, with PostgreSQL, Redis and nginx in front of the server, its scheduler and
Celery units, two external workers with sbuild's unshare backend and a signing worker, set
up by debusine's own admin commands (testkit/debusine/guest/provision.sh).

One smoke session (testkit/debusine/smoke.py) deploys it, builds Debian's `hello` source
with debusine's sbuild task on one of its workers, installs and runs the built program,
and tears the instance down; its record is cached by its inputs (the root's and the
provisioned layer's recipes, the source, the session's code), so a suite run with warm
caches reads it and a changed recipe deploys again. Every test reads that record; the
oracles are independent of the code under test: dpkg-deb reads the built .deb on the host,
the build log is sbuild's own, and what listens is what `ss` shows.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from testkit import debusine
from testkit.debusine.smoke import HELLO_OUTPUT, SOURCE, smoke_session

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def session() -> tuple[Path, dict[str, Any]]:
    d = smoke_session()
    return d, json.loads((d / "record.json").read_text())


def test_deployed_from_trixie_backports(session: tuple[Path, dict[str, Any]]) -> None:
    _, record = session
    versions = record["versions"]
    for pkg in ("debusine-server", "debusine-worker", "debusine-signing", "debusine-client", "python3-debusine-server"):
        assert versions[pkg] == debusine.DEBUSINE_VERSION, versions
    # Only debusine and what it needs newer came from backports: sbuild is trixie's.
    assert "bpo" not in versions["sbuild"], versions


def test_units_and_workers(session: tuple[Path, dict[str, Any]]) -> None:
    _, record = session
    assert set(record["units"].values()) == {"active"}, record["units"]
    workers = {w["name"]: w for w in record["workers"]}
    external = sorted(n for n, w in workers.items() if w["type"] == "external")
    signing = [w for w in workers.values() if w["type"] == "signing"]
    assert external == sorted(debusine.WORKERS), workers
    assert len(signing) == 1, workers
    for w in [workers[n] for n in external] + signing:
        assert w["enabled"] and w["connected"], w
    # The server's own Celery worker and scheduler registered too.
    assert {"celery", "scheduler"} <= {w["type"] for w in workers.values()}, workers


def test_nothing_listens_beyond_loopback(session: tuple[Path, dict[str, Any]]) -> None:
    _, record = session
    assert record["exposed"] == [], record["exposed"]
    ports = sorted({int(s.rsplit(":", 1)[1]) for s in record["listening"]})
    # nginx (http, https) and Redis, all on the instance's own loopback address;
    # PostgreSQL takes Unix sockets only.
    assert ports == [80, 443, 6379], record["listening"]


def test_hello_built_by_sbuild_on_a_worker(session: tuple[Path, dict[str, Any]]) -> None:
    d, record = session
    wr = record["work_request"]
    assert (wr["task_name"], wr["status"], wr["result"]) == ("sbuild", "completed", "success"), wr
    assert wr["worker"] in debusine.WORKERS, wr
    categories = {a["category"]: a["files"] for a in record["artifacts"]}
    assert {
        "debian:package-build-log",
        "debian:binary-package",
        "debian:upload",
        "debian:debug-symbols",
        "debusine:work-request-debug-logs",
    } <= set(categories), categories
    version = record["source"].removeprefix(f"{SOURCE}_").removesuffix(".dsc")
    assert f"{SOURCE}_{version}_amd64.changes" in categories["debian:upload"], categories
    (log,) = categories["debian:package-build-log"]
    assert "Status: successful" in (d / log).read_text(errors="replace")
    deb = d / f"{SOURCE}_{version}_amd64.deb"
    fields = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Package", "Version", "Architecture"], capture_output=True, text=True, check=True
    ).stdout
    assert fields.split() == ["Package:", SOURCE, "Version:", version, "Architecture:", "amd64"], fields
    assert (d / f"{SOURCE}-dbgsym_{version}_amd64.deb").exists()
    # Installed with dpkg into the trixie container and run there.
    assert record["installed_run"] == f"{HELLO_OUTPUT}\n"


def test_torn_down_cleanly(session: tuple[Path, dict[str, Any]]) -> None:
    _, record = session
    assert record["down"] == {"orderly": True, "mounts": [], "processes": [], "run_dir": False, "listening": []}
