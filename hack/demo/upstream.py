"""A tiny local HTTP API for the demo: GET /data answers, POST /orders counts what arrives.

It listens on the host's loopback only; sandboxes reach it through DeltaBox's egress proxy.
GET /count reports how many POSTs arrived and their Idempotency-Key headers.
"""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

posts = []


class Handler(BaseHTTPRequestHandler):
    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/count":
            self._send(200, {"posts": len(posts), "keys": posts})
        else:
            self._send(200, {"weather": "sunny", "path": self.path})

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        self.rfile.read(length)
        posts.append(self.headers.get("Idempotency-Key", ""))
        self._send(201, {"order": len(posts)})

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
