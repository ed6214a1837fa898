#!/usr/bin/env bash
# The DeltaBox demo: a fresh daemon on the private containerd, then the CLI end to end.
# Run it through `make demo`, which installs dependencies, starts containerd, builds the images
# and the binaries, and exports DELTABOX_BIN and DELTABOX_CONTAINERD_ADDRESS.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_root

BIN="${DELTABOX_BIN:?run through make demo}"
CONTAINERD="${DELTABOX_CONTAINERD_ADDRESS:?run through make demo}"
WORK="$(mktemp -d /tmp/deltabox-demo.XXXXXX)"
chmod 0711 "${WORK}" # user-namespaced sandboxes' CRIU restores reach their bind mounts below it
ROOT_DIR="$(cd "${HACK_DIR}/.." && pwd)"
SOCK="${WORK}/deltabox.sock"
DAEMON_PID=""
UPSTREAM_PID=""
UPSTREAM_PORT=18089

cleanup() {
	[[ -n ${UPSTREAM_PID} ]] && kill "${UPSTREAM_PID}" 2>/dev/null || true
	if [[ -n ${DAEMON_PID} ]]; then
		"${BIN}" --address "${SOCK}" pool rm demo --force >/dev/null 2>&1 || true
		kill -TERM "${DAEMON_PID}" 2>/dev/null || true
		wait "${DAEMON_PID}" 2>/dev/null || true
	fi
	rm -rf "${WORK}"
}
trap cleanup EXIT

db() { "${BIN}" --address "${SOCK}" "$@"; }
show() { printf '\n$ deltabox %s\n' "$*"; db "$@"; }

step daemon "start deltabox daemon (state root ${WORK}/root, log ${WORK}/daemon.log)"
# The demo's sandbox network has its own bridge and subnet, so it never meets a real daemon's.
cat >"${WORK}/config.toml" <<TOML
version = 1
[network]
name = "dbxdemo"
bridge = "dbxdemo"
subnet = "10.217.0.0/24"
TOML
"${BIN}" daemon --config "${WORK}/config.toml" --root "${WORK}/root" --address "${SOCK}" \
	--containerd-address "${CONTAINERD}" >"${WORK}/daemon.log" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 1 100); do db info >/dev/null 2>&1 && break; sleep 0.1; done
db info >/dev/null 2>&1 || die "daemon did not start: $(tail -5 "${WORK}/daemon.log")"
show info

step upstream "a local HTTP API on the host's loopback (port ${UPSTREAM_PORT}), reachable only through the egress proxy"
python3 "${HACK_DIR}/demo/upstream.py" "${UPSTREAM_PORT}" &
UPSTREAM_PID=$!
cat >"${WORK}/policy.yaml" <<YAML
version: 1
default: deny
rules:
  - host: 127.0.0.1
    ports: [${UPSTREAM_PORT}]
    methods: [GET, HEAD]
    action: pass
  - host: 127.0.0.1
    ports: [${UPSTREAM_PORT}]
    methods: [POST, PUT, PATCH, DELETE]
    action: hold
YAML
cat "${WORK}/policy.yaml"

step pool "a warm pool of the python image"
show pool create demo --image deltabox.local/python:3 --min-ready 2 --memory 256m --pids 128 --disk 512m --egress-policy "${WORK}/policy.yaml"
for _ in $(seq 1 300); do
	[[ $(db -o json pool ls | grep -c '"ready": 2') -ge 1 ]] && break
	sleep 0.1
done
show pool ls

step lease "lease a sandbox and run commands in it"
# NO_PROXY is cleared so that 127.0.0.1 means the host's API (through the proxy), not the sandbox.
ID=$(db lease --pool demo --env GREETING=hello --env NO_PROXY= --env no_proxy=)
printf '\n$ deltabox lease --pool demo --env GREETING=hello --env NO_PROXY= --env no_proxy=\n%s\n' "${ID}"
show exec "${ID}" -- python3 -c 'import os, platform; print(os.environ["GREETING"], "from python", platform.python_version())'
echo 'print(sum(range(10)))' >"${WORK}/script.py"
show cp "${WORK}/script.py" "${ID}:/tmp/script.py"
show exec "${ID}" -- python3 /tmp/script.py
show exec "${ID}" -- sh -c 'echo failing step >&2; exit 3' || echo "(exit code $?: exec exits with the command's code)"
show -o json inspect "${ID}"

