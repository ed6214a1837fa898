"""Steps: checkpoint, run, roll back on an exception (and retry), commit on success."""
from __future__ import annotations

import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Dict, Iterator, Optional, Tuple, Type

if TYPE_CHECKING:
    from .sandbox import Sandbox


class Attempt:
    """One attempt of a step, a context manager: checkpoint on entry; on an exception roll
    back to that checkpoint; on success commit. ``checkpoint``, ``rollback_result`` and
    ``commit_result`` are the API's answers."""

    def __init__(self, step: "Step", number: int, last: bool) -> None:
        self.step = step
        self.number = number
        self.last = last
        self.checkpoint: Dict[str, Any] = {}
        self.rollback_result: Optional[Dict[str, Any]] = None
        self.commit_result: Optional[Dict[str, Any]] = None
        self.error: Optional[BaseException] = None

    def __enter__(self) -> "Attempt":
        msg = self.step.message or "step"
        self.checkpoint = self.step.sandbox.checkpoint(f"{msg} (attempt {self.number})")
        return self

    def __exit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException],
                 tb: Optional[TracebackType]) -> bool:
        sb = self.step.sandbox
        if ev is None:
            if self.step.commit:
                self.commit_result = sb.commit()
            self.step.done = True
            return False
        self.error = ev
        self.rollback_result = sb.rollback(self.checkpoint["checkpoint"])
        retryable = isinstance(ev, self.step.retry_on) and isinstance(ev, Exception)
        if self.last or not retryable:
            self.step.done = True
            return False  # the exception goes on
        return True  # swallowed: the step's iterator starts the next attempt


class Step:
    """See ``Sandbox.step``."""

    def __init__(self, sandbox: "Sandbox", message: Optional[str], retries: int, backoff: float,
                 max_backoff: float, retry_on: Tuple[type, ...], commit: bool) -> None:
        if retries < 0:
            raise ValueError("retries must not be negative")
        self.sandbox = sandbox
        self.message = message
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.retry_on = retry_on
        self.commit = commit
        self.done = False
        self.attempts: list = []
        self._single: Optional[Attempt] = None

    def __iter__(self) -> Iterator[Attempt]:
        for n in range(self.retries + 1):
            if n > 0:
                time.sleep(min(self.backoff * (2 ** (n - 1)), self.max_backoff))
            a = Attempt(self, n + 1, n == self.retries)
            self.attempts.append(a)
            yield a
            if self.done:
                return
            if a.error is None:  # the body never entered the attempt
                raise RuntimeError("use each attempt of a step as a context manager: `with attempt:`")

    def __enter__(self) -> Attempt:
        self._single = Attempt(self, 1, True)
        self.attempts.append(self._single)
        return self._single.__enter__()

    def __exit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException],
                 tb: Optional[TracebackType]) -> bool:
        assert self._single is not None
        return self._single.__exit__(et, ev, tb)
