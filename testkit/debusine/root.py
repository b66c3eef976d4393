"""The container's root: Debian 13 (trixie) with debusine 0.16.2 from trixie-backports,
made by mmdebstrap from Debian's archive alone and cached by its recipe (testkit.debian_roots:
the mmdebstrap command line below, this module's hooks included, and mmdebstrap's version).

The root holds every package the instance runs (server, PostgreSQL, Redis, nginx, the
external and signing workers, sbuild's unshare backend, the client) and only the settings
that must be right before its first boot: the instance shares the host's network
namespace (its workers and mmdebstrap reach the archive directly), so no service of the
root may listen on the host's addresses even once. PostgreSQL therefore takes Unix sockets
only, Redis and nginx the instance's own loopback address (ADDRESS), and nginx's default
site is gone. debusine's own units stay disabled until provisioning (provision.sh) has
made their databases and configuration. The host's apt configuration is never touched:
trixie and trixie-backports reach the root through mmdebstrap's own sources lines.
"""

from __future__ import annotations

from pathlib import Path

from testkit.debian_roots import debian_root
from testkit.debusine import ADDRESS, FQDN, SUITE

MIRROR = "http://deb.debian.org/debian"

#: What comes from trixie-backports: debusine 0.16.2 and what it needs in a newer version
#: than trixie has (Django 5.2, django-cte 3); everything else is trixie's.
BACKPORTED = ("debusine-*", "python3-debusine*", "python3-django", "python3-django-cte")

PACKAGES = (
    # systemd as PID 1 of the container
    "systemd",
    "systemd-sysv",
    "dbus",
    # the server and what it runs behind (the database set up by provisioning, not by
    # dbconfig: no PostgreSQL runs while mmdebstrap configures the packages)
    "postgresql",
    "redis-server",
    "nginx",
    "dbconfig-no-thanks",
    "ca-certificates",
    "openssl",
    "debusine-server",
    "debusine-client",
    # the external workers and the unshare backend of sbuild and mmdebstrap (the worker
    # package recommends them; `ip` is the unshare executor's requirement)
    "debusine-worker",
    "sbuild",
    "mmdebstrap",
    "uidmap",
    "iproute2",
    "arch-test",
    "dose-distcheck",
    "xz-utils",
    "zstd",
    # the signing worker
    "debusine-signing",
    "gpg",
)

#: The units provisioning enables once the databases exist (the provisioner serves cloud
#: worker pools, which this instance has none of).
SERVER_UNITS = (
    "debusine-server-migrate.service",
    "debusine-server.service",
    "debusine-server-celery.service",
    "debusine-server-scheduler.service",
    "debusine-server-periodic-tasks.service",
)
DISABLED_UNITS = (
    *SERVER_UNITS,
    "debusine-server-provisioner.service",
    "debusine-server-delete-expired.timer",
    "debusine-server-update-statistics.timer",
    "debusine-server-vacuum-storage.timer",
    "debusine-signing-migrate.service",
    "debusine-signing.service",
    "debusine-worker.service",
)

SETUP_HOOK = f"""set -e
mkdir -p "$1/etc/apt/preferences.d"
cat > "$1/etc/apt/preferences.d/debusine-backports" <<'END'
Package: {" ".join(BACKPORTED)}
Pin: release n={SUITE}-backports
Pin-Priority: 990
END
"""

CUSTOMIZE_HOOK = f"""set -e
R=$1
echo debusine > "$R/etc/hostname"
cat > "$R/etc/hosts" <<'END'
127.0.0.1 localhost
{ADDRESS} {FQDN} deb.{FQDN} debusine
::1 localhost ip6-localhost ip6-loopback
END
rm -f "$R/etc/nginx/sites-enabled/default"
for d in "$R"/etc/postgresql/*/main/conf.d; do
    echo "listen_addresses = ''" > "$d/hugify-debusine.conf"
done
sed -i -e 's/^bind .*/bind {ADDRESS}/' "$R/etc/redis/redis.conf"
grep -qx 'bind {ADDRESS}' "$R/etc/redis/redis.conf"
chroot "$R" systemctl disable {" ".join(DISABLED_UNITS)}
# No background apt runs in a test instance.
chroot "$R" systemctl mask apt-daily.timer apt-daily-upgrade.timer
"""


def container_root() -> Path:
    """The cached root directory (built on first use, about 6 minutes and 1.1 GB)."""
    return debian_root(
        "debusine-root",
        "--variant=minbase",
        f"--include={','.join(PACKAGES)}",
        f"--setup-hook={SETUP_HOOK}",
        f"--customize-hook={CUSTOMIZE_HOOK}",
        suite=SUITE,
        mirrors=(f"deb {MIRROR} {SUITE} main", f"deb {MIRROR} {SUITE}-backports main"),
    )
