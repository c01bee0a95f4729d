"""One generic async wrapper: a synchronous store core, run in one worker thread at a time.

A backend written against a synchronous driver (sqlite-utils) implements each
method once, synchronously; its async face is a class that lists each method as
``name = in_store_thread(Core.name)``. Every call then runs in a worker thread,
one at a time (one writer), so the event loop never blocks on disk. mypy checks
such a class against the ``Store`` protocol like any other.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, Self, TypeVar, overload

import anyio

P = ParamSpec("P")
T = TypeVar("T")


class StoreCore(Protocol):
    """What a synchronous core offers the wrapper besides its own methods."""

    def close(self) -> None: ...


# Covariant: a store over a core subclass (SqliteCore) binds methods defined on its parts (Inbox, ...).
CoreT = TypeVar("CoreT", bound=StoreCore, covariant=True)


class ThreadedStore(Generic[CoreT]):
    """The async face of ``core``; subclasses list the core's methods with ``in_store_thread``."""

    def __init__(self, core: CoreT) -> None:
        self.core = core
        self._limiter = anyio.CapacityLimiter(1)

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` in the store's thread, after every call queued before it."""
        return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs), limiter=self._limiter)

    async def close(self) -> None:
        await self.run(self.core.close)


class in_store_thread(Generic[CoreT, P, T]):
    """A core method, as a coroutine of the wrapper that runs it in the store's thread."""

    def __init__(self, method: Callable[Concatenate[CoreT, P], T]) -> None:
        self.method = method
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, store: None, owner: type[Any]) -> Self: ...

    @overload
    def __get__(
        self, store: ThreadedStore[CoreT], owner: type[Any]
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...

    def __get__(self, store: ThreadedStore[CoreT] | None, owner: type[Any]) -> Any:
        if store is None:
            return self
        # Looked up on the core by name, so a core subclass's override is the one that runs.
        bound: Callable[P, T] = getattr(store.core, self.method.__name__)

        async def call(*args: P.args, **kwargs: P.kwargs) -> T:
            return await store.run(bound, *args, **kwargs)

        call.__doc__ = self.__doc__
        return call
