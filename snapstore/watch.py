"""Where a training loop's time goes, epoch by epoch: :func:`watch` wraps what the loop
iterates (a DataLoader), records the loop's waits for batches and its steps, and rolls the
epoch's trace, DataLoader workers included, into a :class:`snapstore.verdict.Verdict`.

>>> for batch in snapstore.watch.watch(loader, report=print):         # doctest: +SKIP
...     step(batch)
input-bound   62%: 18.40 s of 29.70 s waiting for batches (1 training loop(s)); ...
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Generic, TypeVar

from . import tracing
from .verdict import Verdict, analyze

__all__ = ["Watch", "watch"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def _usable_cores() -> int:
    """CPUs this process may run on: the loop's workers run on the same ones."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _report(verdict: Verdict) -> None:
    """The default report: the INFO log, and stderr when it is a terminal."""
    text = verdict.text()
    log.info("where the time went:\n%s", text)
    if sys.stderr.isatty():
        print(text, file=sys.stderr)


class Watch(Generic[T]):
    """Batches of ``batches``, the loop's waits recorded; the verdict after each epoch.

    Made by :func:`watch`; iterate it once per epoch. After each epoch :attr:`verdict` holds
    the epoch's :class:`~snapstore.verdict.Verdict` and :attr:`path` its trace.
    """

    def __init__(
        self,
        batches: Iterable[T],
        path: str | os.PathLike[str] | None = None,
        *,
        bandwidth: float | None = None,
        report: Callable[[Verdict], object] | None = _report,
    ) -> None:
        self.batches = batches
        self.path: Path | None = None if path is None else Path(path)
        self.bandwidth = bandwidth
        self.report = report
        self.verdict: Verdict | None = None
        self._given = path is not None
        self._epochs = 0
        self._folders: list[Path] = []  # temporary folders of the epochs' traces

    def __iter__(self) -> Iterator[T]:
        block = None
        outer = os.environ.get(tracing.ENV) if tracing.enabled() else None
        if outer is None:  # off (or on with no path to read back): a trace of the epoch's own
            self._epochs += 1
            if not self._given:
                # A folder per epoch; the previous epoch's goes once this one has its verdict,
                # so the one the last verdict names is kept, and no more.
                self._folders.append(Path(tempfile.mkdtemp(prefix="snapstore-trace-")))
                self.path = self._folders[-1] / f"epoch-{self._epochs}.json"
            assert self.path is not None
            block = tracing.trace(self.path)
            block.__enter__()
        else:
            self.path = Path(outer)
        start = tracing.now()
        batch, failed = 0, False
        try:
            iterator = iter(self.batches)  # a DataLoader starts its workers here: they record
            while True:
                asked = tracing.now()
                try:
                    item = next(iterator)
                except StopIteration:
                    break
                got = tracing.now()
                tracing.complete("wait", "train", asked, got, batch=batch)
                yield item
                tracing.complete("step", "train", got, tracing.now(), batch=batch)
                batch += 1
        except GeneratorExit:  # the loop stopped early (break): a verdict of what it did
            raise
        except BaseException:  # the loader or the loop failed: no verdict to mask the error
            failed = True
            raise
        finally:
            end = tracing.now()
            tracing.complete("epoch", "train", start, end, batches=batch)
            self._finish(block, start, end, failed)

    def _finish(
        self, block: tracing.Tracing | None, start: float, end: float, failed: bool
    ) -> None:
        assert self.path is not None
        if block is not None:
            block.__exit__(None, None, None)  # flushes and merges this epoch's run
        else:
            tracing.flush()
            tracing.merge(self.path)
        if failed:
            return
        self.verdict = analyze(
            self.path, bandwidth=self.bandwidth, cpus=_usable_cores(), start=start, end=end
        )
        while len(self._folders) > 1:
            shutil.rmtree(self._folders.pop(0), ignore_errors=True)
        if self.report is not None:
            self.report(self.verdict)


def watch(
    batches: Iterable[T],
    path: str | os.PathLike[str] | None = None,
    *,
    bandwidth: float | None = None,
    report: Callable[[Verdict], object] | None = _report,
) -> Watch[T]:
    """Iterate ``batches`` (a DataLoader) recording where the time goes; a verdict per epoch.

    The training loop's waits for each batch (``wait`` spans, category ``train``) and its
    steps between batches are recorded in this process; snapstore's readers, in DataLoader
    workers too, record theirs. If recording is off, each epoch turns it on for its duration,
    into ``path`` (default: a new temporary directory): workers started during the epoch record
    (a DataLoader with ``persistent_workers=True`` starts them at its first epoch: turn
    recording on before it, with ``$SNAPSTORE_TRACE`` or a ``snapstore.trace`` block, for them
    to record in every epoch). At the end of each epoch the verdict over this process and the
    workers (:func:`snapstore.verdict.analyze`) is kept in :attr:`Watch.verdict` and passed to
    ``report``.

    Parameters
    ----------
    batches : iterable
        What the training loop iterates: a DataLoader over a
        :class:`snapstore.torch.SnapshotIterableDataset`, a :class:`snapstore.BatchReader`...
    path : str or PathLike, optional
        Where to write each epoch's trace when recording is off (each epoch overwrites it).
        Default: a new temporary folder per epoch, the previous epoch's removed once the next
        one has its verdict (the last one stays, for the verdict names it).
    bandwidth : float, optional
        As for :func:`snapstore.verdict.analyze` (whose ``cpus`` are this process's).
    report : callable, optional
        Called with each epoch's verdict. Default: log it at INFO on ``snapstore.watch``
        and print it to stderr when that is a terminal; None: keep it in ``verdict`` only.

    Examples
    --------
    >>> loader = DataLoader(dataset, batch_size=None, num_workers=4)    # doctest: +SKIP
    >>> watched = snapstore.watch.watch(loader, report=print)           # doctest: +SKIP
    >>> for epoch in range(3):                                          # doctest: +SKIP
    ...     dataset.set_epoch(epoch)
    ...     for batch in watched:
    ...         step(batch)
    >>> watched.verdict.bottleneck                                      # doctest: +SKIP
    'step'
    """
    return Watch(batches, path, bandwidth=bandwidth, report=report)
