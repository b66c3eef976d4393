"""The smoke session of the deployed instance (tests/test_debusine.py): deploy, check the
deployment, build one small Debian source with debusine's sbuild task on a worker, check
what it produced, install and run the built program inside the container, tear down,
check nothing is left on the host.

A session's record (record.json, the build log, the built .debs) is cached keyed by its
inputs: the root's and the provisioned layer's keys, the source package, the code of
testkit/debusine. A
session that did not finish (an exception, a timeout) is not cached: its record is kept
beside the cache for reading (smoke-failed/) and the next run starts again.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
import traceback
from pathlib import Path
from typing import Any

from testkit import debusine
from testkit.cache import build_dir, building, cache_root, locked
from testkit.debian_roots import source_package
from testkit.debusine import client, deploy
from testkit.debusine.root import container_root

#: A small real Debian source whose program prints a known line (bookworm's: the archive
#: this machine reaches serves all of its files).
SOURCE = "hello"
HELLO_OUTPUT = "Hello, world!"
BUILD_TIMEOUT = 2400


def smoke_key(dsc: Path) -> str:
    """The layers' keys, the source, and the code that deploys, drives and checks the
    instance (every module of testkit/debusine)."""
    root = container_root()
    h = hashlib.sha256()
    for part in (root.parent.name, deploy.provisioned_key(root), dsc.name):
        h.update(part.encode() + b"\0")
    for module in sorted(Path(__file__).parent.glob("*.py")):
        h.update(module.name.encode() + b"\0" + module.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def smoke_session() -> Path:
    """The cached session directory (record.json and the files it kept)."""
    dsc = source_package(SOURCE)
    final = build_dir("debusine", "smoke", smoke_key(dsc))
    if (final / "record.json").exists():
        return final
    with locked(cache_root() / "debusine" / "smoke.lock"):
        if (final / "record.json").exists():
            return final
        with building(
            final, finished=lambda work: bool(json.loads((work / "record.json").read_text()).get("completed"))
        ) as work:
            record = run(dsc, work)
            (work / "record.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
        if final.is_dir():
            return final
        failed = final.parent / "smoke-failed"
        shutil.rmtree(failed, ignore_errors=True)
        work.rename(failed)
        raise AssertionError(f"the smoke session did not finish:\n{record.get('error', '')[-6000:]}")


def run(dsc: Path, out: Path) -> dict[str, Any]:
    record: dict[str, Any] = {"source": dsc.name}
    instance = None
    try:
        start = time.monotonic()
        instance = deploy.up(log=False)
        record["deploy"] = instance.timings
        record["facts"] = instance.facts
        record["versions"] = dict(
            line.split()
            for line in instance.sh("dpkg-query -W 'debusine-*' 'python3-debusine*' sbuild mmdebstrap").splitlines()
        )
        record["units"] = deploy.status()["units"]
        record["workers"] = instance.admin_yaml("worker", "list")
        record["exposed"] = deploy.exposed(instance)
        record["listening"] = [s["local"] for s in deploy.listening() if debusine.ADDRESS in s["local"]]

        source = client.import_source(instance, dsc)
        wr_id = client.sbuild_work_request(instance, source)
        built_at = time.monotonic()
        wr = client.wait(instance, wr_id, BUILD_TIMEOUT)
        record["build_seconds"] = time.monotonic() - built_at
        names = {w["id"]: w["worker"] for w in instance.admin_yaml("list_work_requests")}
        record["work_request"] = {k: wr[k] for k in ("id", "status", "result", "duration", "task_name", "url")}
        record["work_request"]["worker"] = names.get(wr_id)
        result = client.built(instance, wr)
        record["artifacts"] = [
            {
                "id": a["id"],
                "category": a["category"],
                "files": sorted(a["files"]),
                "url": client.web(f"/debusine/{debusine.WORKSPACE}/artifact/{a['id']}/"),
            }
            for a in result.artifacts
        ]
        downloaded = {}
        for a in result.of("debian:package-build-log") + result.of("debian:binary-package"):
            for name in a["files"]:
                downloaded[name] = client.download(instance, a["id"], name)
                shutil.copy(downloaded[name], out / name)
        (deb,) = [name for name in downloaded if name.startswith(f"{SOURCE}_") and name.endswith(".deb")]
        record["installed_run"] = instance.sh(
            f"dpkg -i {instance.inside(downloaded[deb])} > /dev/null && {SOURCE} && dpkg -r {SOURCE} > /dev/null"
        )
        record["session_seconds"] = time.monotonic() - start
    except Exception:
        record["error"] = traceback.format_exc()
    finally:
        if instance is not None:
            stop = time.monotonic()
            record["down"] = deploy.down()
            record["down_seconds"] = time.monotonic() - stop
    record["completed"] = "error" not in record
    return record
