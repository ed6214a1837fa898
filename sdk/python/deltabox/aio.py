"""An asyncio face of the SDK: the same calls, awaitable.

Each call runs the synchronous SDK in a worker thread (``asyncio.to_thread``), so the event
loop is never blocked on the socket; names, arguments and answers are those of ``Client`` and
``Sandbox``::

    from deltabox.aio import AsyncClient

    async with AsyncClient() as client:
        async with await client.lease("py") as sb:
            async for attempt in sb.step(retries=2):
                async with attempt:
                    await sb.exec(["make", "test"], check=True)
"""
from __future__ import annotations

import asyncio
import functools
from types import TracebackType
from typing import Any, AsyncIterator, Optional, Tuple, Type

from .client import Client
from .sandbox import Sandbox


def _wrap(value: Any) -> Any:
    if isinstance(value, Sandbox):
        return AsyncSandbox(value)
    if isinstance(value, list) and value and isinstance(value[0], Sandbox):
        return [AsyncSandbox(s) for s in value]
    return value


class _Async:
    _sync: Any

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._sync, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        async def call(*args: Any, **kwargs: Any) -> Any:
            return _wrap(await asyncio.to_thread(attr, *args, **kwargs))

        return call


class AsyncClient(_Async):
    """``Client``, awaitable: ``await client.lease("py")`` answers an ``AsyncSandbox``."""

    def __init__(self, address: Optional[str] = None, timeout: Optional[float] = None, **tls: Any) -> None:
        self._sync = Client(address, timeout, **tls)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._sync.close()


class AsyncSandbox(_Async):
    """``Sandbox``, awaitable; ``async with`` releases it; ``step()`` is ``async for``."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sync = sandbox

    @property
    def id(self) -> str:
        return self._sync.id

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self._sync.released:
            await asyncio.to_thread(self._sync.release)

    def step(self, message: Optional[str] = None, retries: int = 0, backoff: float = 0.5,
             max_backoff: float = 30.0, retry_on: Tuple[type, ...] = (Exception,),
             commit: bool = True) -> "AsyncStep":
        """``Sandbox.step`` for ``async for attempt in sb.step(...): async with attempt: ...``."""
        return AsyncStep(self._sync.step(message, retries, backoff, max_backoff, retry_on, commit))


class AsyncAttempt:
    """One attempt of an ``AsyncStep`` (see ``deltabox.step.Attempt``)."""

    def __init__(self, attempt: Any) -> None:
        self.attempt = attempt

    @property
    def number(self) -> int:
        return int(self.attempt.number)

    async def __aenter__(self) -> "AsyncAttempt":
        await asyncio.to_thread(self.attempt.__enter__)
        return self

    async def __aexit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException],
                        tb: Optional[TracebackType]) -> bool:
        return bool(await asyncio.to_thread(self.attempt.__exit__, et, ev, tb))


class AsyncStep:
    """``deltabox.step.Step`` with ``async for``; the backoff sleeps without blocking."""

    def __init__(self, step: Any) -> None:
        self.step = step

    @property
    def attempts(self) -> list:
        return self.step.attempts

    async def __aiter__(self) -> AsyncIterator[AsyncAttempt]:
        from .step import Attempt

        s = self.step
        for n in range(s.retries + 1):
            if n > 0:
                await asyncio.sleep(min(s.backoff * (2 ** (n - 1)), s.max_backoff))
            a = Attempt(s, n + 1, n == s.retries)
            s.attempts.append(a)
            yield AsyncAttempt(a)
            if s.done:
                return
            if a.error is None:
                raise RuntimeError("use each attempt of a step as a context manager: `async with attempt:`")


__all__ = ["AsyncClient", "AsyncSandbox", "AsyncStep", "AsyncAttempt"]
