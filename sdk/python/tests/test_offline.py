"""Tests of the SDK that need no daemon: addresses, error mapping, the build backend."""
import os
import socket
import sys
import tempfile
import threading
import time
import unittest
import zipfile
from unittest import mock

try:  # the installed package, or the source tree
    import deltabox
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import deltabox
from deltabox import errors  # noqa: E402


def _read_request(c):
    """Read one HTTP request from c; its method (b"" at EOF)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = c.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(dict(h.lower().split(b": ", 1) for h in head.split(b"\r\n")[1:]).get(b"content-length", 0))
    while len(body) < length:
        body += c.recv(65536)
    return head.split(b" ")[0]


class Offline(unittest.TestCase):
    def test_unreachable_socket_names_it(self):
        path = os.path.join(tempfile.mkdtemp(), "no-daemon.sock")
        with self.assertRaises(deltabox.DaemonUnreachable) as cm:
            deltabox.Client(path).pools()
        self.assertIn(path, str(cm.exception))
        self.assertIsInstance(cm.exception, deltabox.Unavailable)
        self.assertEqual(cm.exception.code, "unavailable")

    def test_address_from_environment(self):
        old = os.environ.get("DELTABOX_ADDRESS")
        os.environ["DELTABOX_ADDRESS"] = "unix:///tmp/x.sock"
        try:
            self.assertEqual(deltabox.Client().address, "/tmp/x.sock")
        finally:
            if old is None:
                del os.environ["DELTABOX_ADDRESS"]
            else:
                os.environ["DELTABOX_ADDRESS"] = old
        self.assertEqual(deltabox.Client("/a.sock").address, "/a.sock")

    def test_tcp_address_needs_a_token(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("DELTABOX_TOKEN")}
        with mock.patch.dict(os.environ, env, clear=True):
            with self.assertRaises(deltabox.InvalidArgument) as cm:
                deltabox.Client("tcp://127.0.0.1:1")
            self.assertIn("needs a token", str(cm.exception))
            with self.assertRaises(deltabox.InvalidArgument):
                deltabox.Client("tcp://127.0.0.1")
            c = deltabox.Client("tcp://127.0.0.1:1", token="t" * 20)
            self.assertNotIn("t" * 20, repr(c.transport))

    def test_every_code_has_its_class(self):
        codes = ["not_found", "invalid_argument", "conflict", "not_modified", "failed_precondition",
                 "unavailable", "permission_denied", "unauthenticated", "resource_exhausted", "data_loss",
                 "not_implemented", "canceled", "deadline_exceeded", "aborted", "out_of_range", "internal",
                 "unknown"]
        for code in codes:
            e = errors.from_api({"code": code, "message": "m"}, 0)
            self.assertEqual(e.code, code)
            self.assertIs(type(e), errors.BY_CODE[code])
            self.assertEqual(e.message, "m")
        self.assertIsInstance(errors.from_api({"code": "new_code", "message": "m"}, 404), deltabox.NotFound)
        self.assertIs(type(errors.from_api({"code": "new_code", "message": "m"}, 0)), deltabox.Unknown)

    def test_post_that_got_no_answer_is_not_sent_twice(self):
        # The daemon reads a POST and goes away without answering: it may have applied it, so
        # the SDK raises instead of sending it again on a new connection.
        path = os.path.join(tempfile.mkdtemp(), "s.sock")
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(path)
        srv.listen(4)
        requests = []

        def serve():
            c, _ = srv.accept()
            requests.append(_read_request(c))
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n[]")
            requests.append(_read_request(c))
            c.close()  # no answer to the POST
            while True:
                try:
                    c, _ = srv.accept()
                except OSError:
                    return
                requests.append(_read_request(c))
                c.close()

        threading.Thread(target=serve, daemon=True).start()
        c = deltabox.Client(path, timeout=5)
        c.pools()
        with self.assertRaises(deltabox.DaemonUnreachable):
            c.transport.json("POST", "/v1/pools", {})
        time.sleep(0.1)
        self.assertEqual(requests, [b"GET", b"POST"])
        c.close()
        srv.close()

    def test_connection_closed_while_idle_is_redialled(self):
        # A server that closes each connection after one answer: the next call (a POST, which
        # is never sent twice) must notice before sending and use a new connection.
        path = os.path.join(tempfile.mkdtemp(), "s.sock")
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(path)
        srv.listen(4)
        requests = []

        def serve():
            for _ in range(2):
                c, _ = srv.accept()
                requests.append(_read_request(c))
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n[]")
                c.close()

        threading.Thread(target=serve, daemon=True).start()
        c = deltabox.Client(path, timeout=5)
        self.assertEqual(c.pools(), [])
        time.sleep(0.1)
        self.assertEqual(c.transport.json("POST", "/v1/pools", {}), [])
        self.assertEqual(requests, [b"GET", b"POST"])
        c.close()
        srv.close()

    def test_backend_builds_a_wheel_of_the_package(self):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_build"))
        import deltabox_build

        out = tempfile.mkdtemp()
        name = deltabox_build.build_wheel(out)
        with zipfile.ZipFile(os.path.join(out, name)) as zf:
            names = zf.namelist()
            record = zf.read("deltabox-0.1.0.dist-info/RECORD").decode()
        for want in ("deltabox/__init__.py", "deltabox/py.typed", "deltabox/sandbox.py"):
            self.assertIn(want, names)
            self.assertIn(want + ",sha256=", record)


if __name__ == "__main__":
    unittest.main()