step checkpoint "an agent step that succeeds, then one that fails and is rolled back"
show state patch "${ID}" '[{"op":"add","path":"/conversation","value":[]},{"op":"append","path":"/conversation","value":{"role":"user","text":"summarise the data"}}]'
show exec "${ID}" -- sh -c 'mkdir -p /work && echo "draft 1" > /work/summary.txt'
show checkpoint create "${ID}" -m "step 1 done"
show exec "${ID}" -- sh -c 'echo "garbage" > /work/summary.txt; rm /etc/os-release; echo scratch > /work/tmp.bin'
show state patch "${ID}" '[{"op":"append","path":"/conversation","value":{"role":"tool","text":"error: step 2 failed"}}]'
show diff "${ID}"
show rollback "${ID}"
show exec "${ID}" -- sh -c 'cat /work/summary.txt; ls /work; test -e /etc/os-release && echo "/etc/os-release is back"'
show state get "${ID}"
show checkpoint ls "${ID}"

step effects "outbound calls: GET passes, POST is held; a rollback drops it, a commit sends it once"
API="http://127.0.0.1:${UPSTREAM_PORT}"
show checkpoint create "${ID}" -m "before calling the API"
show exec "${ID}" -- curl -sS "${API}/data"
show exec "${ID}" -- curl -sS -X POST -d '{"item":"book"}' "${API}/orders"
show effects ls "${ID}"
printf '\nupstream before rollback: %s\n' "$(curl -sS "${API}/count")"
show rollback "${ID}"
show exec "${ID}" -- curl -sS -X POST -d '{"item":"book"}' "${API}/orders"
show commit "${ID}"
show effects ls "${ID}"
printf '\nupstream after commit: %s\n' "$(curl -sS "${API}/count")"

step l3 "L3: a Python process with in-memory state, snapshotted, restored as a second sandbox, forked 3 ways"
show pool create demo-l3 --image deltabox.local/python:3 --min-ready 1 --max 6 --memory 256m --pids 128 --disk 512m --wait
L3=$(db lease --pool demo-l3)
printf '\n$ deltabox lease --pool demo-l3\n%s\n' "${L3}"
show exec "${L3}" -- sh -c 'cat > /counter.py <<PY
import os, time
n = 0
while True:
    n += 1
    with open("/tmp/count.new", "w") as f:
        f.write(str(n))
    os.rename("/tmp/count.new", "/tmp/count")
    time.sleep(0.05)
PY
nohup python3 /counter.py >/dev/null 2>&1 &
sleep 1; echo "counter at $(cat /tmp/count)"'
show snapshot push "${L3}"
SNAP=$(db -o json snapshot ls | python3 -c 'import json,sys; print(json.load(sys.stdin)[-1]["uri"])')
RESTORED=$(db -o json restore "${SNAP}" | tail -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["sandbox"])')
printf '\n$ deltabox restore %s\n%s\n' "${SNAP}" "${RESTORED}"
show exec "${RESTORED}" -- sh -c 'echo "restored counter continues at $(cat /tmp/count) (the original is at least at 20 by now)"'
show fork "${L3}" --count 3
show ls

step pipeline "a batch pipeline: the example agent, 8 tasks, failures rolled back and retried, POSTs committed once"
show pool create py --image deltabox.local/python:3 --min-ready 4 --max 8 --disk 512m --egress-policy "${WORK}/policy.yaml"
python3 - "${UPSTREAM_PORT}" >"${WORK}/tasks.jsonl" <<'PY'
import json, sys
for i in range(8):
    print(json.dumps({"id": f"t{i}", "question": f"question {i}", "api_url": f"http://127.0.0.1:{sys.argv[1]}"}))
PY
before=$(curl -sS "${API}/count" | python3 -c 'import json,sys; print(json.load(sys.stdin)["posts"])')
show run "${ROOT_DIR}/examples/agent-pipeline.yaml" --tasks "${WORK}/tasks.jsonl" --parallel 4
after=$(curl -sS "${API}/count" | python3 -c 'import json,sys; print(json.load(sys.stdin)["posts"])')
printf '\nthe upstream received %d POSTs from the pipeline (one per committed task, none from rolled-back attempts)\n' "$((after - before))"

step release "release: the next lease starts clean"
show release "${ID}"
show pool ls

step info "the node, as the daemon sees it"
show info
log "demo finished"
