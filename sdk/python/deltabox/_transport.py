"""HTTP over a unix socket (or over TCP with TLS and a bearer token, for a ``tcp://host:port``
address) with the standard library (http.client), one kept-alive connection per thread for
JSON calls and a fresh one for each stream."""
from __future__ import annotations

import http.client
import json
import os
import select
import socket
import ssl
import threading
from typing import Any, Callable, Dict, Iterable, Iterator, Optional, Tuple, Union
from urllib.parse import urlencode

from . import errors

DEFAULT_ADDRESS = "/run/deltabox/deltabox.sock"
"""The daemon's socket when neither an address nor DELTABOX_ADDRESS is given."""

Progress = Callable[[Dict[str, Any]], None]
"""Called with each progress event of a push, fork or restore."""

Body = Union[None, bytes, Iterable[bytes]]


def socket_path(address: str) -> str:
    """The socket path of an address: ``/path``, ``unix:///path`` or ``unix:/path``."""
    if address.startswith("unix://"):
        address = address[len("unix://"):]
    elif address.startswith("unix:"):
        address = address[len("unix:"):]
    if not address.startswith("/") and "://" in address:
        raise errors.InvalidArgument(
            f"address {address!r}: want a unix socket (a path or unix:///path) or tcp://host:port")
    if not address:
        raise errors.InvalidArgument("empty daemon address")
    return address


def tcp_endpoint(address: str) -> Optional[Tuple[str, int]]:
    """(host, port) of a ``tcp://host:port`` address; None for a unix socket."""
    if not address.startswith("tcp://"):
        return None
    rest = address[len("tcp://"):]
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or "/" in rest:
        raise errors.InvalidArgument(f"address {address!r}: want tcp://host:port")
    return host.strip("[]"), int(port)


def _token(token: Optional[str], token_file: Optional[str]) -> Optional[str]:
    token = token or os.environ.get("DELTABOX_TOKEN") or None
    token_file = token_file or os.environ.get("DELTABOX_TOKEN_FILE") or None
    if token or not token_file:
        return token
    try:
        with open(token_file, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#"):
                    return line
    except OSError as e:
        raise errors.InvalidArgument(f"token file {token_file}: {e.strerror}") from None
    raise errors.InvalidArgument(f"token file {token_file} holds no token")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: Optional[float]) -> None:
        super().__init__("deltabox", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if self.timeout is not None:
            s.settimeout(self.timeout)
        try:
            s.connect(self._path)
        except OSError:
            s.close()
            raise
        self.sock = s


# Failures of a kept-alive connection the daemon closed: an idempotent request is sent once
# more on a new connection; any other is not (it may have been applied).
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, http.client.CannotSendRequest)
_IDEMPOTENT = ("GET", "HEAD", "DELETE")


def _alive(conn: http.client.HTTPConnection) -> bool:
    """Whether a kept-alive connection is still open (the peer has not closed it)."""
    sock = conn.sock
    if sock is None:
        return False
    p = select.poll()
    p.register(sock, select.POLLIN)
    # An idle connection has nothing to read: readable means closed (or broken).
    return not p.poll(0)


