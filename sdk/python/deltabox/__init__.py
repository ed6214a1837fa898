"""DeltaBox: sandboxes for AI agents with millisecond checkpoints and rollback.

The Python SDK of DeltaBox's API (docs/sdk-python.md), standard library only::

    import deltabox

    client = deltabox.Client()                 # DELTABOX_ADDRESS or /run/deltabox/deltabox.sock
    with client.lease("py") as sb:
        for attempt in sb.step(retries=2):     # checkpoint; roll back and retry on an error
            with attempt:
                sb.exec(["python3", "-c", "print('hello')"], check=True)

Answers are the API's JSON objects as dicts, with the API's field names; errors are the
exception classes of ``deltabox.errors`` (``NotFound``, ``Conflict``, ...).
"""
from __future__ import annotations

import os
from typing import Optional

from ._transport import DEFAULT_ADDRESS, Transport
from .client import Client
from .errors import (Aborted, Canceled, Conflict, DaemonUnreachable, DataLoss, DeadlineExceeded, DeltaBoxError,
                     ExecError, FailedPrecondition, Internal, InvalidArgument, NotFound, NotImplemented_,
                     NotModified, OutOfRange, PermissionDenied, ResourceExhausted, Unauthenticated, Unavailable,
                     Unknown)
from .sandbox import ExecEvent, ExecResult, Sandbox
from .step import Attempt, Step

__version__ = "0.1.0"

SANDBOX_SOCKET = "/.deltabox/run/api.sock"
"""The socket of the in-sandbox API, inside every sandbox."""


def inside(address: Optional[str] = None, timeout: Optional[float] = None) -> Sandbox:
    """The calling sandbox's own API (run inside a sandbox): its checkpoints, rollback, diff,
    state and verify. Commit, exec, files and effects are the host's, not available here."""
    t = Transport(address or os.environ.get("DELTABOX_SANDBOX_ADDRESS") or SANDBOX_SOCKET, timeout)
    return Sandbox(t, "self", base="/v1/self")


__all__ = [
    "Client", "Sandbox", "ExecResult", "ExecEvent", "Step", "Attempt", "inside", "DEFAULT_ADDRESS",
    "SANDBOX_SOCKET", "DeltaBoxError", "NotFound", "InvalidArgument", "Conflict", "NotModified",
    "FailedPrecondition", "PermissionDenied", "Unauthenticated", "ResourceExhausted", "DataLoss",
    "NotImplemented_", "Aborted", "OutOfRange", "Unavailable", "DaemonUnreachable", "Canceled",
    "DeadlineExceeded", "Internal", "Unknown", "ExecError",
]
