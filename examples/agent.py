#!/usr/bin/env python3
"""A toy research agent for examples/agent-pipeline.yaml (stdlib only).

Each sub-command is one pipeline step. The agent:
  - writes files under /work (rolled back by DeltaBox when a step fails),
  - appends to its conversation in the sandbox's agent state through the per-sandbox API
    socket /.deltabox/run/api.sock (POST /v1/self/state with a JSON patch),
  - calls an HTTP API with GET and POST: $API_URL (or the task's api_url field) when set,
    else a stub API it serves itself inside the sandbox on 127.0.0.1 (`agent.py serve`).
    Once the egress proxy is wired, HTTP_PROXY is set and the POSTs are held until commit.
    Never point API_URL anywhere but this host.
  - fails at random on some steps: the dice are seeded by DELTABOX_SEED and the step name, so a
    retry sees the same dice; a failure is transient (first attempt only, DELTABOX_ATTEMPT=1)
    so the pipeline's retry succeeds after DeltaBox rolled the half-written files back.
    The clock is not virtualised: "now" for the agent is DELTABOX_TASK_START.
"""
import http.client
import http.server
import json
import os
import random
import socket
import socketserver
import sys
import time
import urllib.parse
import urllib.request

WORK = "/work"
SELF_SOCKET = "/.deltabox/run/api.sock"
STUB_PORT = 8765


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over the sandbox's own API socket."""

    def __init__(self, path):
        super().__init__("localhost", timeout=10)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def self_api(method, path, body=None, content_type="application/json"):
    conn = UnixHTTPConnection(SELF_SOCKET)
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, "/v1/self/" + path, body=data, headers={"Content-Type": content_type})
    resp = conn.getresponse()
    payload = resp.read()
    if resp.status >= 300:
        raise RuntimeError(f"self API {method} {path}: {resp.status} {payload[:200]!r}")
    return json.loads(payload or b"null")


def say(role, text):
    """Append a message to the conversation in the agent state."""
    msg = {"role": role, "step": os.environ.get("DELTABOX_STEP", ""), "text": text,
           "at": os.environ.get("DELTABOX_TASK_START", "")}
    self_api("POST", "state", [{"op": "append", "path": "/conversation", "value": msg}],
             "application/json-patch+json")


def api_url():
    return os.environ.get("API_URL") or os.environ.get("TASK_API_URL") or f"http://127.0.0.1:{STUB_PORT}"


def http_call(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(api_url() + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    # The in-sandbox stub is reached directly; any other API goes through the egress proxy
    # (HTTP_PROXY), which passes the GETs and holds the POSTs until the step commits. The proxy
    # is named explicitly: NO_PROXY lists 127.0.0.1, which inside a sandbox is the sandbox.
    proxy = os.environ.get("HTTP_PROXY", "")
    if api_url() == f"http://127.0.0.1:{STUB_PORT}" or not proxy:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    else:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy, "https": proxy}))
    with opener.open(req, timeout=10) as resp:
        return json.loads(resp.read() or b"null")


def dice():
    """The step's random generator: the same on every attempt of the step."""
    seed = os.environ.get("DELTABOX_SEED", "1")
    return random.Random(f"{seed}:{os.environ.get('DELTABOX_STEP', '')}")


def maybe_fail(rng, what):
    """Fail the first attempt of this step with probability FAIL_RATE, after writing a
    half-finished file that the rollback must remove."""
    rate = float(os.environ.get("FAIL_RATE", "0"))
    if rng.random() < rate and os.environ.get("DELTABOX_ATTEMPT") == "1":
        with open(os.path.join(WORK, what + ".partial"), "w") as f:
            f.write("half-written\n")
        print(f"transient failure in {what} (attempt 1)", file=sys.stderr)
        sys.exit(75)
    if os.path.exists(os.path.join(WORK, what + ".partial")):
        sys.exit(f"{what}.partial survived a rollback")


def write(name, text):
    with open(os.path.join(WORK, name), "w") as f:
        f.write(text)


def cmd_plan():
    rng = dice()
    question = os.environ.get("TASK_QUESTION", "what is DeltaBox?")
    maybe_fail(rng, "plan")
    plan = [f"search: {question}", rng.choice(["summarise", "compare sources"]), "file a ticket"]
    write("plan.json", json.dumps(plan, indent=1))
    say("assistant", f"plan for {question!r}: {plan}")


def cmd_research():
    rng = dice()
    maybe_fail(rng, "research")
    found = http_call("GET", "/search?q=" + urllib.parse.quote(os.environ.get("TASK_QUESTION", "x")))
    write("research.json", json.dumps(found))
    say("tool", f"GET /search: {len(found.get('results', []))} results")


def cmd_act():
    rng = dice()
    # The side effect comes first and the failure after it: the held POST of a failed attempt
    # is dropped by the rollback, and only the successful attempt's POST is sent at commit.
    ticket = http_call("POST", "/tickets", {"task": os.environ.get("DELTABOX_TASK_ID"),
                                            "priority": rng.choice(["low", "high"])})
    maybe_fail(rng, "act")
    write("ticket.json", json.dumps(ticket))
    say("tool", f"POST /tickets: {ticket}")


def cmd_act_safely():
    write("ticket.json", json.dumps({"skipped": True}))
    say("assistant", "could not file a ticket; noted for a human")


def cmd_report():
    rng = dice()
    maybe_fail(rng, "report")
    files = sorted(os.listdir(WORK))
    write("report.md", f"# {os.environ.get('TASK_QUESTION', '')}\n\nfiles: {files}\n")
    state = self_api("GET", "state?pointer=/conversation")
    say("assistant", f"report written after {len(state)} messages")


class StubAPI(http.server.BaseHTTPRequestHandler):
    """A tiny local API: GET /search and POST /tickets."""

    tickets = 0

    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self.reply({"ok": True})
        self.reply({"results": [{"title": f"result {i}", "path": self.path} for i in range(3)]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        StubAPI.tickets += 1
        self.reply({"ticket": StubAPI.tickets, "got": body})

    def log_message(self, *args):
        pass


class StubServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    """http.server.HTTPServer without its reverse DNS lookup of the bind address (getfqdn),
    which would wait for a name server the sandbox cannot (and must not) reach."""

    allow_reuse_address = True
    daemon_threads = True


def cmd_serve():
    StubServer(("127.0.0.1", STUB_PORT), StubAPI).serve_forever()


def cmd_wait_api():
    for _ in range(100):
        try:
            http_call("GET", "/health")
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"API at {api_url()} does not answer")


COMMANDS = {"plan": cmd_plan, "research": cmd_research, "act": cmd_act, "act-safely": cmd_act_safely,
            "report": cmd_report, "serve": cmd_serve, "wait-api": cmd_wait_api}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in COMMANDS:
        sys.exit(f"usage: agent.py {'|'.join(COMMANDS)}")
    os.makedirs(WORK, exist_ok=True)
    COMMANDS[sys.argv[1]]()
