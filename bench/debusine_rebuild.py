"""A derivative's rebuild of real Debian sources with hugify on, on the deployed debusine
instance (issue 44, items 3 and 4; tools/debusine-deploy, testkit/debusine).

Each source goes through `hugify derive-source` first (the `+hugify1` source with
dh-sequence-hugify in its Build-Depends and a changelog entry for the suite), as a
derivative uploads it. hugify's own packages (hugify, which provides dh-sequence-hugify,
and hugify-policy-debian: this checkout's `make deb`) are published into the instance's
suite by debusine's package_publish workflow before the first build: the suite is the
first extra repository of every build its publishing workflow starts, so the builds
install them from there (docs/packaging-debian.md, "On debusine"). Then each derived
source is uploaded to the workspace and built by one publish-to-SUITE workflow
(debian_pipeline: sbuild on the external workers, then published into the suite, whose
indexes the signing worker signs). With --archive-sources the archive's unchanged source
of each is built in the same batch too (the build-trixie workflow: built, not
published), the comparison for the build time hugify adds.

With --profiles (nocheck: no test suites on two cores), every sbuild task of the batch,
derived and archive builds alike, gets those build profiles from the workspace's task
configuration, as an operator sets them (set_build_profiles); each .buildinfo then
records them in DEB_BUILD_OPTIONS and DEB_BUILD_PROFILES.

After the builds, each published derived build is checked outside debusine: its .debs
and .udebs are the ones the suite's Packages index lists (SHA256), its .buildinfo records hugify
and the policy package, `hugify check` passes on its .changes, every -dbgsym debug
file carries the build-id of a binary of the build (readelf -n on both sides) and every
hugified file has its debug file, `hugify sign-packages` signs its statements with a
cosign key made for the batch, and `hugify verify` accepts the extracted packages with
those bundles.

Resumable: each upload and workflow is recorded in the instance's run directory
(bench-state.json) as soon as debusine returns its id, so an interrupted run started again
adopts them instead of starting them twice; a workflow debusine started for a recorded
upload whose id the run did not live to record is found and adopted too (at worst an
upload is made twice, which publishes nothing). A source that derive-source refuses or
that fails to build is reported (with its reason, or debusine's log link) and does not
stop the others. A worker killed mid-build (--kill-worker-after S, SIGKILL to the unit
running an sbuild) is restarted by systemd; debusine gives the running work request back
to it (or retries it), and the check at the end counts each source once in the suite:
nothing is published twice.

With --workers 1, the batch builds on the first external worker alone: the others are
disabled by the admin for it (`debusine-admin worker disable`), and enabled again at its
end; a batch keeps the number it started with. With --run-installed, each published
program that has a workload of its own (testkit/debusine/installed.py: git, icu, ruby3.3) is
installed from the suite into a clean root on XFS and run there under the runtime the
suite publishes, and in a clean root of the archive's builds: the same output, and its
hugified code mapped with 2 MiB pages.

usage: tools/bench debusine_rebuild [--set small|full] [--packages P,...] [--dsc FILE]...
        [--archive-sources] [--profiles P,...] [--workers N] [--run-installed]
        [--broken NAME] [--kill-worker-after S] [--timeout S] [--json OUT] [--up] [--down]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from testkit import REPO, debusine
from testkit.bench import parser
from testkit.cache import cache_root, locked
from testkit.cli import hugify
from testkit.debian import build_hugify_deb, deb_field, hugify_step_times
from testkit.debian_roots import source_package
from testkit.debusine import client, deploy
from testkit.debusine.deploy import Instance
from testkit.debusine.installed import WORKLOADS, run_installed
from testkit.elf import hugified, readelf

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
#: (sqlite3 is not among them: its debian/rules calls the dh_* commands itself, so
#: derive-source refuses it, no-dh-sequence.)
SMALL = {
    "dash": "dash: C, autotools, about a minute",
    "lz4": "lz4: C library and tool, make",
    "libzstd": "zstd: the zstd program ~1.1 MiB of code (hugified by default), C, make and cmake",
    "gawk": "gawk: C, autotools",
    "lua5.4": "Lua 5.4: C, make",
    "tmux": "tmux: C, autotools",
    "less": "less: C, autotools",
    "memcached": "memcached: C, autotools, a server",
}
#: small: one tiny source and one with a file over the default threshold.
#: full: the large ones first, so that the batch does not end waiting for one of them.
SETS = {"small": ["dash", "libzstd"], "full": [*LARGE, *SMALL]}
SUITE = "trixie"
#: A workflow whose build failed ends aborted, one that ran through completed.
FINISHED = ("completed", "aborted")
#: The suffix of the name a copy made to fail (--broken) is reported under, and of the
#: name of an archive source's unchanged build (--archive-sources).
BROKEN = "+broken"
UNCHANGED = " (archive)"
WORKFLOW = f"publish-to-{debusine.REPO_SUITE}"
#: The most of a build's time hugify's debhelper steps may take (docs/packaging-debian.md,
#: "What hugify adds to a build"), read off each build's log: 1 % of it, or 3 s where
#: that is more (a small package's whole build takes a minute or two).
PROMISED_SHARE = 0.01
PROMISED_FLOOR_SECONDS = 3.0
#: The workspace's base template (provision.sh): debian_pipeline without publishing.
COMPARE_WORKFLOW = "build-trixie"
#: Who signs the derived sources' changelog entries.
MAINTAINER = "hugify bench <bench@hugify.invalid>"
#: The policy the builds apply (what hugify-policy-debian installs), for `hugify check`.
POLICY = REPO / "policy" / "policy.toml"
COSIGN = cache_root() / "cosign-v2.6.5" / "bin" / "cosign"
#: The password of the batch's cosign key (made for the batch, in its run directory).
COSIGN_PASSWORD = "hugify-bench-debusine"
#: The workspace's task configuration collection every task looks up by default
#: (BaseTaskData.DEFAULT_TASK_CONFIGURATION_LOOKUP), and the file of it --profiles writes.
TASK_CONFIGURATION = "default@debusine:task-configuration"
PROFILES_ENTRY = "bench-build-profiles.yaml"


def set_build_profiles(instance: Instance, profiles: list[str]) -> dict[str, Any]:
    """The build profiles of every sbuild task of the workspace, set the debusine way: an
    entry of the workspace's default task configuration collection (debusine 0.14.6+)
    giving the sbuild task's `build_profiles` a default value, which debusine applies to
    each sbuild work request it configures, derived and archive builds alike (the
    debian_pipeline workflow has no field for them). debusine's sbuild task passes them
    to sbuild (--profiles) and turns nocheck and nodoc into DEB_BUILD_OPTIONS. No
    profiles: the entry is removed. Pulled, edited and pushed with the `debusine
    task-config` client commands, as an operator does; the collection is made if the
    workspace has none."""
    names = {
        c["name"] + "@" + c["category"]
        for c in client.client(instance, "collection", "list", "--yaml", "--workspace", debusine.WORKSPACE)
    }
    if TASK_CONFIGURATION not in names:
        client.client(
            instance, "collection", "create", "--yaml", "--workspace", debusine.WORKSPACE, TASK_CONFIGURATION, input=""
        )
    work = instance.share / "task-config"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    inside = instance.inside(work)
    name = TASK_CONFIGURATION.split("@", maxsplit=1)[0]
    instance.sh(f"debusine task-config pull --workspace {debusine.WORKSPACE} {name} --workdir {inside}")
    entry = work / PROFILES_ENTRY
    if profiles:
        item = {
            "task_type": "Worker",
            "task_name": "sbuild",
            "default_values": {"build_profiles": profiles},
            "comment": "bench/debusine_rebuild.py --profiles",
        }
        entry.write_text(json.dumps(item, indent=1) + "\n")  # JSON is YAML
    else:
        entry.unlink(missing_ok=True)
    pushed = instance.sh(f"debusine task-config push --workdir {inside} 2>&1")
    return {
        "collection": TASK_CONFIGURATION,
        "entry": PROFILES_ENTRY,
        "build_profiles": profiles,
        "push": pushed.strip().splitlines()[-1:],
    }


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


def derive(dsc: Path) -> tuple[Path | None, str]:
    """The derived source of `dsc` (`hugify derive-source`, into the run directory):
    (its .dsc, ""), or (None, derive-source's one-line refusal). A source that turns
    hugify on already is taken as it is."""
    dest = deploy.run_dir() / "derived" / dsc.stem
    made = sorted(dest.glob("*.dsc"))
    if made:
        return made[0], ""
    work = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    res = hugify(
        "derive-source",
        dsc,
        "-o",
        work,
        "--distribution",
        debusine.REPO_SUITE,
        "--maintainer",
        MAINTAINER,
        check=False,
    )
    if res.returncode != 0:
        shutil.rmtree(work)
        return (dsc, "") if "(already-hugified)" in res.stderr else (None, res.stderr.strip())
    work.rename(dest)
    return sorted(dest.glob("*.dsc"))[0], ""


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


def suite_stanzas() -> list[dict[str, str]]:
    """The suite's binary packages, or none before its first publication (no indexes)."""
    try:
        return client.suite_packages()
    except OSError:  # urllib's HTTPError 404: no Release yet
        return []


def publish_hugify(instance: Instance, state: dict[str, Any]) -> dict[str, Any]:
    """hugify's own packages (this checkout's `make deb`: hugify and hugify-policy-debian)
    in the suite, where the derived sources' builds find dh-sequence-hugify: imported as
    binary artifacts and published by debusine's package_publish workflow, which has the
    suite's indexes made again and signed. Done once per batch (recorded in the state)
    and skipped if the suite lists them already; a batch keeps the hugify it published
    (a run again after an edit of this checkout, whose `make deb` has another version,
    publishes nothing new, so the batch's builds record one hugify)."""
    entry: dict[str, Any] = state.setdefault("hugify_packages", {})
    if "published" in entry and entry.get("versions"):
        pairs = {(s["Package"], s["Version"]) for s in suite_stanzas()}
        if all((p, v) in pairs for p, v in entry["versions"].items()):
            return entry
    debs = build_hugify_deb().ok().installable()
    wanted = {deb_field(d, "Package"): deb_field(d, "Version") for d in debs}
    if entry.get("versions") != wanted:
        entry.clear()
        entry["versions"] = wanted
        save_state(state)
    listed = {s["Package"]: s["Version"] for s in suite_stanzas()}
    if all(listed.get(p) == v for p, v in wanted.items()):
        entry.setdefault("published", "before this run")
        return entry
    t0 = time.monotonic()
    if "artifacts" not in entry:
        entry["artifacts"] = [client.import_binary(instance, d) for d in debs]
        save_state(state)
    if "workflow" not in entry:
        entry["workflow"] = client.publish_binaries(instance, entry["artifacts"])
        save_state(state)
    print(f"hugify's packages {wanted}: artifacts {entry['artifacts']}, workflow {entry['workflow']}", flush=True)
    deadline = time.monotonic() + 1800
    while (wr := client.work_request(instance, entry["workflow"]))["status"] not in FINISHED:
        if time.monotonic() > deadline:
            break
        time.sleep(5)
    listed = {s["Package"]: s["Version"] for s in suite_stanzas()}
    if wr["result"] != "success" or any(listed.get(p) != v for p, v in wanted.items()):
        raise RuntimeError(
            f"publishing hugify's packages: workflow {entry['workflow']} {wr['result']}, the suite lists {listed}"
        )
    entry["published"] = f"in {time.monotonic() - t0:.0f} s"
    save_state(state)
    return entry


def start(instance: Instance, sources: dict[str, tuple[Path, str]], state: dict[str, Any]) -> None:
    """Uploads and starts what the state does not have yet, recording each step first.
    sources: name -> (the .dsc, the workflow template that builds it)."""
    pkgs = state["packages"]
    wrs = work_requests(instance)
    for name, (dsc, template) in sources.items():
        entry = pkgs.setdefault(name, {})
        if "dsc" not in entry:
            entry["dsc"] = str(dsc)
            entry["template"] = template
            save_state(state)
        if "artifact" not in entry:
            entry["artifact"] = client.import_source(instance, Path(entry["dsc"]))
            save_state(state)
        if "workflow" not in entry:
            adopted = existing_workflow(wrs, entry["artifact"])
            entry["workflow"] = adopted or client.start_workflow(
                instance, entry["template"], f"source_artifact: {entry['artifact']}\n"
            )
            save_state(state)
        print(f"{name}: artifact {entry['artifact']}, workflow {entry['workflow']}", flush=True)


def set_workers(instance: Instance, count: int) -> list[str]:
    """The first `count` external workers enabled, the others disabled the way an admin
    does it (`debusine-admin worker disable`: the worker's token refused, its work requests
    given to another worker); the names disabled."""
    for i, name in enumerate(debusine.WORKERS):
        instance.sh(f"debusine-admin worker {'enable' if i < count else 'disable'} {name}")
    return list(debusine.WORKERS[count:])


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


def batch_seconds(state: dict[str, Any], wrs: list[dict[str, Any]], roots: set[int]) -> float:
    """From the batch's start to the end of its last workflow (debusine's completed_at),
    or to now while one runs: a report made again later gives the same figure."""
    ends = [
        datetime.fromisoformat(w["completed_at"]).timestamp()
        for w in wrs
        if w["id"] in roots and w["status"] in FINISHED and w.get("completed_at")
    ]
    return (max(ends) if len(ends) == len(roots) else time.time()) - float(state["started"])


def build_log_artifact(instance: Instance, wr: dict[str, Any]) -> int | None:
    for a in wr["artifacts"]:
        art = client.artifact(instance, int(a["id"]) if isinstance(a, dict) else int(a))
        if art["category"] == "debian:package-build-log":
            return int(art["id"])
    return None


def build_log(log: int | None) -> str | None:
    """debusine's link to a build log artifact."""
    return client.web(f"/debusine/{debusine.WORKSPACE}/artifact/{log}/") if log is not None else None


def hugify_seconds(instance: Instance, logs: list[int]) -> dict[str, float]:
    """What each hugify debhelper command took in the sbuild tasks whose build log
    artifacts these are, read off the logs (the line each ends with:
    testkit.debian.hugify_step_times)."""
    times: dict[str, float] = {}
    for log in logs:
        for f in sorted(client.download_all(instance, log).iterdir()):
            for step, secs in hugify_step_times(f.read_text(errors="replace")).items():
                times[step] = times.get(step, 0.0) + secs
    return times


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
    # Source items are named NAME_VERSION, the .dsc NAME_VERSION without the epoch
    # (git_1:2.47.3-... is git_2.47.3-....dsc).
    sources_in_suite: dict[str, int] = {}
    for item in published:
        if item["category"] == "debian:source-package":
            name, _, version = item["name"].partition("_")
            key = f"{name}_{version.split(':', 1)[-1]}"
            sources_in_suite[key] = sources_in_suite.get(key, 0) + 1
    rows = []
    for name, entry in state["packages"].items():
        root = next((w for w in wrs if w["id"] == entry["workflow"]), None)
        builds = sorted(
            (w for w in wrs if w["workflow_root"] == entry["workflow"] and is_sbuild_task(w)),
            key=lambda w: w["id"],
        )
        last = builds[-1] if builds else None
        # One sbuild task per architecture the source builds for (arch-all packages on
        # a task of their own); a task run again after a worker died is another one.
        succeeded = [w for w in builds if w["result"] == "success"]
        source = Path(entry["dsc"]).name.removesuffix(".dsc")
        # Each build log artifact looked up once (the client asks the server for every
        # artifact of the work request).
        logs = {w["id"]: build_log_artifact(instance, w) for w in builds if w["status"] == "completed"}
        steps = hugify_seconds(instance, [log for w in succeeded if (log := logs[w["id"]]) is not None])
        build_seconds = sum(w["duration"] for w in succeeded) if succeeded else (last or {}).get("duration")
        rows.append(
            {
                "package": name,
                "source": source,
                "workflow_template": entry.get("template", WORKFLOW),
                "workflow": entry["workflow"],
                "workflow_status": root["status"] if root else None,
                "workflow_result": root["result"] if root else None,
                "sbuild_work_requests": [w["id"] for w in builds],
                "sbuild_succeeded": [w["id"] for w in succeeded],
                "sbuild_result": last["result"] if last else None,
                "build_seconds": build_seconds,
                # hugify's share of the build: its debhelper commands' own lines in the logs
                "hugify_steps": steps,
                "hugify_seconds": sum(steps.values()),
                "hugify_share": sum(steps.values()) / build_seconds if succeeded and build_seconds else None,
                "worker": names.get(last["id"]) if last else None,
                "work_request_link": client.web(last["url"]) if last else None,
                "build_log_link": build_log(logs.get(last["id"])) if last else None,
                "published_sources": sources_in_suite.get(source, 0),
            }
        )
    return rows


# --- the checks of a published build, outside debusine ---------------------------------------


def is_elf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"\x7fELF"


def build_id(path: Path) -> str | None:
    """The build-id readelf -n shows (binutils': independent of hugify's core)."""
    for line in readelf(path, "-n").splitlines():
        if "Build ID:" in line:
            return line.split("Build ID:", 1)[1].strip()
    return None


def extract(debs: list[Path], root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)


def debug_ids(binaries: Path, debug: Path) -> dict[str, Any]:
    """Each -dbgsym debug file against the build's binaries: its build-id (readelf -n)
    must be the one its .build-id path names and that of a binary of the build; and
    every hugified binary (its code on whole huge-page windows, by readelf) must have its
    debug file."""
    ids: dict[str, list[str]] = {}  # build-id -> the binaries that carry it (hardlinks too)
    hugified_files = []
    for f in sorted(binaries.rglob("*")):
        if f.is_file() and not f.is_symlink() and is_elf(f):
            path = "/" + str(f.relative_to(binaries))
            bid = build_id(f)
            if bid:
                ids.setdefault(bid, []).append(path)
            try:
                if hugified(f):
                    hugified_files.append(path)
            except (AssertionError, subprocess.CalledProcessError):  # no single executable load
                pass
    matched: list[str] = []
    mismatched: list[str] = []
    for d in sorted((debug / "usr/lib/debug/.build-id").glob("*/*.debug")):
        named = d.parent.name + d.name.removesuffix(".debug")
        bid = build_id(d)
        (matched if bid == named and bid in ids else mismatched).append(f"{d.parent.name}/{d.name}: {bid}")
    with_debug = {path for m in matched for path in ids[m.split(": ")[1]]}
    return {
        "hugified": hugified_files,
        "debug_files_matched": len(matched),
        "debug_files_mismatched": mismatched,
        "hugified_without_debug_file": [f for f in hugified_files if f not in with_debug],
    }


def installed_build_depends(buildinfo: Path, packages: tuple[str, ...]) -> dict[str, str | None]:
    """The versions of `packages` the .buildinfo records in Installed-Build-Depends."""
    text = buildinfo.read_text()
    field = text.split("Installed-Build-Depends:", 1)[1].split("\n\n", 1)[0]
    found: dict[str, str | None] = dict.fromkeys(packages)
    for entry in field.replace("\n", " ").split(","):
        parts = entry.split()
        if parts and parts[0] in found and len(parts) >= 3:
            found[parts[0]] = parts[2].rstrip(")")
    return found


def cosign_env() -> dict[str, str]:
    return {
        **os.environ,
        "HUGIFY_POLICY_PATH": str(POLICY),
        "HUGIFY_COSIGN": str(COSIGN),
        "COSIGN_PASSWORD": COSIGN_PASSWORD,
    }


def batch_key() -> tuple[Path, Path]:
    """The batch's cosign key pair (in the run directory): the signing key a derivative
    keeps outside debusine."""
    keys = deploy.run_dir() / "cosign"
    if not (keys / "cosign.pub").exists():
        keys.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [str(COSIGN), "generate-key-pair", "--output-key-prefix", str(keys / "cosign")],
            env=cosign_env(),
            capture_output=True,
            check=True,
        )
    return keys / "cosign.key", keys / "cosign.pub"


