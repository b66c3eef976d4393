"""The instance: up, down, status, and what a test or a benchmark asks of it.

`up` takes the cached root (testkit.debusine.root), the cached provisioned layer (made on
first use: the root booted once, guest/provision.sh run in it, the container shut down
cleanly and its upper directory kept, keyed by the root's key, the guest files and the
instance's names) and boots the container over both, with a fresh upper directory of its
own; then it waits until the instance is healthy (health()). Its first run on a machine is
the cold deployment (mmdebstrap, provisioning with the environment built by debusine's own
workers); every later one the warm deployment (a boot). `down` shuts the container down
and removes everything the run wrote; what the instance did between is gone with it, the
cached layers stay. One instance runs at a time (a lock its session holds while it lives).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testkit import debusine
from testkit.cache import cache_root, cached
from testkit.debusine.container import Container, ContainerError, try_lock
from testkit.debusine.root import SERVER_UNITS, container_root

GUEST = Path(__file__).resolve().parent / "guest"
#: Where the host and the container exchange files (sources to upload, downloads).
SHARE_INSIDE = "/hugify-share"
GUEST_INSIDE = "/hugify-guest"

#: The units a healthy instance runs (the second worker's unit is made by provision.sh).
WORKER_UNITS = tuple(
    "debusine-worker.service" if i == 0 else f"debusine-worker-{i + 1}.service" for i in range(len(debusine.WORKERS))
)
UNITS = (
    "postgresql.service",
    "redis-server.service",
    "nginx.service",
    *(u for u in SERVER_UNITS if "migrate" not in u),
    *WORKER_UNITS,
    "debusine-signing.service",
)


def run_dir() -> Path:
    return cache_root() / "debusine" / "run"


def lock_path() -> Path:
    return cache_root() / "debusine" / "instance.lock"


def provision_env() -> list[str]:
    """The instance's names, as provision.sh reads them."""
    return [
        f"FQDN={debusine.FQDN}",
        f"ADDRESS={debusine.ADDRESS}",
        f"WORKSPACE={debusine.WORKSPACE}",
        f"REPO_SUITE={debusine.REPO_SUITE}",
        f"CLIENT_USER={debusine.USER}",
        f"WORKERS={' '.join(debusine.WORKERS)}",
        f"SERVER_UNITS={' '.join(SERVER_UNITS)}",
        f"GUEST={GUEST_INSIDE}",
    ]


def provisioned_key(root: Path) -> str:
    h = hashlib.sha256()
    h.update(root.parent.name.encode())
    h.update("\0".join(provision_env()).encode())
    for p in sorted(GUEST.iterdir()):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def provisioned_layer(root: Path) -> Path:
    """The cached layer over `root` that provisioning wrote (its `layer` directory, an
    overlay upper directory: whiteouts and opaque directories included)."""

    def make(work: Path) -> None:
        container = Container(work / "run", [root])
        container.start(binds=[(GUEST, GUEST_INSIDE, True)])
        try:
            container.wait_booted()
            start = time.monotonic()
            res = container.run_inside(
                ["bash", f"{GUEST_INSIDE}/provision.sh"], env=provision_env(), check=False, timeout=5400
            )
            (work / "provision.log").write_text(res.stdout + res.stderr)
            (work / "provision.seconds").write_text(f"{time.monotonic() - start:.0f}\n")
            if res.returncode != 0:
                raise ContainerError(f"provision.sh exited with {res.returncode}:\n{(res.stdout + res.stderr)[-8000:]}")
        except BaseException:
            container.stop()
            raise
        if not container.stop(keep_upper=work / "layer"):
            raise ContainerError("the provisioned container did not shut down in time: its layer is not kept")

    return cached("debusine-provisioned", provisioned_key(root), make) / "layer"


@dataclass
class Instance:
    """A running instance: its container, the facts provisioning recorded, timings."""

    container: Container
    facts: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def share(self) -> Path:
        """The host side of the container's SHARE_INSIDE."""
        return self.container.run / "share"

    def inside(self, path: Path) -> str:
        """Where a file under `share` is seen inside the container."""
        return f"{SHARE_INSIDE}/{path.relative_to(self.share)}"

    def sh(self, script: str, *, input: str | None = None, timeout: float = 600) -> str:
        """A shell script run as root in the container; its standard output."""
        return self.container.run_inside(
            ["bash", "-euo", "pipefail", "-c", script], input=input, timeout=timeout
        ).stdout

    def yaml(self, argv: list[str], input: str | None = None) -> Any:
        """The YAML a command prints in the container, parsed there (the container has
        PyYAML, the host's test environment need not)."""
        out = self.container.run_inside(
            [
                "bash",
                "-o",
                "pipefail",
                "-c",
                '"$@" | python3 -c "$0"',
                "import json, sys, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout, default=str)",
                *argv,
            ],
            input=input,
        ).stdout
        return json.loads(out) if out.strip() else None

    def admin_yaml(self, *args: str) -> Any:
        """`debusine-admin ARGS --yaml`, parsed."""
        return self.yaml(["debusine-admin", *args, "--yaml"])


