"""``python3 -m deltabox``: the calling sandbox's own API from a shell (inside a sandbox; every
sandbox also has it as /.deltabox/sdk/bin/deltabox). Answers are printed as JSON."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, List, Optional

from . import errors, inside


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="deltabox", description="The sandbox's own DeltaBox API "
                                "(/.deltabox/run/api.sock): checkpoints, rollback, state, diff, verify.")
    p.add_argument("--address", help="the in-sandbox API socket (default: DELTABOX_SANDBOX_ADDRESS or "
                   "/.deltabox/run/api.sock)")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("checkpoint", help="take a checkpoint")
    c.add_argument("-m", "--message")
    c.add_argument("--name", help="a reference besides its ID")
    sub.add_parser("checkpoints", help="list the checkpoints")
    r = sub.add_parser("rollback", help="roll files, state and held effects back to a checkpoint (default: the latest)")
    r.add_argument("checkpoint", nargs="?")
    d = sub.add_parser("diff", help="what changed since a checkpoint (default: the latest)")
    d.add_argument("--from", dest="from_")
    d.add_argument("--to")
    s = sub.add_parser("state", help="print the state document, or the value at a JSON pointer")
    s.add_argument("pointer", nargs="?")
    pa = sub.add_parser("patch", help="apply RFC 6902 ops (JSON: one op or a list) to the state document")
    pa.add_argument("ops", help='e.g. \'{"op": "add", "path": "/done", "value": true}\'')
    pa.add_argument("--if-seq", type=int)
    sub.add_parser("verify", help="check the files against the latest checkpoint")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    a = _parser().parse_args(argv)
    me = inside(a.address)
    try:
        out: Any
        if a.cmd == "checkpoint":
            out = me.checkpoint(a.message, name=a.name)
        elif a.cmd == "checkpoints":
            out = me.checkpoints()
        elif a.cmd == "rollback":
            out = me.rollback(a.checkpoint)
        elif a.cmd == "diff":
            out = me.diff(a.from_, a.to)
        elif a.cmd == "state":
            out = me.state(a.pointer)
        elif a.cmd == "patch":
            try:
                ops = json.loads(a.ops)
            except ValueError as e:
                print(f"deltabox: patch: the ops are not JSON: {e}", file=sys.stderr)
                return 2
            out = me.patch_state(ops, if_seq=a.if_seq)
        else:
            out = me.verify()
    except errors.DeltaBoxError as e:
        print(f"deltabox: {e}", file=sys.stderr)
        return 1
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
