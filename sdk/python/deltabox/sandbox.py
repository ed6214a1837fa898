"""A leased sandbox: exec, files, checkpoints, rollback, commit, diff, state, effects,
snapshots and fork."""
from __future__ import annotations

import base64
import io
import json
import os
import tarfile
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union
from urllib.parse import quote

from . import errors
from ._transport import Progress, Transport, json_lines, stream

Output = Callable[[bytes], None]
Stdin = Union[None, bytes, str, IO[bytes], Iterable[bytes]]


@dataclass
class ExecResult:
    """The outcome of an exec: ``exit`` is the API's ExitStatus object; ``stdout`` and
    ``stderr`` hold the output unless it was only streamed (``capture=False``)."""

    exit: Dict[str, Any]
    stdout: bytes = b""
    stderr: bytes = b""

    @property
    def code(self) -> int:
        """The exit code (128+N when killed by signal N; 127/126 when it did not start)."""
        return int(self.exit.get("code", 0))

    @property
    def ok(self) -> bool:
        return self.code == 0

    @property
    def text(self) -> str:
        """stdout as text (UTF-8, undecodable bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")


@dataclass
class ExecEvent:
    """One event of ``Sandbox.exec_iter``: ``kind`` is "stdout", "stderr" or "exit"."""

    kind: str
    data: bytes = b""
    exit: Dict[str, Any] = field(default_factory=dict)


def _chunks(stdin: Stdin) -> Iterable[bytes]:
    if isinstance(stdin, str):
        return [stdin.encode()]
    if isinstance(stdin, (bytes, bytearray)):
        return [bytes(stdin)]
    read = getattr(stdin, "read", None)
    if read is not None:
        return iter(lambda: read(64 << 10), b"")
    return stdin  # type: ignore[return-value]


class Sandbox:
    """A handle on one sandbox. ``id`` is its id; ``info`` the API's Sandbox (or Lease)
    object it was made from. As a context manager it releases the sandbox at the end."""

    def __init__(self, transport: Transport, id: str, info: Optional[Dict[str, Any]] = None,
                 base: Optional[str] = None) -> None:
        self.transport = transport
        self.id = id
        self.info: Dict[str, Any] = info or {}
        self.base = base or "/v1/sandboxes/" + quote(id, safe="")
        self.released = False

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r})"

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.released:
            self.release()

    def _json(self, method: str, rest: str, body: Any = None, query: Optional[Dict[str, Any]] = None) -> Any:
        return self.transport.json(method, self.base + rest, body, query)

    # --- lifecycle

    def refresh(self) -> Dict[str, Any]:
        """Fetch the sandbox's info again."""
        self.info = self._json("GET", "")
        return self.info

    def release(self) -> None:
        """Release the sandbox: it is destroyed and its held effects are dropped."""
        self._json("POST", "/release", {})
        self.released = True

    # --- exec

    def exec_iter(self, argv: Union[str, List[str]], *, stdin: Stdin = None, env: Optional[List[str]] = None,
                  workdir: Optional[str] = None, user: Optional[str] = None, timeout: Optional[float] = None,
                  output_cap: Optional[int] = None, tag: Optional[str] = None,
                  via: Optional[str] = None) -> Iterator[ExecEvent]:
        """Run a command and yield its output as it comes, then one "exit" event.

        ``argv`` is a list, or a string run with ``sh -c``. ``stdin`` (bytes, str, a binary
        file or an iterable of bytes) is sent while the output streams back. ``timeout`` is
        in seconds. A command that cannot be run raises; one that runs and fails does not
        (look at the exit event's ``code``).
        """
        req: Dict[str, Any] = {"argv": ["sh", "-c", argv] if isinstance(argv, str) else list(argv)}
        for k, v in (("env", env), ("workdir", workdir), ("user", user), ("output_cap", output_cap),
                     ("tag", tag), ("via", via)):
            if v:
                req[k] = v
        if timeout:
            req["timeout_ms"] = timeout * 1e3
        if stdin is not None:
            req["stdin"] = True
        head = json.dumps(req).encode() + b"\n"
        path = self.base + "/exec"
        failure: List[BaseException] = []
        if stdin is None:
            conn, resp = self.transport.open("POST", path, body=head, content_type="application/x-ndjson")
        else:
            conn, resp, _, failure = self.transport.duplex("POST", path, head, _chunks(stdin))
        try:
            for ev in json_lines(resp):
                if "o" in ev:
                    yield ExecEvent("stdout", base64.b64decode(ev["o"]))
                if "e" in ev:
                    yield ExecEvent("stderr", base64.b64decode(ev["e"]))
                if "error" in ev:
                    raise errors.from_api(ev["error"])
                if "exit" in ev:
                    yield ExecEvent("exit", exit=ev["exit"])
                    return
        finally:
            conn.close()
        cause = f" (sending stdin failed: {failure[0]})" if failure else ""
        raise errors.Unavailable(f"the exec stream of {self.id} ended without an exit status{cause}")

    def exec(self, argv: Union[str, List[str]], *, stdin: Stdin = None, on_stdout: Optional[Output] = None,
             on_stderr: Optional[Output] = None, capture: bool = True, check: bool = False,
             **opts: Any) -> ExecResult:
        """Run a command to its end (see ``exec_iter`` for the options). ``on_stdout`` and
        ``on_stderr`` get the output as it comes; with ``capture`` it is kept in the result
        too. With ``check`` a non-zero exit raises ``ExecError``."""
        out: List[bytes] = []
        err: List[bytes] = []
        exit_status: Dict[str, Any] = {}
        for ev in self.exec_iter(argv, stdin=stdin, **opts):
            if ev.kind == "stdout":
                if on_stdout:
                    on_stdout(ev.data)
                if capture:
                    out.append(ev.data)
            elif ev.kind == "stderr":
                if on_stderr:
                    on_stderr(ev.data)
                if capture:
                    err.append(ev.data)
            else:
                exit_status = ev.exit
        res = ExecResult(exit_status, b"".join(out), b"".join(err))
        if check and not res.ok:
            raise errors.ExecError(f"{argv!r} in {self.id} exited {res.code}: {res.stderr[-500:]!r}", res)
        return res

    # --- files

    def copy_to(self, dest: str, tar_stream: Union[bytes, IO[bytes]]) -> Dict[str, Any]:
        """Extract a tar stream at ``dest`` in the sandbox, docker-cp style (an existing
        directory receives the entries; otherwise the top-level entry is renamed to dest)."""
        body = tar_stream if isinstance(tar_stream, (bytes, bytearray)) else _chunks(tar_stream)
        conn, resp = self.transport.open("PUT", self.base + "/files", {"path": dest}, body, "application/x-tar")
        try:
            return json.loads(resp.read())
        finally:
            conn.close()

    def copy_from(self, src: str, out: Optional[IO[bytes]] = None) -> bytes:
        """A tar stream of ``src`` in the sandbox: returned, or written to ``out``."""
        conn, resp = self.transport.open("GET", self.base + "/files", {"path": src})
        try:
            if out is None:
                return resp.read()
            while True:
                chunk = resp.read(64 << 10)
                if not chunk:
                    return b""
                out.write(chunk)
        finally:
            conn.close()

    def put_file(self, dest: str, data: Union[bytes, str], mode: int = 0o644) -> Dict[str, Any]:
        """Write one file at ``dest`` (its parent must exist)."""
        raw = data.encode() if isinstance(data, str) else data
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
            ti = tarfile.TarInfo(os.path.basename(dest.rstrip("/")) or "file")
            ti.size, ti.mode = len(raw), mode
            tf.addfile(ti, io.BytesIO(raw))
        return self.copy_to(dest, buf.getvalue())

    def get_file(self, path: str) -> bytes:
        """The contents of one regular file in the sandbox."""
        with tarfile.open(fileobj=io.BytesIO(self.copy_from(path)), mode="r:") as tf:
            for m in tf:
                if m.isfile():
                    f = tf.extractfile(m)
                    return f.read() if f else b""
        raise errors.InvalidArgument(f"{path} in {self.id} is not a regular file")

    def put(self, local: str, dest: str) -> Dict[str, Any]:
        """Copy a local file or tree to ``dest`` in the sandbox (docker cp semantics)."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
            tf.add(local, arcname=os.path.basename(os.path.normpath(local)))
        return self.copy_to(dest, buf.getvalue())

    def get(self, src: str, local_dir: str) -> List[str]:
        """Copy a file or tree of the sandbox into the local directory ``local_dir``; the
        names extracted. Entries that would land outside local_dir are refused."""
        with tarfile.open(fileobj=io.BytesIO(self.copy_from(src)), mode="r:") as tf:
            members = tf.getmembers()
            root = os.path.realpath(local_dir)
            for m in members:
                target = os.path.realpath(os.path.join(root, m.name))
                if os.path.isabs(m.name) or not (target == root or target.startswith(root + os.sep)) \
                        or m.issym() or m.islnk() or m.isdev():
                    if m.issym() and not os.path.isabs(m.linkname) and ".." not in m.linkname.split("/"):
                        continue
                    raise errors.InvalidArgument(f"refusing tar entry {m.name!r} from {self.id}")
            if hasattr(tarfile, "data_filter"):
                tf.extractall(root, members, filter="data")
            else:  # Python < 3.9.17 / 3.10.12 / 3.11.4: checked above
                tf.extractall(root, members)
            return [m.name for m in members]

    # --- checkpoints

    def checkpoint(self, message: Optional[str] = None, level: Optional[str] = None,
                   processes: Optional[bool] = None, name: Optional[str] = None, pin: bool = False,
                   async_: bool = False) -> Dict[str, Any]:
        """Take a checkpoint (level "l1" by default, "l2", "l3"). ``processes`` keeps the
        sandbox's processes too, as templates a rollback starts copies of (default: the
        pool's checkpoint_processes); ``name`` is a reference besides its ID, ``pin`` keeps
        retention from ever dropping it. ``async_`` returns once the sandbox runs again: the
        checkpoint becomes durable in the background and later calls on the sandbox wait
        for it."""
        body: Dict[str, Any] = {k: v for k, v in (("message", message), ("level", level), ("name", name)) if v}
        if processes is not None:
            body["processes"] = processes
        if pin:
            body["pin"] = True
        if async_:
            body["async"] = True
        return self._json("POST", "/checkpoints", body)

    def checkpoints(self) -> List[Dict[str, Any]]:
        return self._json("GET", "/checkpoints")

    def checkpoint_info(self, ckpt: str) -> Dict[str, Any]:
        return self._json("GET", "/checkpoints/" + quote(ckpt, safe=""))

    def rollback(self, to: Optional[str] = None, force: bool = False) -> Dict[str, Any]:
        """Put files, state and held effects back as they were at checkpoint ``to`` (default
        the latest); past the commit point only with ``force``."""
        body: Dict[str, Any] = {}
        if to:
            body["to"] = to
        if force:
            body["force"] = True
        return self._json("POST", "/rollback", body)

    def commit(self) -> Dict[str, Any]:
        """Send the held effects and make the latest checkpoint the commit point."""
        return self._json("POST", "/commit", {})

    def diff(self, from_: Optional[str] = None, to: Optional[str] = None) -> Dict[str, Any]:
        """Files, state ops and effects between checkpoint ``from_`` (default the latest) and
        ``to`` (default now)."""
        return self._json("GET", "/diff", query={"from": from_, "to": to})

    def verify(self, checkpoint: Optional[str] = None) -> Dict[str, Any]:
        return self._json("GET", "/verify", query={"checkpoint": checkpoint})

    # --- state

    def state(self, pointer: Optional[str] = None) -> Any:
        """The state document, or the value at an RFC 6901 pointer."""
        return self._json("GET", "/state", query={"pointer": pointer})

    def patch_state(self, ops: Union[Dict[str, Any], List[Dict[str, Any]]], if_seq: Optional[int] = None) -> Dict[str, Any]:
        """Apply RFC 6902 ops (plus "append"), all or none; with ``if_seq`` only if the
        document is still at that seq (else ``Conflict``). Answers ``{"seq", "applied"}``."""
        q = {"if_seq": str(if_seq)} if if_seq is not None else None
        return self.transport.json("POST", self.base + "/state", query=q, raw_body=json.dumps(ops).encode())

    def state_log(self, from_: Optional[int] = None, to: Optional[int] = None) -> List[Dict[str, Any]]:
        """The logged state ops with their inverses."""
        return self._json("GET", "/state/log", query={"from": from_, "to": to})

    # --- effects

    def effects(self, status: Optional[str] = None) -> List[Dict[str, Any]]:
        """The outbound requests the egress proxy saw (held, released, dropped, failed, ...)."""
        return self._json("GET", "/effects", query={"status": status})

    def effect(self, effect: str) -> Dict[str, Any]:
        return self._json("GET", "/effects/" + quote(effect, safe=""))

    def retry_effects(self, effects: Optional[List[str]] = None) -> Dict[str, Any]:
        """Send failed effects again (all failed ones by default)."""
        return self._json("POST", "/effects/retry", {"effects": list(effects or [])})

    def abandon_effect(self, effect: str) -> Dict[str, Any]:
        return self._json("POST", f"/effects/{quote(effect, safe='')}/abandon", {})

    # --- snapshots

    def snapshot(self, to: Optional[str] = None, on_progress: Optional[Progress] = None) -> Dict[str, Any]:
        """Take an L3 checkpoint and push it to an object store; the Snapshot."""
        return stream(self.transport, self.base + "/snapshots", {"to": to} if to else {}, on_progress)["snapshot"]

    def fork(self, count: int = 1, to: Optional[str] = None, keep_snapshot: bool = False,
             on_progress: Optional[Progress] = None) -> List["Sandbox"]:
        """Push a snapshot and restore it ``count`` times; the new leased sandboxes."""
        body: Dict[str, Any] = {"count": count}
        if to:
            body["to"] = to
        if keep_snapshot:
            body["keep_snapshot"] = True
        final = stream(self.transport, self.base + "/fork", body, on_progress)
        return [Sandbox(self.transport, x["sandbox"], x) for x in final.get("leases") or []]

    # --- steps

    def step(self, message: Optional[str] = None, retries: int = 0, backoff: float = 0.5,
             max_backoff: float = 30.0, retry_on: Tuple[type, ...] = (Exception,), commit: bool = True) -> "Step":
        """An agent step with a save game: checkpoint on entry, roll back on an exception,
        commit on success. ``with sb.step(): ...`` runs one attempt (the exception goes on
        after the rollback). With retries, iterate::

            for attempt in sb.step(retries=2):
                with attempt:
                    do_the_step()

        Each failed attempt is rolled back (its files, state and held effects are gone) and
        the next starts after ``backoff * 2**n`` seconds (at most ``max_backoff``); when the
        last fails its exception is raised. ``run_step(fn)`` does the same for a function.
        """
        from .step import Step

        return Step(self, message, retries, backoff, max_backoff, retry_on, commit)

    def run_step(self, fn: Callable[[int], Any], **opts: Any) -> Any:
        """Run ``fn(attempt_number)`` as a step (see ``step``); its result."""
        result = None
        for attempt in self.step(**opts):
            with attempt:
                result = fn(attempt.number)
        return result