def container() -> Container:
    return Container(run_dir(), [])


def up(log: bool = True) -> Instance:
    """Deploys the instance (cold or warm, see the module's docstring) and waits until it
    is healthy. Fails if one already runs."""
    fd = try_lock(lock_path())
    if fd is None:
        raise ContainerError(f"a debusine instance already runs ({run_dir()}): tools/debusine-deploy down")
    timings: dict[str, float] = {}
    try:
        taken = [s["local"] for s in listening() if debusine.ADDRESS in s["local"]]
        if taken:
            raise ContainerError(f"something else listens on the instance's address: {taken}")
        start = time.monotonic()
        root = container_root()
        timings["root"] = time.monotonic() - start
        layer = provisioned_layer(root)
        timings["provisioned_layer"] = time.monotonic() - start - timings["root"]
        boot = time.monotonic()
        c = Container(run_dir(), [layer, root])
        c.start(binds=[(run_dir() / "share", SHARE_INSIDE, False), (GUEST, GUEST_INSIDE, True)], lock_fd=fd)
        try:
            c.wait_booted()
            archive_by_address(c)
            instance = Instance(c)
            health(instance)
        except BaseException:
            c.stop()
            raise
        timings["boot_and_health"] = time.monotonic() - boot
        timings["total"] = time.monotonic() - start
    finally:
        os.close(fd)
    instance.facts = json.loads(c.run_inside(["cat", "/etc/hugify-debusine/facts.json"]).stdout)
    instance.timings = timings
    (c.run / "up.json").write_text(json.dumps({"timings": timings, "facts": instance.facts}, indent=1) + "\n")
    if log:
        print(
            f"debusine {debusine.DEBUSINE_VERSION} up at https://{debusine.FQDN}/ ({debusine.ADDRESS}) in "
            f"{timings['total']:.0f} s (root {timings['root']:.0f} s, provisioned layer "
            f"{timings['provisioned_layer']:.0f} s, boot and health {timings['boot_and_health']:.0f} s)"
        )
    return instance


#: What the workers' sbuild adds to every chroot before its apt update (ARCHIVE_BY_ADDRESS).
SBUILD_CONF = f"""# hugify's debusine instance (testkit/debusine/deploy.py, archive_by_address)
# A string: sbuild runs it with /bin/sh -c (a list would be joined with spaces first).
push @{{$external_commands->{{'chroot-setup-commands'}}}},
    q{{echo 'Acquire::http::Proxy::deb.{debusine.FQDN} "http://{debusine.ADDRESS}/";'}}
    . q{{ > /etc/apt/apt.conf.d/99debusine-archive-by-address}};
1;
"""


def archive_by_address(c: Container) -> None:
    """Lets builds reach the workspace's archive by its name, deb.FQDN, which resolves
    through the container's /etc/hosts only: sbuild's unshare backend gives each chroot
    an /etc/hosts of its own (sbuild-usernsexec writes it at every command), and
    debusine names a suite it passes to a build as an extra repository by that name
    (http://deb.FQDN/SCOPE/WORKSPACE). A chroot-setup command of the workers' sbuild
    configuration, which sbuild runs before its apt update, makes the archive's own
    address apt's HTTP proxy for that name: apt connects there and asks for the absolute
    URI, and nginx serves it from the archive's virtual host. Written at each boot into
    the container's fresh upper layer (/etc/sbuild/sbuild.conf, read by every sbuild
    whatever user runs it), so the cached layers are unchanged."""
    c.run_inside(["sh", "-c", "cat > /etc/sbuild/sbuild.conf"], input=SBUILD_CONF)
    c.run_inside(["perl", "-c", "/etc/sbuild/sbuild.conf"])


def attach() -> Instance:
    """The running instance (for status, exec, and the benchmark's resumed runs)."""
    c = container()
    if c.init_pid() is None:
        raise ContainerError("no debusine instance runs: tools/debusine-deploy up")
    facts = json.loads(c.run_inside(["cat", "/etc/hugify-debusine/facts.json"]).stdout)
    return Instance(c, facts)


