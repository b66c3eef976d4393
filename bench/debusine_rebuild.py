"""A rebuild of real Debian sources on the deployed debusine instance (issue 44, items 3
and 4; tools/debusine-deploy, testkit/debusine): uploads each source to the workspace,
starts one publish-to-SUITE workflow per source (debusine's debian_pipeline: sbuild on the
external workers, then published into the instance's suite, whose indexes the signing
worker signs), waits, and reports per package: result, build time, worker, work request and
workflow ids, and debusine's links to the work request and the build log.

Resumable: each upload and workflow is recorded in the instance's run directory
(bench-state.json) as soon as debusine returns its id, so an interrupted run started again
adopts them instead of starting them twice; a workflow debusine started for a recorded
upload whose id the run did not live to record is found and adopted too (at worst an
upload is made twice, which publishes nothing). A source that fails to build is reported
with its log link and does not stop the others. A worker killed mid-build
(--kill-worker-after S, SIGKILL to the unit running an sbuild) is restarted by systemd;
debusine gives the running work request back to it (or retries it), and the check at the
end counts each source once in the suite: nothing is published twice.

usage: tools/bench debusine_rebuild [--set small|full] [--packages P,...] [--dsc FILE]...
        [--broken NAME] [--kill-worker-after S] [--timeout S] [--json OUT] [--up] [--down]

Not hugified yet: the derived sources (`hugify derive-source`, item 2) come with the
reproducibility issue's recorded switch; this is the batch and its bookkeeping.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit import debusine
from testkit.bench import parser
from testkit.cache import cache_root, locked
from testkit.debian_roots import source_package
from testkit.debusine import client, deploy
from testkit.debusine.deploy import Instance

#: The three large sources: each ships an ELF file with well over the 1 MiB of code
#: hugify's default policy transforms, and each builds on two cores in tens of minutes,
#: not hours (postgresql-17, mariadb and nodejs are not all in the archive this machine
#: reaches; llvm-toolchain, nodejs and mariadb take hours on two cores).
LARGE = {
    "git": "git 2.47: /usr/lib/git-core/git, ~3.5 MiB of code; C, make",
    "ruby3.3": "ruby 3.3: libruby-3.3.so, ~3.5 MiB of code; C, autotools",
    "icu": "ICU 76: libicuuc/libicui18n, 2-3 MiB of code each; C++, autotools",
}
#: Small and medium sources of different build systems and languages, minutes each.
SMALL = {
    "dash": "dash: C, autotools, about a minute",
    "lz4": "lz4: C library and tool, make",
    "libzstd": "zstd: C library and tool, make/cmake",
    "sqlite3": "sqlite3: libsqlite3 ~1.3 MiB of code, autotools",
    "gawk": "gawk: C, autotools",
    "lua5.4": "Lua 5.4: C, make",
    "tmux": "tmux: C, autotools",
    "less": "less: C, autotools",
    "memcached": "memcached: C, autotools, a server",
}
SETS = {"small": ["dash", "lz4"], "full": [*SMALL, *LARGE]}
SUITE = "trixie"
#: A workflow whose build failed ends aborted, one that ran through completed.
FINISHED = ("completed", "aborted")
#: The suffix of the name a copy made to fail (--broken) is reported under.
BROKEN = "+broken"
WORKFLOW = f"publish-to-{debusine.REPO_SUITE}"


def broken_copy(name: str) -> Path:
    """A copy of the archive's trixie source of `name` whose build fails at once
    (debian/rules stops make with an error), version +hugifybroken1: the failing source
    of --broken. Made with dpkg-source and dch, kept in the test cache."""
    dsc = source_package(name, suite=SUITE)
    group = cache_root() / "debusine" / "broken"
    out = group / dsc.stem
    with locked(group / "broken.lock"):
        made = sorted(out.glob("*.dsc"))
        if made:
            return made[0]
        work = out.with_name(out.name + ".tmp")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        tree = work / "tree"
        subprocess.run(["dpkg-source", "-x", str(dsc), str(tree)], check=True, capture_output=True)
        rules = tree / "debian" / "rules"
        lines = rules.read_text().splitlines(keepends=True)
        lines.insert(1, f"$(error hugify bench: this copy of {name} is made to fail)\n")
        rules.write_text("".join(lines))
        env = {**os.environ, "DEBEMAIL": "bench@hugify.invalid", "DEBFULLNAME": "hugify bench"}
        subprocess.run(
            ["dch", "--local", "+hugifybroken", "--distribution", SUITE, "made to fail (bench/debusine_rebuild.py)"],
            cwd=tree,
            env=env,
            check=True,
            capture_output=True,
        )
        subprocess.run(["dpkg-source", "-b", "tree"], cwd=work, check=True, capture_output=True)
        shutil.rmtree(tree)
        work.rename(out)
        return sorted(out.glob("*.dsc"))[0]


def state_path() -> Path:
    return deploy.run_dir() / "bench-state.json"


def load_state() -> dict[str, Any]:
    p = state_path()
    return json.loads(p.read_text()) if p.exists() else {"packages": {}}


def save_state(state: dict[str, Any]) -> None:
    p = state_path()
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1) + "\n")
    tmp.rename(p)


def work_requests(instance: Instance) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = client.client(
        instance, "work-request", "list", "--yaml", "--workspace", debusine.WORKSPACE, "--limit", "100000"
    )
    return out


def worker_names(instance: Instance) -> dict[int, str | None]:
    return {w["id"]: w["worker"] for w in instance.admin_yaml("list_work_requests")}


def is_sbuild_task(wr: dict[str, Any]) -> bool:
    """The sbuild task a worker runs (the sbuild workflow that creates it has the same
    task name)."""
    return bool(wr["task_name"] == "sbuild" and wr["task_type"] == "Worker")


def existing_workflow(wrs: list[dict[str, Any]], artifact: int) -> int | None:
    """A workflow of this template already started for the artifact (by a run that died
    before it recorded the id)."""
    for wr in wrs:
        if (
            wr["task_name"] == "debian_pipeline"
            and wr["parent"] is None
            and str(wr["task_data"].get("source_artifact")) == str(artifact)
        ):
            return int(wr["id"])
    return None


def start(instance: Instance, sources: dict[str, Path | None], state: dict[str, Any]) -> None:
    """Uploads and starts what the state does not have yet, recording each step first.
    sources: name -> a local .dsc, or None for the archive's trixie source of that name."""
    pkgs = state["packages"]
    wrs = work_requests(instance)
    for name, local in sources.items():
        entry = pkgs.setdefault(name, {})
        if "dsc" not in entry:
            entry["dsc"] = str(local or source_package(name, suite=SUITE))
            save_state(state)
        if "artifact" not in entry:
            entry["artifact"] = client.import_source(instance, Path(entry["dsc"]))
            save_state(state)
        if "workflow" not in entry:
            adopted = existing_workflow(wrs, entry["artifact"])
            entry["workflow"] = adopted or client.start_workflow(
                instance, WORKFLOW, f"source_artifact: {entry['artifact']}\n"
            )
            save_state(state)
        print(f"{name}: artifact {entry['artifact']}, workflow {entry['workflow']}", flush=True)


