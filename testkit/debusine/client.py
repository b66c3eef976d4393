"""The `debusine` client of the instance (debusine-client 0.16.2, run inside the container as
the workspace owner provisioning made; its YAML output parsed there): uploads of source
packages, sbuild work requests and workflows, their states, artifacts and links.

Work request and artifact links are debusine's own web UI addresses (https://FQDN/...):
what a failure report names is what an operator opens.
"""

from __future__ import annotations

import base64
import hashlib
import lzma
import shutil
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit import debusine
from testkit.debusine.deploy import Instance

#: The environment sbuild looks up (the sbuild variant is tried first by the task itself).
ENVIRONMENT = f"debian/match:codename={debusine.SUITE}"
#: The suite as a lookup, and where the workspace's archive serves it (plain HTTP, as apt
#: reads it; from the host too: the container shares its network namespace).
SUITE_LOOKUP = f"{debusine.REPO_SUITE}@debian:suite"
ARCHIVE = f"http://deb.{debusine.FQDN}/debusine/{debusine.WORKSPACE}"


def client(instance: Instance, *args: str, input: str | None = None) -> Any:
    """`debusine ARGS` (ARGS include --yaml where the subcommand takes it), parsed."""
    return instance.yaml(["debusine", *args], input=input)


def web(path: str) -> str:
    """An absolute link to the instance's web UI from a path debusine returned."""
    return f"https://{debusine.FQDN}{path}"


def dsc_files(dsc: Path) -> list[Path]:
    """The .dsc and the files it lists (Files: field)."""
    files, in_files = [dsc], False
    for line in dsc.read_text(errors="replace").splitlines():
        if line.startswith("Files:"):
            in_files = True
        elif in_files and line.startswith(" "):
            files.append(dsc.parent / line.split()[2])
        elif in_files:
            break
    return files


def import_debian(instance: Instance, files: list[Path], into: str) -> int:
    """Uploads a source package (its .dsc first, then the files it lists) or a binary
    package, copied into the share's directory `into`, as an artifact of the workspace
    (debian:source-package, debian:binary-package); its artifact id."""
    dest = instance.share / into
    dest.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copyfile(f, dest / f.name)
    inside = instance.inside(dest / files[0].name)
    out = client(instance, "artifact", "import-debian", "--yaml", "--workspace", debusine.WORKSPACE, inside)
    return int(out["artifact_id"])


def import_source(instance: Instance, dsc: Path) -> int:
    return import_debian(instance, dsc_files(dsc), f"sources/{dsc.stem}")


def import_binary(instance: Instance, deb: Path) -> int:
    return import_debian(instance, [deb], "binaries")


def publish_binaries(instance: Instance, artifacts: list[int]) -> int:
    """Starts debusine's package_publish workflow (as the workspace's owner may, without a
    template) that copies the binary package artifacts into the suite and has its indexes
    made again and signed (update_suites); its id."""
    lookups = ", ".join(f'"{a}@artifacts"' for a in artifacts)
    data = f"target_suite: {SUITE_LOOKUP}\nbinary_artifacts: [{lookups}]\n"
    return start_workflow(instance, "package_publish", data, template=False)


def sbuild_work_request(instance: Instance, source_artifact: int, components: tuple[str, ...] = ("any", "all")) -> int:
    """An sbuild work request for the source artifact (amd64, trixie's environment,
    unshare backend); its id."""
    data = (
        f"input:\n  source_artifact: {source_artifact}\n"
        f"build_architecture: amd64\n"
        f"build_components: [{', '.join(components)}]\n"
        f"environment: {ENVIRONMENT}\n"
        f"backend: unshare\n"
    )
    out = client(instance, "work-request", "create", "--yaml", "--workspace", debusine.WORKSPACE, "sbuild", input=data)
    return int(out["id"])


def start_workflow(instance: Instance, name: str, data: str, template: bool = True) -> int:
    """A workflow from the workspace's template `name`, or (template=False, for the
    workspace's owner) of the workflow task `name` directly; its id."""
    how = [] if template else ["--no-template"]
    out = client(instance, "workflow", "start", "--yaml", "--workspace", debusine.WORKSPACE, *how, name, input=data)
    return int(out["id"])


def work_request(instance: Instance, wr_id: int) -> dict[str, Any]:
    out: dict[str, Any] = client(instance, "work-request", "show", "--yaml", str(wr_id))
    return out