def check_published(instance: Instance, row: dict[str, Any], stanzas: list[dict[str, str]]) -> dict[str, Any]:
    """The checks of one published derived build (the module's docstring), over what
    every successful sbuild task of its workflow uploaded."""
    uploads = []
    for wr_id in row["sbuild_succeeded"]:
        (upload,) = client.built(instance, client.work_request(instance, wr_id)).of("debian:upload")
        uploads.append(client.download_all(instance, int(upload["id"])))
    changes = [c for d in uploads for c in sorted(d.glob("*.changes"))]
    buildinfos = [b for d in uploads for b in sorted(d.glob("*.buildinfo"))]
    # The .udebs too (libzstd1-udeb): the suite's Packages index lists them beside the
    # .debs (debusine's indexes have no debian-installer section), hugify check reads them.
    debs = [deb for d in uploads for deb in sorted([*d.glob("*.deb"), *d.glob("*.udeb")])]
    dbgsym = [d for d in debs if deb_field(d, "Package").endswith("-dbgsym")]
    main = [d for d in debs if d not in dbgsym]
    in_suite = client.published_sha256(stanzas)
    out: dict[str, Any] = {
        "upload_artifacts": [int(d.name) for d in uploads],
        "debs": [d.name for d in main],
        "dbgsym": [d.name for d in dbgsym],
        "not_as_published": [d.name for d in main if in_suite.get(d.name) != client.sha256(d)],
        "recorded": [installed_build_depends(b, ("hugify", "hugify-policy-debian")) for b in buildinfos],
    }
    res = [hugify("check", c, check=False, env=cosign_env()) for c in changes]
    out["check"] = {
        "status": max((r.returncode for r in res), default=0),
        "output": [(r.stdout + r.stderr).strip().splitlines()[-1:] for r in res],
    }
    work = deploy.run_dir() / "checks" / row["source"]
    shutil.rmtree(work, ignore_errors=True)
    extract(main, work / "root")
    extract(dbgsym, work / "debug")
    out |= debug_ids(work / "root", work / "debug")
    key, pub = batch_key()
    bundles = work / "bundles"
    bundles.mkdir()
    res = [hugify("sign-packages", "--key", key, "-o", bundles, c, check=False, env=cosign_env()) for c in changes]
    out["sign"] = {
        "status": max((r.returncode for r in res), default=0),
        "bundles": sorted(p.name for p in bundles.glob("*.bundle")),
        "output": [(r.stdout + r.stderr).strip().splitlines()[-1:] for r in res],
    }
    verify = hugify(
        "verify",
        "--root",
        work / "root",
        "--all",
        "--json",
        "--key",
        pub,
        "--bundles",
        bundles,
        check=False,
        env={**cosign_env(), "HUGIFY_POLICY_PATH": ""},
    )
    verdicts = {f["path"]: f["verdict"] for f in json.loads(verify.stdout)["files"]} if verify.stdout.strip() else {}
    out["verify"] = {"status": verify.returncode, "verdicts": verdicts}
    # A file used as it is (its code already on whole windows: no statement lists it,
    # docs/manifest.md) is "no statement"; every file hugify moved is "verified".
    accepted = all(
        v == "verified" or (v == "no-statement" and path not in out["hugified"]) for path, v in verdicts.items()
    )
    out["ok"] = bool(
        changes
        and not out["not_as_published"]
        and all(v for recorded in out["recorded"] for v in recorded.values())
        and out["check"]["status"] == 0
        and not out["debug_files_mismatched"]
        and not out["hugified_without_debug_file"]
        and out["sign"]["status"] == 0
        and accepted
        and all(verdicts.get(path) == "verified" for path in out["hugified"])
    )
    return out