@dataclass
class Killer:
    """Kills the worker running an sbuild once, after `after` seconds (fault injection)."""

    after: float | None
    t0: float
    done: dict[str, Any] | None = None

    def poll(self, instance: Instance, wrs: list[dict[str, Any]], names: dict[int, str | None]) -> None:
        if self.after is None or self.done is not None or time.monotonic() - self.t0 < self.after:
            return
        running = [w for w in wrs if is_sbuild_task(w) and w["status"] == "running"]
        if not running:
            return
        victim = min(running, key=lambda w: w["id"])  # the one furthest into its build
        worker = names.get(victim["id"])
        if worker not in debusine.WORKERS:
            return
        unit = deploy.WORKER_UNITS[debusine.WORKERS.index(worker)]
        instance.container.run_inside(["systemctl", "kill", "--signal=KILL", unit])
        self.done = {"work_request": victim["id"], "worker": worker, "unit": unit, "at": time.time()}
        print(f"killed {unit} ({worker}) while it ran work request {victim['id']}", flush=True)


def wait(instance: Instance, state: dict[str, Any], timeout: float, killer: Killer) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    roots = {e["workflow"] for e in state["packages"].values()}
    while True:
        wrs = work_requests(instance)
        names = worker_names(instance)
        killer.poll(instance, wrs, names)
        pending = [w for w in wrs if w["id"] in roots and w["status"] not in FINISHED]
        if not pending or time.monotonic() > deadline:
            return wrs
        time.sleep(15)


def build_log(instance: Instance, wr: dict[str, Any]) -> str | None:
    for a in wr["artifacts"]:
        art = client.artifact(instance, int(a["id"]) if isinstance(a, dict) else int(a))
        if art["category"] == "debian:package-build-log":
            return client.web(f"/debusine/{debusine.WORKSPACE}/artifact/{art['id']}/")
    return None