def down() -> dict[str, Any]:
    """Stops the instance and removes its run directory; reports what is left of it on
    the host (nothing, when all went well)."""
    c = container()
    orderly = c.stop()
    return {"orderly": orderly, **leftovers()}


def leftovers() -> dict[str, Any]:
    """What of an instance would be left on the host: mounts under its run directory,
    processes whose root is in it, its run directory, sockets on its address."""
    run = str(run_dir())
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines() if run in line]
    procs = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if os.readlink(p / "root").startswith(run):
                    procs.append(int(p.name))
            except OSError:
                pass
    return {
        "mounts": mounts,
        "processes": procs,
        "run_dir": run_dir().exists(),
        "listening": [s for s in listening() if debusine.ADDRESS in s["local"]],
    }


def listening() -> list[dict[str, str]]:
    """Every listening TCP/UDP socket of the host's network namespace (the container's
    too), with the processes that hold it."""
    out = subprocess.run(["ss", "-Hltunp"], capture_output=True, text=True, check=True).stdout
    sockets = []
    for line in out.splitlines():
        cols = line.split()
        sockets.append({"proto": cols[0], "local": cols[4], "users": " ".join(cols[6:])})
    return sockets


def instance_pids(instance: Instance) -> set[int]:
    """Host PIDs of the container's processes (those in its PID namespace)."""
    init = instance.container.init_pid()
    assert init is not None
    ns = os.readlink(f"/proc/{init}/ns/pid")
    pids = set()
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if os.readlink(p / "ns" / "pid") == ns:
                    pids.add(int(p.name))
            except OSError:
                pass
    return pids


def exposed(instance: Instance) -> list[str]:
    """The instance's listening sockets that are not on a loopback address: none, or the
    recipe is wrong."""
    pids = instance_pids(instance)
    bad = []
    for s in listening():
        owners = {int(m) for m in re.findall(r"pid=(\d+)", s["users"])}
        if not owners & pids:
            continue
        host = s["local"].rsplit(":", 1)[0].strip("[]")
        if not (host.startswith("127.") or host == "::1"):
            bad.append(f"{s['proto']} {s['local']} {s['users']}")
    return bad


def health(instance: Instance, timeout: float = 300) -> dict[str, Any]:
    """Waits until every unit of UNITS is active, the web server answers over HTTPS and
    every worker (both external ones and the signing one) is connected and enabled;
    fails with what is missing after `timeout`. The workers, as the server lists them."""
    deadline = time.monotonic() + timeout
    missing: list[str] = []
    while time.monotonic() < deadline:
        res = instance.container.run_inside(["systemctl", "is-active", *UNITS], check=False)
        states = res.stdout.split()
        missing = [f"{u}: {s}" for u, s in zip(UNITS, states, strict=True) if s != "active"]
        if not missing:
            web = instance.container.run_inside(
                [
                    "python3",
                    "-c",
                    "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=30)",
                    f"https://{debusine.FQDN}/",
                ],
                check=False,
            )
            if web.returncode != 0:
                missing = [f"https://{debusine.FQDN}/: {web.stderr.strip().splitlines()[-1:]}"]
            else:
                workers = {w["name"]: w for w in instance.admin_yaml("worker", "list")}
                external = [w for w in workers.values() if w["type"] == "external"]
                signing = [w for w in workers.values() if w["type"] == "signing"]
                missing = [
                    f"worker {w['name']} ({w['type']}): connected {w['connected']}, enabled {w['enabled']}"
                    for w in external + signing
                    if not (w["connected"] and w["enabled"])
                ]
                if sorted(w["name"] for w in external) != sorted(debusine.WORKERS) or len(signing) != 1:
                    missing.append(f"workers: {sorted(workers)}")
                if not missing:
                    return workers
        time.sleep(2)
    raise ContainerError("the instance is not healthy: " + "; ".join(missing))


def status() -> dict[str, Any]:
    """Whether an instance runs; if so its units, workers, sockets and facts."""
    c = container()
    if c.init_pid() is None:
        return {"running": False, **leftovers()}
    instance = attach()
    res = c.run_inside(["systemctl", "is-active", *UNITS], check=False)
    return {
        "running": True,
        "units": dict(zip(UNITS, res.stdout.split(), strict=True)),
        "workers": instance.admin_yaml("worker", "list"),
        "listening": [s for s in listening() if debusine.ADDRESS in s["local"]],
        "exposed": exposed(instance),
        "facts": instance.facts,
    }