def print_installed(installed: dict[str, Any]) -> None:
    """One line per program run from a clean root of the suite's packages."""
    for name, r in installed.items():
        if "error" in r:
            print(f"{name}: installed from the suite: the run failed:\n{r['error']}")
            continue
        mapped = ", ".join(
            f"{path} {m['file_pmd'] >> 10}/{m['whole_windows'] >> 10} kB"
            for path, m in r["suite"]["mappings"].items()
            if "whole_windows" in m
        )
        archive = sum(m["file_pmd"] for m in r["archive"]["mappings"].values()) >> 10
        print(
            f"{name}: installed from the suite {r['suite']['versions']}, exit {r['suite']['status']}; "
            f"the archive's {r['archive']['versions']}, exit {r['archive']['status']}; output "
            f"{'the same' if r['same_output'] else 'DIFFERENT'} ({r['suite']['output_sha256'][:12]}); "
            f"code PMD-mapped under hugify-run on XFS: {mapped or 'no hugified file mapped'} "
            f"(the archive's build, plain: {archive} kB)"
        )


def print_tables(rows: list[dict[str, Any]], refused: dict[str, str]) -> None:
    """The builds, the sources derive-source refused, the checks of the published
    builds and, with --archive-sources, each source's build time with and without
    hugify."""
    print(
        f"\n{'package':<20} {'result':<8} {'build s':>8} {'hugify s':>8} {'share':>6} {'worker':<9} {'wr':>5} "
        f"{'wf':>5} {'pub':>3}  log"
    )
    for r in rows:
        secs = f"{r['build_seconds']:.0f}" if r["build_seconds"] else "-"
        share = f"{100 * r['hugify_share']:.2f}%" if r.get("hugify_share") is not None else "-"
        print(
            f"{r['package']:<20} {r['sbuild_result'] or r['workflow_status'] or '-':<8} {secs:>8} "
            f"{r.get('hugify_seconds', 0.0):>8.1f} {share:>6} "
            f"{r['worker'] or '-':<9} {r['sbuild_work_requests'][-1] if r['sbuild_work_requests'] else '-':>5} "
            f"{r['workflow']:>5} {r['published_sources']:>3}  {r['build_log_link'] or r['work_request_link'] or ''}"
        )
    for name, why in refused.items():
        print(f"{name:<20} not derived: {why}")
    checked = [r for r in rows if "checks" in r and "error" not in r["checks"]]
    if checked:
        print(f"\n{'package':<20} {'check':>5} {'hugified':>8} {'debug ids':>9} {'signed':>6} {'verified':>8}  ok")
    for r in checked:
        c = r["checks"]
        verified = sum(v == "verified" for v in c["verify"]["verdicts"].values())
        print(
            f"{r['package']:<20} {c['check']['status']:>5} {len(c['hugified']):>8} "
            f"{c['debug_files_matched']:>4}/{c['debug_files_matched'] + len(c['debug_files_mismatched']):<4} "
            f"{len(c['sign']['bundles']):>6} {verified:>4}/{len(c['verify']['verdicts']):<3}  {c['ok']}"
        )
    by_name = {r["package"]: r for r in rows}
    pairs = [(r, by_name[r["package"] + UNCHANGED]) for r in rows if r["package"] + UNCHANGED in by_name]
    if pairs:
        print(f"\n{'package':<20} {'with hugify s':>13} {'unchanged s':>11} {'ratio':>6}")
    for derived, unchanged in pairs:
        a, b = derived["build_seconds"], unchanged["build_seconds"]
        ratio = f"{a / b:.2f}" if a and b and derived["sbuild_succeeded"] and unchanged["sbuild_succeeded"] else "-"
        print(f"{derived['package']:<20} {a or 0:>13.0f} {b or 0:>11.0f} {ratio:>6}")


