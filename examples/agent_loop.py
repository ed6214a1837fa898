#!/usr/bin/env python3
"""An agent loop driven through the DeltaBox Python SDK (sdk/python, standard library only).

    PYTHONPATH=sdk/python python3 examples/agent_loop.py --pool py [--address SOCK]

(or `pip install --no-index ./sdk/python` and drop PYTHONPATH). A scripted "model" plans
tool calls; each tool call is a step with a save game: checkpoint, run the command in the
sandbox, record it in the agent's state, and on a failure roll back (files, state and held
outbound requests) and try again with backoff; on success commit. The second tool fails on
its first attempt and leaves a mess behind, which the rollback removes.
"""
import argparse
import json
import sys

try:
    import deltabox
except ImportError:  # run from the source tree
    import os

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python"))
    import deltabox

# The "model": what it would ask for, one tool call per turn.
PLAN = [
    ("write the notes", "mkdir -p /work && echo 'task: count to 3' > /work/notes.txt"),
    ("count", """echo "attempt $ATTEMPT" >> /work/notes.txt
                 echo half > /work/out.partial
                 [ "$ATTEMPT" -ge 2 ] || { echo 'flaky tool' >&2; exit 3; }
                 seq 1 3 > /work/out.partial && mv /work/out.partial /work/out.txt"""),
    ("check", "cat /work/out.txt"),
]


class ToolFailed(Exception):
    pass


def tool_call(sb: deltabox.Sandbox, name: str, script: str, attempt: int) -> str:
    res = sb.exec(["sh", "-c", script], env=[f"ATTEMPT={attempt}"],
                  on_stderr=lambda b: sys.stdout.write("    stderr: " + b.decode(errors="replace")))
    sb.patch_state({"op": "append", "path": "/conversation",
                    "value": {"tool": name, "attempt": attempt, "exit": res.code, "output": res.text}})
    if not res.ok:
        raise ToolFailed(f"{name}: exit {res.code}")
    return res.text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", default="py")
    ap.add_argument("--address", help="the daemon's socket (default: DELTABOX_ADDRESS or /run/deltabox/deltabox.sock)")
    args = ap.parse_args()
    client = deltabox.Client(args.address)

    with client.lease(args.pool, env=["AGENT=agent_loop.py"]) as sb:
        print(f"leased {sb.id}")
        sb.patch_state({"op": "add", "path": "/conversation", "value": []})
        first = sb.checkpoint("start")
        for name, script in PLAN:
            step = sb.step(name, retries=2, backoff=0.1, retry_on=(ToolFailed,))
            for attempt in step:
                with attempt:
                    out = tool_call(sb, name, script, attempt.number)
            for a in step.attempts:
                if a.rollback_result:
                    rb = a.rollback_result
                    print(f"  {name}: attempt {a.number} failed ({a.error}); rolled back {rb['files_restored']} files, "
                          f"{rb['ops_undone']} state ops, {rb['effects_dropped']} effects in {rb['total_ms']:.1f} ms")
            done = step.attempts[-1]
            print(f"  {name}: ok after {done.number} attempt(s), committed at {done.commit_result['checkpoint']}"
                  + (f": {out.strip()!r}" if out.strip() else ""))
        diff = sb.diff(first["checkpoint"])
        print("files since the start:", ", ".join(f"{f['change']} {f['path']}" for f in diff["files"]))
        print("conversation:", json.dumps([(t["tool"], t["attempt"], t["exit"]) for t in sb.state("/conversation")]))
    print(f"released {sb.id}")


if __name__ == "__main__":
    try:
        main()
    except deltabox.DeltaBoxError as e:
        sys.exit(f"agent_loop: {e}")
