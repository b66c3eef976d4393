"""tools/debusine-deploy: the instance's one command.

up        deploy (cold: root and provisioned layer made first; warm: a boot) and
          wait until healthy; prints where it runs and how long it took
down      shut it down and remove what it wrote; prints what is left on the host
status    JSON: units, workers, sockets, facts (or what is left if none runs)
exec CMD  run CMD as root inside the container
client ARG...  the debusine client inside the container (as the workspace owner)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from testkit.debusine import deploy
from testkit.debusine.container import ContainerError


def main() -> int:
    ap = argparse.ArgumentParser(prog="debusine-deploy", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="action", required=True)
    sub.add_parser("up", help="deploy and wait until healthy")
    sub.add_parser("down", help="stop and remove what the instance wrote")
    sub.add_parser("status", help="the instance's state, as JSON")
    ex = sub.add_parser("exec", help="run a command as root inside the container")
    ex.add_argument("argv", nargs=argparse.REMAINDER)
    cl = sub.add_parser("client", help="the debusine client inside the container")
    cl.add_argument("argv", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    try:
        if args.action == "up":
            deploy.up()
        elif args.action == "down":
            left = deploy.down()
            print(json.dumps(left, indent=1))
            return 0 if not (left["mounts"] or left["processes"] or left["run_dir"] or left["listening"]) else 1
        elif args.action == "status":
            state = deploy.status()
            print(json.dumps(state, indent=1, default=str))
            return 0 if state["running"] else 3
        else:
            argv = args.argv if args.action == "exec" else ["debusine", *args.argv]
            res = deploy.attach().container.run_inside(argv, check=False, timeout=None)
            sys.stdout.write(res.stdout)
            sys.stderr.write(res.stderr)
            return res.returncode
    except (ContainerError, subprocess.TimeoutExpired) as e:
        print(f"debusine-deploy: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
