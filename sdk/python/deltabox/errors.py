"""Exceptions of the DeltaBox SDK: one class per API error code (docs/api.md#errors).

Branch on the class (or on ``code``), never on the message::

    try:
        sb.patch_state(ops, if_seq=seq)
    except deltabox.Conflict:
        ...  # the document moved past seq: read it again
"""
from __future__ import annotations

from typing import Dict, Optional, Type


class DeltaBoxError(Exception):
    """An error answered by the daemon (or raised on the way to it).

    ``code`` is the API's stable code word (``"not_found"``), ``message`` the daemon's text,
    ``status`` the HTTP status (0 inside a stream, where the status line was 200).
    """

    code = "unknown"

    def __init__(self, message: str, code: Optional[str] = None, status: int = 0) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.status = status

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class NotFound(DeltaBoxError):
    """No such sandbox, pool, checkpoint, effect or snapshot (404)."""
    code = "not_found"


class InvalidArgument(DeltaBoxError):
    """A malformed request, name, env entry, state patch or policy (400)."""
    code = "invalid_argument"


class Conflict(DeltaBoxError):
    """Already exists, or the state moved past ``if_seq`` (409)."""
    code = "conflict"


class NotModified(DeltaBoxError):
    """Nothing to change (409)."""
    code = "not_modified"


class FailedPrecondition(DeltaBoxError):
    """Not in a state that allows it: rollback past the commit point, failed effects (412)."""
    code = "failed_precondition"


class PermissionDenied(DeltaBoxError):
    """Refused (403)."""
    code = "permission_denied"


class Unauthenticated(DeltaBoxError):
    """No or wrong credentials (401)."""
    code = "unauthenticated"


class ResourceExhausted(DeltaBoxError):
    """A disk, quota or request limit is full; retry later (429)."""
    code = "resource_exhausted"


class DataLoss(DeltaBoxError):
    """A checkpoint pack or blob failed its digest (500)."""
    code = "data_loss"


class NotImplemented_(DeltaBoxError):
    """Not implemented (501)."""
    code = "not_implemented"


class Aborted(DeltaBoxError):
    """Aborted (409)."""
    code = "aborted"


class OutOfRange(DeltaBoxError):
    """Out of range (400)."""
    code = "out_of_range"


class Unavailable(DeltaBoxError):
    """containerd, the object store or the daemon cannot be reached; the pool is at its max (503)."""
    code = "unavailable"


class DaemonUnreachable(Unavailable):
    """Nothing answers on the socket: the message names it."""


class Canceled(DeltaBoxError):
    """The daemon gave up the request (499)."""
    code = "canceled"


class DeadlineExceeded(DeltaBoxError):
    """Past a deadline (504)."""
    code = "deadline_exceeded"


class Internal(DeltaBoxError):
    """A bug or an unexpected failure in the daemon (500)."""
    code = "internal"


class Unknown(DeltaBoxError):
    """An error of no known class (500)."""
    code = "unknown"


class ExecError(DeltaBoxError):
    """Raised by ``Sandbox.run`` (``check=True``) when a command exits non-zero."""
    code = "exec_failed"

    def __init__(self, message: str, result: "object") -> None:
        super().__init__(message)
        self.result = result


BY_CODE: Dict[str, Type[DeltaBoxError]] = {
    c.code: c
    for c in (NotFound, InvalidArgument, Conflict, NotModified, FailedPrecondition, PermissionDenied,
              Unauthenticated, ResourceExhausted, DataLoss, NotImplemented_, Aborted, OutOfRange,
              Unavailable, Canceled, DeadlineExceeded, Internal, Unknown)
}

# The class of an HTTP status, for an answer whose code this SDK does not know.
BY_STATUS: Dict[int, Type[DeltaBoxError]] = {
    400: InvalidArgument, 401: Unauthenticated, 403: PermissionDenied, 404: NotFound, 409: Conflict,
    412: FailedPrecondition, 429: ResourceExhausted, 499: Canceled, 501: NotImplemented_,
    503: Unavailable, 504: DeadlineExceeded, 500: Internal,
}


def from_api(err: dict, status: int = 0) -> DeltaBoxError:
    """The exception for an API error object ``{"code": ..., "message": ...}``."""
    code = str(err.get("code", ""))
    message = str(err.get("message", ""))
    cls = BY_CODE.get(code) or BY_STATUS.get(status) or Unknown
    return cls(message, code=code or cls.code, status=status)
