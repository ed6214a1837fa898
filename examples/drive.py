#!/usr/bin/env python3
"""Drive DeltaBox from a user's own pipeline through the CLI's JSON output (stdlib only).

    python3 examples/drive.py --pool py [--deltabox ./bin/deltabox] [--address SOCK]

One "agent step" with a save game: lease a sandbox, checkpoint, run a step that fails and
leaves a mess, roll back, retry, commit, release. Every call is `deltabox -o json VERB ...`.
"""
import argparse
import json
import subprocess
import sys


class DeltaBox:
    def __init__(self, binary, address=None):
        self.base = [binary] + (["--address", address] if address else []) + ["-o", "json"]

    def call(self, *args, check=True):
        p = subprocess.run(self.base + list(args), capture_output=True, text=True)
        if check and p.returncode != 0:
            raise RuntimeError(f"deltabox {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
        return p

    def json(self, *args):
        return json.loads(self.call(*args).stdout)

    def exec(self, sandbox, script, env=()):
        """Run a shell script; returns (exit code, stdout). With -o json, exec streams JSON
        lines: {"stdout": ...}, {"stderr": ...}, then {"exit": {"code": N, ...}}."""
        flags = [f for kv in env for f in ("--env", kv)]
        p = self.call("exec", *flags, sandbox, "--", "sh", "-c", script, check=False)
        out = []
        for line in p.stdout.splitlines():
            event = json.loads(line)
            out.append(event.get("stdout", ""))
        return p.returncode, "".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", default="py")
    ap.add_argument("--deltabox", default="deltabox")
    ap.add_argument("--address")
    args = ap.parse_args()
    db = DeltaBox(args.deltabox, args.address)

    sb = db.json("lease", "--pool", args.pool, "--env", "AGENT=drive.py")["id"]
    print(f"leased {sb}")
    try:
        db.exec(sb, "mkdir -p /work && echo 'task: count to 3' > /work/notes.txt")
        db.call("state", "patch", sb, json.dumps([{"op": "add", "path": "/conversation", "value": []}]))
        ck = db.json("checkpoint", "create", sb, "-m", "before step 1")
        print(f"checkpoint {ck['id']} in {ck['total_ms']:.1f} ms")
        for attempt in (1, 2):
            code, _ = db.exec(sb, """
                echo "attempt $ATTEMPT" >> /work/notes.txt
                echo half > /work/out.partial
                [ "$ATTEMPT" -ge 2 ] || exit 3     # the first attempt fails, leaving a mess
                mv /work/out.partial /work/out.txt""", env=[f"ATTEMPT={attempt}"])
            db.call("state", "patch", sb, json.dumps(
                [{"op": "append", "path": "/conversation", "value": {"attempt": attempt, "exit": code}}]))
            if code == 0:
                break
            rb = db.json("rollback", sb, "--to", ck["id"])
            print(f"attempt {attempt} failed (exit {code}); rolled back {rb['files_restored']} files, "
                  f"{rb['ops_undone']} state ops, {rb['effects_dropped']} effects in {rb['total_ms']:.1f} ms")
        else:
            sys.exit("step failed twice")
        _, notes = db.exec(sb, "cat /work/notes.txt; ls /work")
        print("files after the step:\n  " + notes.strip().replace("\n", "\n  "))
        print("conversation:", json.dumps(db.json("state", "get", sb, "/conversation")))
        c = db.json("commit", sb)
        print(f"committed at {c['checkpoint']}: {c['effects_released']} effects released")
    finally:
        db.call("release", sb, check=False)
        print(f"released {sb}")


if __name__ == "__main__":
    main()
