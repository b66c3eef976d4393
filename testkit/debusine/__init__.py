"""A debusine instance on this machine, for the tests and benchmarks of hugify on Debian's
build service (issue 44): debusine 0.16.2 from trixie-backports in a Debian 13 system
container (systemd-nspawn over a root made by mmdebstrap), set up from Debian's packages
and debusine's own admin commands only.

- root: the container's root (packages, and what must hold before its first boot).
- container: one booted container, its overlay layers, commands run inside it.
- deploy: the instance: up (root, provisioned layer, boot, health), down, status.
- client: the `debusine` client of the instance (uploads, work requests, workflows).
- installed: the suite's packages installed into a clean root, their programs run there
  beside the archive's (bench/debusine_rebuild.py --run-installed).
- guest/: what runs or is installed inside the container (provision.sh and its files),
  copied in by path and part of the provisioned layer's cache key.

The one command is tools/debusine-deploy (up|down|status|exec|client); docs/debusine.md
describes the instance.
"""

from __future__ import annotations

#: The Debian release the container runs, and where debusine comes from.
SUITE = "trixie"
DEBUSINE_VERSION = "0.16.2~bpo13+1"
#: The name the instance serves under; resolved inside the container by its /etc/hosts.
FQDN = "debusine.internal"
#: The container shares the host's network namespace (its workers fetch from Debian's
#: archive), so its services listen on an address of their own on the loopback network:
#: the standard ports (debusine builds https://FQDN/api without a port) and no clash with
#: anything of the host's on 127.0.0.1. Linux routes all of 127.0.0.0/8 to lo.
ADDRESS = "127.44.0.1"
#: The workspace hugify's rebuilds use, its suite, and the user who owns both.
WORKSPACE = "hugify"
REPO_SUITE = "trixie-hugify"
USER = "hugify"
#: The external workers (activated by token) and the signing worker (enabled by name).
WORKERS = ("worker-1", "worker-2")
SIGNING_WORKER = "signing"