class Transport:
    """Sends requests to one daemon (or sandbox) API: a unix socket, or ``tcp://host:port``
    over TLS with a bearer token (``token``, else ``DELTABOX_TOKEN``, else the first line of
    ``token_file`` / ``DELTABOX_TOKEN_FILE``), trusting ``ca_file`` / ``DELTABOX_CA_FILE`` (else
    the system's roots), with an optional client certificate (mTLS)."""

    def __init__(self, address: str, timeout: Optional[float] = None, *, token: Optional[str] = None,
                 token_file: Optional[str] = None, ca_file: Optional[str] = None,
                 cert_file: Optional[str] = None, key_file: Optional[str] = None) -> None:
        self.timeout = timeout
        self._local = threading.local()
        self._headers: Dict[str, str] = {}
        self._tcp = tcp_endpoint(address)
        self._ssl: Optional[ssl.SSLContext] = None
        if self._tcp is None:
            self.address = socket_path(address)
            return
        self.address = address
        tok = _token(token, token_file)
        if not tok:
            raise errors.InvalidArgument(
                f"address {address}: a tcp:// daemon needs a token (token=, DELTABOX_TOKEN or DELTABOX_TOKEN_FILE)")
        self._headers["Authorization"] = "Bearer " + tok
        ca_file = ca_file or os.environ.get("DELTABOX_CA_FILE") or None
        try:
            self._ssl = ssl.create_default_context(cafile=ca_file)
            cert_file = cert_file or os.environ.get("DELTABOX_CERT_FILE") or None
            key_file = key_file or os.environ.get("DELTABOX_KEY_FILE") or None
            if cert_file:
                self._ssl.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as e:
            raise errors.InvalidArgument(f"TLS files for {address}: {e}") from None

    def __repr__(self) -> str:
        return f"Transport({self.address!r})"  # never the token

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _unreachable(self, err: OSError) -> errors.DaemonUnreachable:
        return errors.DaemonUnreachable(
            f"cannot reach the DeltaBox daemon at {self.address} (is `deltabox daemon` running? "
            f"set DELTABOX_ADDRESS to its socket or tcp://host:port): {err}")

    def _connect(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection
        if self._tcp is not None:
            conn = http.client.HTTPSConnection(self._tcp[0], self._tcp[1], timeout=self.timeout, context=self._ssl)
        else:
            conn = _UnixConnection(self.address, self.timeout)
        try:
            conn.connect()
        except OSError as e:
            raise self._unreachable(e) from None
        return conn

    @staticmethod
    def url(path: str, query: Optional[Dict[str, Any]] = None) -> str:
        q = {k: ("true" if v is True else v) for k, v in (query or {}).items() if v not in (None, "", False)}
        return path + ("?" + urlencode(q) if q else "")

    def json(self, method: str, path: str, body: Any = None, query: Optional[Dict[str, Any]] = None,
             raw_body: Optional[bytes] = None) -> Any:
        """A JSON request on the thread's kept-alive connection; the decoded JSON answer."""
        data = raw_body if raw_body is not None else (None if body is None else json.dumps(body).encode())
        headers = dict(self._headers)
        if data is not None:
            headers["Content-Type"] = "application/json"
        target = self.url(path, query)
        for attempt in (0, 1):
            conn = getattr(self._local, "conn", None)
            if conn is not None and not _alive(conn):
                conn.close()
                conn = None
            reused = conn is not None
            if conn is None:
                conn = self._connect()
                self._local.conn = conn
            try:
                conn.request(method, target, body=data, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
            except _STALE as e:
                conn.close()
                self._local.conn = None
                if reused and attempt == 0 and method in _IDEMPOTENT:
                    continue
                raise self._unreachable(e) from None
            except OSError as e:
                conn.close()
                self._local.conn = None
                raise self._unreachable(e) from None
            if resp.will_close:
                conn.close()
                self._local.conn = None
            return _decode(resp.status, payload, method, path)
        raise AssertionError("unreachable")

    def open(self, method: str, path: str, query: Optional[Dict[str, Any]] = None, body: Body = None,
             content_type: str = "application/json") -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """A request on a new connection whose answer is streamed; an error answer is raised.
        The caller closes the connection."""
        conn = self._connect()
        try:
            conn.request(method, self.url(path, query), body=body, headers={**self._headers, "Content-Type": content_type},
                         encode_chunked=body is not None and not isinstance(body, (bytes, bytearray)))
            resp = conn.getresponse()
        except OSError as e:
            conn.close()
            raise self._unreachable(e) from None
        if resp.status >= 300:
            payload = resp.read()
            conn.close()
            _decode(resp.status, payload, method, path)
        return conn, resp

    def duplex(self, method: str, path: str, head: bytes, stdin: Iterable[bytes]) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse, threading.Thread, list]:
        """A chunked request whose body is head then stdin, sent by a thread while the answer
        is read (the daemon streams output while input still comes)."""
        conn = self._connect()
        try:
            conn.putrequest(method, path, skip_accept_encoding=True)
            conn.putheader("Content-Type", "application/x-ndjson")
            conn.putheader("Transfer-Encoding", "chunked")
            for k, v in self._headers.items():
                conn.putheader(k, v)
            conn.endheaders()
        except OSError as e:
            conn.close()
            raise self._unreachable(e) from None
        sock = conn.sock
        failure: list = []

        def send() -> None:
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(head), head))
                for chunk in stdin:
                    if chunk:
                        sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sock.sendall(b"0\r\n\r\n")
            except BaseException as e:  # noqa: BLE001 - reported by the reader
                failure.append(e)

        writer = threading.Thread(target=send, name="deltabox-stdin", daemon=True)
        writer.start()
        try:
            resp = conn.getresponse()
        except OSError as e:
            conn.close()
            raise self._unreachable(e) from None
        if resp.status >= 300:
            payload = resp.read()
            conn.close()
            _decode(resp.status, payload, method, path)
        return conn, resp, writer, failure


def _decode(status: int, payload: bytes, method: str, path: str) -> Any:
    if status >= 300:
        try:
            err = json.loads(payload)["error"]
            if not isinstance(err, dict) or not err.get("code"):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            cls = errors.BY_STATUS.get(status, errors.Unknown)
            raise cls(f"daemon answered {status} to {method} {path}: {payload[:500]!r}", status=status) from None
        raise errors.from_api(err, status)
    if not payload:
        return None
    return json.loads(payload)


def json_lines(resp: http.client.HTTPResponse) -> Iterator[dict]:
    """The JSON-lines events of a streamed answer."""
    while True:
        line = resp.readline()
        if not line:
            return
        line = line.strip()
        if line:
            yield json.loads(line)


def stream(transport: Transport, path: str, body: Dict[str, Any], on_progress: Optional[Progress]) -> Dict[str, Any]:
    """Send a push, fork or restore and read its JSON lines: progress to on_progress, then
    the final event (raised if it carries an error)."""
    conn, resp = transport.open("POST", path, body=json.dumps(body).encode())
    try:
        for ev in json_lines(resp):
            if "progress" in ev:
                if on_progress is not None:
                    on_progress(ev["progress"])
                continue
            if "error" in ev:
                raise errors.from_api(ev["error"])
            return ev
    finally:
        conn.close()
    raise errors.Internal(f"the stream of POST {path} ended without a result")
