"""Tests of the SDK that need no daemon: addresses, error mapping, the build backend."""
import os
import sys
import tempfile
import unittest
import zipfile

try:  # the installed package, or the source tree
    import deltabox
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import deltabox
from deltabox import errors  # noqa: E402


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

    def test_tcp_address_is_refused(self):
        with self.assertRaises(deltabox.InvalidArgument):
            deltabox.Client("tcp://127.0.0.1:1")

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
