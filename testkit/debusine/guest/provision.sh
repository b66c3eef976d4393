#!/bin/bash
# Provisions hugify's debusine instance, inside the booted container, once per recipe (the
# result is cached as a layer over the root: testkit/debusine/deploy.py). Every step is
# one of debusine's documented admin steps (debusine-doc 0.16.2: tutorials/install-your-
# first-debusine-instance, howtos/set-up-debusine-{server,worker,signing}, add-new-worker,
# set-up-workflow-templates, create-package-repository, generate-signing-keys), scripted.
#
# Environment (from testkit.debusine): FQDN ADDRESS WORKSPACE REPO_SUITE CLIENT_USER
# WORKERS (names of the external workers) SERVER_UNITS; the guest files are in $GUEST.
# Writes the instance's facts to /etc/hugify-debusine/facts.json.
set -euo pipefail
GUEST=${GUEST:-/hugify-guest}
: "$FQDN" "$ADDRESS" "$WORKSPACE" "$REPO_SUITE" "$CLIENT_USER" "$WORKERS" "$SERVER_UNITS"
export PYTHONDONTWRITEBYTECODE=1

step() { echo "== $(date +%T) $*"; }
subst() { sed -e "s/@FQDN@/$FQDN/g" -e "s/@ADDRESS@/$ADDRESS/g" "$1"; }
# YAML on stdin -> the value of a Python expression over it (`d`), printed.
yq() { python3 -c 'import sys, yaml; d = yaml.safe_load(sys.stdin); print(eval(sys.argv[1]))' "$1"; }

# Waits until `debusine-admin worker list` shows every named worker connected and enabled.
wait_workers() {
    local deadline=$((SECONDS + 300)) names=$*
    until debusine-admin worker list --yaml | python3 -c '
import sys, yaml
ws = {w["name"]: w for w in yaml.safe_load(sys.stdin)}
sys.exit(not all(n in ws and ws[n]["connected"] and ws[n]["enabled"] for n in sys.argv[1:]))' $names; do
        [ $SECONDS -lt $deadline ] || { echo "workers not connected: $names" >&2; debusine-admin worker list >&2; exit 1; }
        sleep 2
    done
}

# Waits for a work request (a workflow too) to complete; fails unless it succeeded.
wait_work_request() {
    local id=$1 deadline=$((SECONDS + ${2:-1800})) out
    while :; do
        out=$(debusine work-request show --yaml "$id")
        [ "$(yq 'd["status"]' <<<"$out")" = completed ] && break
        [ $SECONDS -lt $deadline ] || { echo "work request $id did not complete" >&2; exit 1; }
        sleep 5
    done
    [ "$(yq 'd["result"]' <<<"$out")" = success ] || {
        echo "work request $id: $(yq 'd["result"]' <<<"$out")" >&2
        debusine work-request list --yaml --workspace "$WORKSPACE" >&2
        exit 1
    }
}

step "TLS: a self-signed certificate for $FQDN and deb.$FQDN, trusted inside the container"
openssl req -x509 -newkey rsa:3072 -nodes -days 3650 -subj "/CN=$FQDN" \
    -addext "subjectAltName=DNS:$FQDN,DNS:deb.$FQDN" \
    -keyout "/etc/ssl/private/$FQDN.key" -out "/etc/ssl/certs/$FQDN.pem" 2>/dev/null
cp "/etc/ssl/certs/$FQDN.pem" "/usr/local/share/ca-certificates/$FQDN.crt"
update-ca-certificates >/dev/null 2>&1

step "nginx: debusine's virtual hosts on $ADDRESS"
subst "$GUEST/nginx-debusine.conf" > /etc/nginx/sites-enabled/debusine
nginx -t -q
systemctl reload nginx

step "PostgreSQL: the server's and the signing worker's databases (Unix socket, peer authentication)"
for db in debusine-server:debusine debusine-signing:debusine-signing; do
    runuser -u postgres -- createuser "${db%%:*}"
    runuser -u postgres -- createdb -O "${db%%:*}" "${db#*:}"
done

step "server: settings, migrations, units"
subst "$GUEST/server-local.py" > /etc/debusine/server/local.py
# shellcheck disable=SC2086
systemctl enable --now $SERVER_UNITS
# gunicorn takes a while to listen after its unit started (Type=simple): nginx answers 502 until then.
deadline=$((SECONDS + 300))
until python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=60)' "https://$FQDN/" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || { echo "https://$FQDN/ does not answer" >&2; exit 1; }
    sleep 2
done

step "external workers: $WORKERS, each activated by a token the admin created for it"
worker_home() { if [ "$1" = 1 ]; then echo /var/lib/debusine/worker; else echo "/var/lib/debusine/worker-$1"; fi; }
n=0
for name in $WORKERS; do
    n=$((n + 1))
    if [ $n = 1 ]; then
        user=debusine-worker conf=/etc/debusine/worker unit=debusine-worker.service
    else
        # The package's unit runs one worker; another one runs as a user of its own, with
        # its configuration in that user's ~/.config/debusine/worker (debusine-worker's
        # documented per-user configuration) and the package's unit otherwise unchanged.
        user=debusine-worker-$n home=$(worker_home $n) conf=$(worker_home $n)/.config/debusine/worker
        unit=debusine-worker-$n.service
        useradd --system --add-subids-for-system --comment "Debusine Worker System user ($name)" \
            --home-dir "$home" --create-home "$user"
        chmod 755 "$home"  # as the package does: the unshare backend needs it
        sed -e "s/^Description=.*/& ($name)/" \
            -e "s|^ConditionPathExists=.*|ConditionPathExists=$conf/config.ini|" \
            -e "s|^User=.*|User=$user\nEnvironment=HOME=$home|" -e "s/^Group=.*/Group=$user/" \
            /usr/lib/systemd/system/debusine-worker.service > "/etc/systemd/system/$unit"
        grep -qx "User=$user" "/etc/systemd/system/$unit"
    fi
    mkdir -p "$conf"
    # [Environment] goes to every task the worker runs. XZ_DEFAULTS: mmdebstrap (the
    # environment's system.tar.xz) runs xz at its default level (6): most of the
    # provisioning's time on two cores (208 s for the whole provisioning, 115 s at -1),
    # for a tarball only this machine's workers fetch. dpkg-deb compresses with
    # liblzma, which does not read it: the packages built are the same.
    printf '[General]\napi-url = https://%s/api\n\n[Environment]\nxz_defaults = -1\n' "$FQDN" > "$conf/config.ini"
    token=$(debusine-admin worker create "$name")
    (umask 077; echo "$token" > "$conf/activation-token")
    chown -R "$user:$user" "$conf"
    systemctl daemon-reload
    systemctl enable --now "$unit"