def report(instance: Instance, state: dict[str, Any], wrs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = worker_names(instance)
    published = client.client(
        instance,
        "archive",
        "package",
        "list",
        "--yaml",
        "--workspace",
        debusine.WORKSPACE,
        "--suite",
        debusine.REPO_SUITE,
    )
    # Source items are named NAME_VERSION, as the .dsc is.
    sources_in_suite: dict[str, int] = {}
    for item in published:
        if item["category"] == "debian:source-package":
            sources_in_suite[item["name"]] = sources_in_suite.get(item["name"], 0) + 1
    rows = []
    for name, entry in state["packages"].items():
        root = next((w for w in wrs if w["id"] == entry["workflow"]), None)
        builds = sorted(
            (w for w in wrs if w["workflow_root"] == entry["workflow"] and is_sbuild_task(w)),
            key=lambda w: w["id"],
        )
        last = builds[-1] if builds else None
        source = Path(entry["dsc"]).name.removesuffix(".dsc")
        rows.append(
            {
                "package": name,
                "source": source,
                "workflow": entry["workflow"],
                "workflow_status": root["status"] if root else None,
                "workflow_result": root["result"] if root else None,
                "sbuild_work_requests": [w["id"] for w in builds],
                "sbuild_result": last["result"] if last else None,
                "build_seconds": last["duration"] if last else None,
                "worker": names.get(last["id"]) if last else None,
                "work_request_link": client.web(last["url"]) if last else None,
                "build_log_link": build_log(instance, last) if last and last["status"] == "completed" else None,
                "published_sources": sources_in_suite.get(source, 0),
            }
        )
    return rows


def main() -> int:
    ap = parser(__file__, description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", choices=sorted(SETS), default="small")
    ap.add_argument("--packages", help="comma-separated source names (instead of --set)")
    ap.add_argument("--dsc", type=Path, action="append", default=[], help="a local source package too (repeatable)")
    ap.add_argument("--broken", metavar="NAME", help="also a copy of source NAME made to fail (bad input)")
    ap.add_argument("--timeout", type=float, default=4 * 3600)
    ap.add_argument("--kill-worker-after", type=float, help="SIGKILL the worker running an sbuild after S seconds")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--up", action="store_true", help="deploy the instance if none runs")
    ap.add_argument("--down", action="store_true", help="tear the instance down at the end")
    args = ap.parse_args()
    names = args.packages.split(",") if args.packages else SETS[args.set]
    sources: dict[str, Path | None] = {name: None for name in names}
    sources |= {dsc.name.removesuffix(".dsc"): dsc.resolve() for dsc in args.dsc}
    if args.broken:
        sources[args.broken + BROKEN] = broken_copy(args.broken)
    names = list(sources)
    if args.up and deploy.container().init_pid() is None:
        deploy.up()
    instance = deploy.attach()
    t0 = time.monotonic()
    state = load_state()
    if "started" not in state:
        state["started"] = time.time()
        save_state(state)
    start(instance, sources, state)
    killer = Killer(args.kill_worker_after, t0)
    wrs = wait(instance, state, args.timeout, killer)
    wall = time.time() - state["started"]
    rows = [r for r in report(instance, state, wrs) if r["package"] in names]
    print(f"\n{'package':<12} {'result':<8} {'build s':>8} {'worker':<9} {'wr':>5} {'wf':>5} {'pub':>3}  log")
    for r in rows:
        secs = f"{r['build_seconds']:.0f}" if r["build_seconds"] else "-"
        print(
            f"{r['package']:<12} {r['sbuild_result'] or r['workflow_status'] or '-':<8} {secs:>8} "
            f"{r['worker'] or '-':<9} {r['sbuild_work_requests'][-1] if r['sbuild_work_requests'] else '-':>5} "
            f"{r['workflow']:>5} {r['published_sources']:>3}  {r['build_log_link'] or r['work_request_link'] or ''}"
        )
    done = [r for r in rows if r["workflow_status"] in FINISHED]
    roots = {r["workflow"] for r in rows}
    completed = len([w for w in wrs if w["workflow_root"] in roots and w["status"] == "completed"])
    print(
        f"\n{len(done)}/{len(rows)} workflows finished, {wall:.0f} s since the batch started "
        f"({completed / wall * 3600:.0f} work requests/hour)"
    )
    twice = [r["package"] for r in rows if r["published_sources"] > 1]
    release = client.verify_release(instance)
    print(f"{release['url']}: signed by {release['valid_signature_by'] or 'nothing valid: ' + release['error']}")
    if args.json:
        summary = {"packages": rows, "wall_seconds": wall, "killed": killer.done, "published_twice": twice}
        args.json.write_text(json.dumps({**summary, "release": release}, indent=1) + "\n")
    if args.down:
        print(json.dumps(deploy.down()))
    # Every source builds and is published but the copies made to fail, which must not.
    wrong = [r["package"] for r in rows if (r["workflow_result"] == "success") == r["package"].endswith(BROKEN)]
    for what, names in (("published more than once", twice), ("not as expected", wrong)):
        if names:
            print(f"{what}: {', '.join(names)}", file=sys.stderr)
    unsigned = release["valid_signature_by"] != release["key"]
    return 1 if twice or wrong or unsigned or len(done) < len(rows) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.TimeoutExpired as e:
        print(f"debusine_rebuild: {e}", file=sys.stderr)
        sys.exit(1)