def main() -> int:
    ap = parser(__file__, description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", choices=sorted(SETS), default="small")
    ap.add_argument("--packages", help="comma-separated source names (instead of --set)")
    ap.add_argument("--dsc", type=Path, action="append", default=[], help="a local source package too (repeatable)")
    ap.add_argument(
        "--archive-sources",
        action="store_true",
        help="also build each archive source unchanged, in the same batch (built, not published): the comparison",
    )
    ap.add_argument("--broken", metavar="NAME", help="also a copy of source NAME made to fail (bad input)")
    ap.add_argument("--timeout", type=float, default=4 * 3600)
    ap.add_argument("--kill-worker-after", type=float, help="SIGKILL the worker running an sbuild after S seconds")
    ap.add_argument(
        "--profiles",
        default="",
        help="comma-separated build profiles of every sbuild task (nocheck: no test suites), set in the "
        "workspace's task configuration",
    )
    ap.add_argument(
        "--workers",
        type=int,
        choices=range(1, len(debusine.WORKERS) + 1),
        default=len(debusine.WORKERS),
        help="external workers the batch builds on (the others disabled by the admin for it)",
    )
    ap.add_argument(
        "--run-installed",
        action="store_true",
        help="install the published programs into a clean root and run their workloads on XFS "
        "against the archive's (testkit/debusine/installed.py)",
    )
    ap.add_argument("--json", type=Path)
    ap.add_argument("--up", action="store_true", help="deploy the instance if none runs")
    ap.add_argument("--down", action="store_true", help="tear the instance down at the end")
    args = ap.parse_args()
    names = args.packages.split(",") if args.packages else SETS[args.set]
    originals: dict[str, Path] = {name: source_package(name, suite=SUITE) for name in names}
    originals |= {dsc.name.removesuffix(".dsc"): dsc.resolve() for dsc in args.dsc}
    if args.broken:
        originals[args.broken + BROKEN] = broken_copy(args.broken)
    if args.up and deploy.container().init_pid() is None:
        deploy.up()
    instance = deploy.attach()
    t0 = time.monotonic()
    state = load_state()
    if "started" not in state:
        state["started"] = time.time()
        save_state(state)
    sources: dict[str, tuple[Path, str]] = {}
    refused: dict[str, str] = {}
    for name, dsc in originals.items():
        derived, why = derive(dsc)
        if derived is None:
            refused[name] = why
            print(f"{name}: not derived: {why}", flush=True)
        else:
            sources[name] = (derived, WORKFLOW)
    if args.archive_sources:
        sources |= {name + UNCHANGED: (originals[name], COMPARE_WORKFLOW) for name in names}
    profiles = [p for p in args.profiles.split(",") if p]
    if state.setdefault("build_profiles", profiles) != profiles:
        print(f"debusine_rebuild: this batch's builds run with profiles {state['build_profiles']}", file=sys.stderr)
        return 2
    if state.setdefault("workers", args.workers) != args.workers:
        print(f"debusine_rebuild: this batch builds on {state['workers']} worker(s)", file=sys.stderr)
        return 2
    disabled = set_workers(instance, args.workers)
    print(f"workers: {', '.join(debusine.WORKERS[: args.workers])}; disabled for the batch: {disabled or 'none'}")
    task_configuration = set_build_profiles(instance, profiles)
    print(f"build profiles of every sbuild task: {profiles or 'none'} ({task_configuration['push']})", flush=True)
    save_state(state)
    hugify_packages = publish_hugify(instance, state)
    start(instance, sources, state)
    killer = Killer(args.kill_worker_after, t0)
    wrs = wait(instance, state, args.timeout, killer)
    rows = [r for r in report(instance, state, wrs) if r["package"] in sources]
    stanzas = suite_stanzas()
    # A finished workflow's published build passes its checks once for all: a run again
    # takes the result from the state (a failed check is made again).
    passed: dict[str, Any] = state.setdefault("checks_passed", {})
    for r in rows:
        if r["workflow_template"] == WORKFLOW and r["workflow_result"] == "success":
            if str(r["workflow"]) in passed:
                r["checks"] = passed[str(r["workflow"])]
                continue
            try:
                r["checks"] = check_published(instance, r, stanzas)
            except Exception:  # reported with the others, the batch's result stays
                r["checks"] = {"ok": False, "error": traceback.format_exc()}
                print(f"{r['package']}: the checks failed:\n{r['checks']['error']}", file=sys.stderr)
            if r["checks"]["ok"]:
                passed[str(r["workflow"])] = r["checks"] | {"checked_at": time.time()}
                save_state(state)
    # The published programs as a user gets them: from the suite into a clean root.
    installed: dict[str, Any] = {}
    if args.run_installed:
        for r in rows:
            name = r["package"]
            if name in WORKLOADS and r.get("checks", {}).get("ok"):
                try:
                    installed[name] = run_installed(
                        instance, deploy.run_dir() / "installed" / name, name, originals[name]
                    )
                except Exception:  # reported with the others
                    installed[name] = {"ok": False, "error": traceback.format_exc()}
                r["installed"] = installed[name]
    print_tables(rows, refused)
    print_installed(installed)
    done = [r for r in rows if r["workflow_status"] in FINISHED]
    roots = {r["workflow"] for r in rows}
    completed = len([w for w in wrs if w["workflow_root"] in roots and w["status"] == "completed"])
    wall = batch_seconds(state, wrs, roots)
    print(
        f"\n{len(done)}/{len(rows)} workflows finished, {wall:.0f} s from the batch's start to "
        f"{'its last workflow' if len(done) == len(rows) else 'now'} "
        f"({completed / wall * 3600:.0f} work requests/hour)"
    )
    print(
        f"build profiles: {', '.join(profiles) or 'none'} (sbuild's default in {TASK_CONFIGURATION}, "
        f"nocheck and nodoc in DEB_BUILD_OPTIONS)"
    )
    twice = [r["package"] for r in rows if r["published_sources"] > 1]
    release = client.verify_release(instance)
    print(f"{release['url']}: signed by {release['valid_signature_by'] or 'nothing valid: ' + release['error']}")
    if args.json:
        summary = {
            "packages": rows,
            "not_derived": refused,
            "hugify_packages": hugify_packages,
            "task_configuration": task_configuration,
            "wall_seconds": wall,
            "killed": killer.done,
            "published_twice": twice,
            "workers": list(debusine.WORKERS[: args.workers]),
        }
        args.json.write_text(json.dumps({**summary, "release": release}, indent=1) + "\n")
    set_workers(instance, len(debusine.WORKERS))  # the instance as it was deployed
    if args.down:
        print(json.dumps(deploy.down()))
    # Every source builds (and every derived one is published) but the copies made to
    # fail, which must not; every published build passes its checks.
    wrong = [r["package"] for r in rows if (r["workflow_result"] == "success") == (BROKEN in r["package"])]
    failed_checks = [r["package"] for r in rows if "checks" in r and not r["checks"]["ok"]]
    not_as_archive = [name for name, result in installed.items() if not result["ok"]]
    if args.run_installed and not installed:
        not_as_archive.append(f"none of {', '.join(sorted(WORKLOADS))} published and checked")
    # What docs/packaging-debian.md promises a build ("What hugify adds to a build").
    over_share = [
        r["package"]
        for r in rows
        if r.get("hugify_seconds", 0.0) > max(PROMISED_FLOOR_SECONDS, PROMISED_SHARE * (r["build_seconds"] or 0))
    ]
    for what, bad in (
        ("published more than once", twice),
        ("not as expected", wrong),
        ("failed the checks after publication", failed_checks),
        ("installed from the suite, not the archive's output or not mapped huge", not_as_archive),
        (f"hugify's steps took over {PROMISED_SHARE:.0%} of the build and {PROMISED_FLOOR_SECONDS:.0f} s", over_share),
    ):
        if bad:
            print(f"{what}: {', '.join(bad)}", file=sys.stderr)
    unsigned = release["valid_signature_by"] != release["key"]
    bad = twice or wrong or failed_checks or not_as_archive or over_share or unsigned
    return 1 if bad or len(done) < len(rows) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.TimeoutExpired as e:
        print(f"debusine_rebuild: {e}", file=sys.stderr)
        sys.exit(1)
