"""An iterator run on a thread of its own, its items handed over through a bounded queue.

:class:`Handoff` lets a consumer receive finished work (batches) while the next items are being
made: the producer thread runs ``items`` and waits whenever ``depth`` items are ready and not yet
taken, so memory stays bounded by ``depth`` items plus the one being made. An exception raised
by ``items`` reaches the consumer, unchanged, after the items made before it; :meth:`close`
stops the thread (``wake`` unblocks it if it waits inside ``items``).

The consumer's waits for an item are traced as ``wait`` spans (:mod:`snapstore.tracing`,
category ``read``: the readers hand their batches over through a handoff), with the number of
the ``batch`` waited for; taking an item that is ready costs no clock read.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from .. import tracing

__all__ = ["Handoff"]

T = TypeVar("T")


class Handoff(Generic[T]):
    """Iterate ``items`` on a thread named ``name``; iterate the handoff for its items, in order.

    Parameters
    ----------
    items : Iterator
        What to run; closed (if it is a generator) on the producer thread when it stops.
    depth : int
        Most items made ahead of the consumer.
    name : str
        The producer thread's name.
    wake : callable
        Called by :meth:`close` (on the closing thread) to unblock a producer that waits inside
        ``items``, e.g. the close of the source it reads.
    """

    def __init__(
        self, items: Iterator[T], *, depth: int, name: str, wake: Callable[[], None]
    ) -> None:
        if depth < 1:
            raise ValueError(f"Handoff: expected depth >= 1, found {depth}")
        self._items = items
        self._depth = depth
        self._wake = wake
        self._cond = threading.Condition()
        self._queue: collections.deque[T] = collections.deque()
        self._error: BaseException | None = None
        self._done = False
        self._stopped = False
        self._taken = 0  # items taken by the consumer
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for item in self._items:
                with self._cond:
                    while len(self._queue) >= self._depth and not self._stopped:
                        self._cond.wait()
                    if self._stopped:
                        return
                    self._queue.append(item)
                    self._cond.notify_all()
                del item  # the consumer's copy is the only one
        except BaseException as exc:  # handed to the consumer
            with self._cond:
                self._error = exc
        finally:
            close = getattr(self._items, "close", None)
            try:
                if close is not None:
                    close()
            finally:
                with self._cond:
                    self._done = True
                    self._cond.notify_all()

    def __iter__(self) -> Handoff[T]:
        return self

    def __next__(self) -> T:
        with self._cond:
            if not self._queue and not self._done:
                self._wait()
            if self._queue:
                item = self._queue.popleft()
                self._taken += 1
                self._cond.notify_all()
                return item
            if self._error is not None and not self._stopped:
                error, self._error = self._error, None
                raise error
            raise StopIteration

    def _wait(self) -> None:
        """Wait for an item or the end (lock held): the consumer's ``wait`` span."""
        with tracing.span("wait", "read") as recorded:
            if recorded is not None:
                recorded.args["batch"] = self._taken
            while not self._queue and not self._done:
                self._cond.wait()

    @property
    def running(self) -> bool:
        """Whether the producer thread is still alive."""
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop the producer thread and drop the items not taken. Safe to call twice."""
        with self._cond:
            if self._stopped:
                return
            self._stopped = True
            self._queue.clear()
            self._cond.notify_all()
        self._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join()