done
# shellcheck disable=SC2086
wait_workers $WORKERS

step "signing worker: service key, registration, enabled by the admin"
printf '[General]\napi-url = https://%s/api\n' "$FQDN" > /etc/debusine/signing/config.ini
debusine-signing generate_service_key /etc/debusine/signing/0.key
systemctl enable --now debusine-signing-migrate.service debusine-signing.service
deadline=$((SECONDS + 300))
until signing=$(debusine-admin worker list --yaml | yq '" ".join(w["name"] for w in d if w["type"] == "signing")') \
    && [ -n "$signing" ]; do
    [ $SECONDS -lt $deadline ] || { echo "the signing worker did not register" >&2; exit 1; }
    sleep 2
done
debusine-admin worker enable --worker-type signing "$signing"
wait_workers "$signing"

step "user $CLIENT_USER owning workspace $WORKSPACE; the client's token"
debusine-admin user create "$CLIENT_USER" "$CLIENT_USER@$FQDN" > /dev/null
debusine-admin group create "debusine/$WORKSPACE-owners"
debusine-admin group members "debusine/$WORKSPACE-owners" --add "$CLIENT_USER"
# Public: its suite is a derivative's repository, read by apt without a token.
debusine-admin workspace define "debusine/$WORKSPACE" "$WORKSPACE-owners" --public --default-expiration-delay 0
token=$(debusine-admin create_token "$CLIENT_USER" --comment "hugify testkit client")
mkdir -p /root/.config/debusine/client
(umask 077; printf '[General]\ndefault-server = debusine\n\n[server:debusine]\napi-url = https://%s/api\nscope = debusine\ntoken = %s\n' \
    "$FQDN" "$token" > /root/.config/debusine/client/config.ini)

step "environment: trixie/amd64 for sbuild (buildd variant, unshare), made by debusine's update_environments"
debusine collection create --workspace "$WORKSPACE" debian@debian:environments < /dev/null > /dev/null
debusine workflow-template create --yaml --workspace "$WORKSPACE" update_environments update-environments < "$GUEST/update-environments.yaml" > /dev/null
env_wf=$(echo '{}' | debusine workflow start --yaml --workspace "$WORKSPACE" update-environments | yq 'd["id"]')
wait_work_request "$env_wf" 3600
environment=$(debusine collection lookup-single --yaml --workspace "$WORKSPACE" --default-category debian:environments \
    "debian/match:codename=trixie:architecture=amd64:format=tarball:backend=unshare:variant=sbuild" | yq 'd["artifact"]')

step "repository signing key (openpgp-repository), generated by the signing worker"
key_wr=$(debusine-admin create_work_request --workspace "debusine/$WORKSPACE" signing generatekey --data - <<END | yq 'd["work_request_id"]'
purpose: openpgp-repository
description: hugify test instance, $REPO_SUITE Release files
END
)
wait_work_request "$key_wr" 600
fingerprint=$(debusine asset list --yaml --work-request "$key_wr" | yq 'd[0]["data"]["fingerprint"]')

step "the workspace's archive signed with that key; suite $REPO_SUITE (all, amd64) and its publishing workflow template"
# On the archive, which its suites inherit it from: without a key there, update_suites
# would generate one of its own (and record it in the archive) at the first publication.
echo "signing_keys: [$fingerprint]" | debusine collection manage --yaml --workspace "$WORKSPACE" --data - \
    _@debian:archive > /dev/null
debusine workflow-template create --yaml --workspace "$WORKSPACE" debian_pipeline build-trixie < "$GUEST/build-trixie.yaml" > /dev/null
debusine archive suite create --yaml --workspace "$WORKSPACE" --architecture all --architecture amd64 \
    --base-workflow-template build-trixie "$REPO_SUITE" > /dev/null

mkdir -p /etc/hugify-debusine
python3 - "$signing" "$fingerprint" "$env_wf" "$environment" > /etc/hugify-debusine/facts.json <<'END'
import json, os, sys
signing, fingerprint, env_wf, environment = sys.argv[1:]
json.dump({
    "fqdn": os.environ["FQDN"], "address": os.environ["ADDRESS"],
    "workspace": os.environ["WORKSPACE"], "suite": os.environ["REPO_SUITE"],
    "publish_workflow": "publish-to-" + os.environ["REPO_SUITE"],
    "workers": os.environ["WORKERS"].split(), "signing_worker": signing,
    "repository_key": fingerprint, "environment_workflow": int(env_wf),
    "environment_artifact": int(environment),
}, sys.stdout, indent=1)
END
step "provisioned"
