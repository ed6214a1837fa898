"""Times `state patch` and `exec true` through the Python SDK (for the benchmark
integration/bench_sdk_test.go, which times the same calls through the Go client).

    python3 bench_overhead.py SANDBOX_ID ROUNDS   ->  one JSON line of per-call microseconds
"""
import json
import os
import sys
import time

try:
    import deltabox
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import deltabox


def main() -> None:
    sandbox, rounds = sys.argv[1], int(sys.argv[2])
    sb = deltabox.Client().sandbox(sandbox)
    patch, exe = [], []
    for i in range(rounds):
        t = time.perf_counter()
        sb.patch_state([{"op": "add", "path": "/n", "value": i}])
        patch.append((time.perf_counter() - t) * 1e6)
        t = time.perf_counter()
        if sb.exec(["true"]).code != 0:
            raise SystemExit("exec true failed")
        exe.append((time.perf_counter() - t) * 1e6)
    print(json.dumps({"patch_us": patch, "exec_us": exe}))


if __name__ == "__main__":
    main()