def wait(instance: Instance, wr_id: int, timeout: float, poll: float = 5) -> dict[str, Any]:
    """The work request (or workflow) once completed; raises TimeoutError with its last
    state after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        wr = work_request(instance, wr_id)
        if wr["status"] == "completed":
            return wr
        if time.monotonic() > deadline:
            raise TimeoutError(f"work request {wr_id} still {wr['status']} after {timeout:.0f} s: {web(wr['url'])}")
        time.sleep(poll)


def artifact(instance: Instance, artifact_id: int) -> dict[str, Any]:
    out: dict[str, Any] = client(instance, "artifact", "show", "--yaml", str(artifact_id))
    return out


@dataclass
class Built:
    """What one sbuild work request produced, by artifact category."""

    work_request: dict[str, Any]
    artifacts: list[dict[str, Any]]

    def of(self, category: str) -> list[dict[str, Any]]:
        return [a for a in self.artifacts if a["category"] == category]

    def file_urls(self, category: str) -> dict[str, str]:
        return {name: f["url"] for a in self.of(category) for name, f in a["files"].items()}


def built(instance: Instance, wr: dict[str, Any]) -> Built:
    return Built(wr, [artifact(instance, int(a["id"])) for a in wr["artifacts"]])


def download_all(instance: Instance, artifact_id: int) -> Path:
    """Every file of an artifact, downloaded with the client into the share: their
    directory. An artifact's files never change, so a download that finished is used
    again (a resumed batch's report reads every build log again); one that did not is
    made afresh (the client refuses to overwrite a file)."""
    dest = instance.share / "downloads" / str(artifact_id)
    finished = dest.with_name(f"{artifact_id}.done")
    if finished.exists():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    instance.sh(f"debusine artifact download --target-directory {instance.inside(dest)} {artifact_id} > /dev/null")
    finished.touch()
    return dest


def download(instance: Instance, artifact_id: int, name: str) -> Path:
    """One file of an artifact, downloaded with the client into the share."""
    done = instance.share / "downloads" / str(artifact_id) / name
    return done if done.exists() else download_all(instance, artifact_id) / name


def archive_get(path: str) -> bytes:
    """A file of the workspace's archive (ARCHIVE/path), fetched from the host over
    the instance's address with the archive's virtual host name."""
    url = f"http://{debusine.ADDRESS}{ARCHIVE.removeprefix(f'http://deb.{debusine.FQDN}')}/{path}"
    request = urllib.request.Request(url, headers={"Host": f"deb.{debusine.FQDN}"})
    with urllib.request.urlopen(request, timeout=120) as response:
        data: bytes = response.read()
    return data


def suite_packages() -> list[dict[str, str]]:
    """The suite's binary packages as apt sees them: the stanzas of the Packages index of
    every component and architecture its InRelease lists (arch-all packages are in
    binary-all only), each with Package, Version, Source, Filename, SHA256..."""
    release = archive_get(f"dists/{debusine.REPO_SUITE}/InRelease").decode()  # verify_release checks it
    fields = stanza_fields(release)
    stanzas = []
    for component in fields["Components"].split():
        for architecture in fields["Architectures"].split():
            path = f"dists/{debusine.REPO_SUITE}/{component}/binary-{architecture}/Packages.xz"
            index = lzma.decompress(archive_get(path))
            stanzas += [stanza for block in index.decode().split("\n\n") if (stanza := stanza_fields(block))]
    return stanzas


def stanza_fields(block: str) -> dict[str, str]:
    """The fields of a deb822 stanza (a Release file's, an index entry's): name -> value
    of its first line; continuation lines (file lists, long descriptions) are left out."""
    out = {}
    for line in block.splitlines():
        if line and not line[0].isspace() and ":" in line:
            name, value = line.split(":", 1)
            out[name] = value.strip()
    return out


def published_sha256(stanzas: list[dict[str, str]]) -> dict[str, str]:
    """File name -> SHA256 of each binary package the suite's indexes list."""
    return {s["Filename"].rsplit("/", 1)[-1]: s["SHA256"] for s in stanzas}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def repository_public_key(instance: Instance) -> bytes:
    """The public key (ASCII-armoured) of the repository key provisioning generated: the
    signing worker's, from its debusine:signing-key asset in the workspace."""
    fingerprint = instance.facts["repository_key"]
    assets = instance.yaml(["debusine", "asset", "list", "--yaml", "--workspace", debusine.WORKSPACE])
    (asset,) = [a for a in assets if a["data"]["fingerprint"] == fingerprint]
    return base64.b64decode(asset["data"]["public_key"])


def verify_release(instance: Instance) -> dict[str, Any]:
    """The suite's InRelease as apt fetches it from the instance's archive, checked with
    gpg against the repository key (repository_public_key): the fingerprint that signed
    it, or the error."""
    key = instance.facts["repository_key"]
    url = f"http://deb.{debusine.FQDN}/debusine/{debusine.WORKSPACE}/dists/{debusine.REPO_SUITE}/InRelease"
    armoured = instance.share / "repository-key.asc"
    armoured.write_bytes(repository_public_key(instance))
    script = f"""
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
gpg --dearmor < {instance.inside(armoured)} > "$d/key.gpg"
python3 -c 'import sys, urllib.request; sys.stdout.buffer.write(urllib.request.urlopen(sys.argv[1]).read())' {url} \\
    > "$d/InRelease"
gpg --batch --status-fd 1 --no-default-keyring --keyring "$d/key.gpg" --verify "$d/InRelease" 2>/dev/null \\
    | sed -n 's/^\\[GNUPG:\\] VALIDSIG \\([0-9A-F]*\\) .*/\\1/p'
"""
    res = instance.container.run_inside(["bash", "-euo", "pipefail", "-c", script], check=False)
    return {"url": url, "key": key, "valid_signature_by": res.stdout.strip() or None, "error": res.stderr.strip()}
