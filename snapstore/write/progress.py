"""Progress of a materialization: a tqdm display, the caller's callback, or log lines.

``Snapshot.materialize(progress=...)`` turns its argument into a :class:`Reporter` with
:func:`open_reporter`; the writer, the partition scheduler and the loop that waits on another
job's claim report to it, and :meth:`Stage.write <snapstore.snapshot.Stage.write>` closes it on
every path:

- ``None`` (the default): a :class:`Display` when stderr is a terminal or the code runs in a
  Jupyter kernel, else nothing but log lines;
- ``True``: a :class:`Display` whatever stderr is; ``False``: no display;
- a callable: ``progress(samples, stored_bytes)`` after each block (each partition, for a
  partitioned stage), and no display (the callable is the caller's own display).

Without a display, a job waiting for another job's claim logs a line at INFO every
:data:`WAIT_LOG_SECONDS` seconds saying for whom it waits and how far that job has got.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from ..oldpaths import historic_name
from ..storage.claims import ClaimState, Clock, SystemClock

__all__ = ["Display", "ProgressArg", "Reporter", "interactive", "open_reporter", "tee"]

log = logging.getLogger(historic_name(__name__))

ProgressArg = bool | Callable[[int, int], None] | None
"""What ``materialize(progress=...)`` accepts."""

WAIT_LOG_SECONDS = 30.0
"""Seconds between "still waiting" INFO lines: a long wait shows in a log without filling it."""

REFRESH_SECONDS = 1.0
"""Seconds between redraws when nothing is reported (elapsed time and ETA keep moving while a
slow stage fills a block or a partition runs)."""

MIN_DRAW_SECONDS = 0.1
"""Reports closer together than this are drawn together (a fast stage writes many blocks a
second)."""

# Counts and rates are formatted here (tqdm would write 0 samples as "0.00"); tqdm draws the bar,
# the elapsed time and the ETA, and puts ", " before a non-empty {postfix}.
_SAMPLES_FORMAT = "{desc} [{elapsed}{postfix}]"
_PARTITIONS_FORMAT = (
    "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} partitions [{elapsed}<{remaining}"
    "{postfix}]"
)


def in_jupyter() -> bool:
    """Whether this process is a Jupyter kernel (IPython is not imported to find out)."""
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def interactive(stream: IO[str] | None = None) -> bool:
    """Whether someone watches ``stream`` (default stderr): a terminal, or a Jupyter kernel."""
    stream = stream if stream is not None else sys.stderr
    try:
        tty = stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        tty = False
    return tty or in_jupyter()


def sizeof(num: float, suffix: str = "") -> str:
    """``12.3k``, ``45.1MB``: three significant digits and an SI prefix."""
    for unit in ("", "k", "M", "G", "T"):
        if abs(num) < 999.5:
            return f"{num:.3g}{unit}{suffix}"
        num /= 1000
    return f"{num:.3g}P{suffix}"


def holder_text(state: ClaimState) -> str:
    """The job that holds a claim, and how far it has got when its heartbeat says."""
    if state.samples is None or state.stored_bytes is None:
        return state.describe()
    return (
        f"{state.describe()}, at {state.samples:,} samples "
        f"({sizeof(state.stored_bytes, 'B')} stored)"
    )


class Reporter:
    """Where a materialization reports; this base calls ``callback`` and logs waits.

    Parameters
    ----------
    label : str
        What is materialized (the stage's name), for displays and log lines.
    callback : callable, optional
        ``callback(samples, stored_bytes)`` on each report.
    clock : Clock, optional
        Paces the "still waiting" log lines (tests pass a fake one).
    """

    def __init__(
        self,
        label: str,
        callback: Callable[[int, int], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.label = label
        self.callback = callback
        self.clock: Clock = clock or SystemClock()
        self._wait_logged: float | None = None

    def __call__(self, samples: int, stored_bytes: int) -> None:
        """Samples and stored bytes written so far (by this job)."""
        if self.callback is not None:
            self.callback(samples, stored_bytes)

    def partitions(self, done: int, total: int) -> None:
        """Partitions committed so far, by any job, of ``total``."""

    def waiting(self, text: str | None) -> None:
        """This job waits (``text`` says for what and whom), or no longer does (None).

        The first call of a wait logs nothing (the caller announced the wait); later ones log
        ``text`` at INFO every :data:`WAIT_LOG_SECONDS` seconds.
        """
        now = self.clock.monotonic()
        if text is None:
            self._wait_logged = None
        elif self._wait_logged is None:
            self._wait_logged = now
        elif now - self._wait_logged >= WAIT_LOG_SECONDS:
            self._wait_logged = now
            log.info("snapstore: %s: still %s", self.label, text)

    def finish(self, text: str) -> None:
        """The snapshot was committed without this job writing it: ``text`` says how."""

    def close(self, ok: bool) -> None:
        """The materialization ended, committed (``ok``) or failed. Safe to call twice."""


class Display(Reporter):
    """A tqdm progress display on stderr (a widget in Jupyter), drawn while materializing.

    Shows samples, stored bytes, samples/s, MB/s and elapsed time; for a partitioned stage the
    partitions committed of all, with an ETA; while waiting for another job, for whom and how far
    it has got. Drawn from the first report on (or after :data:`REFRESH_SECONDS`), then redrawn at
    most every :data:`MIN_DRAW_SECONDS` and at least every :data:`REFRESH_SECONDS` by a daemon
    thread. :meth:`close` stops the thread and leaves a final line if the materialization
    succeeded, or clears the display if it failed.

    Parameters
    ----------
    label : str
        What is materialized (the stage's name).
    clock : Clock, optional
        For the waits' pacing (see :class:`Reporter`); the display itself uses real time.
    file : text stream, optional
        Where to draw (default: stderr at each draw).
    """

    def __init__(self, label: str, clock: Clock | None = None, file: IO[str] | None = None):
        super().__init__(label, clock=clock)
        self.file = file
        self._lock = threading.RLock()
        self._start = time.monotonic()
        self._drawn = 0.0
        self._bar: Any = None
        self._samples = self._stored = 0
        self._done = self._initial = 0
        self._total: int | None = None
        self._mode = ""  # of the bar drawn: "samples" or "partitions"
        self._wait: str | None = None
        self._final: str | None = None
        self._closed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._refresh, name="snapstore-progress")
        self._thread.daemon = True
        self._thread.start()

    def __call__(self, samples: int, stored_bytes: int) -> None:
        with self._lock:
            self._samples, self._stored = samples, stored_bytes
            self._draw(force=False)

    def partitions(self, done: int, total: int) -> None:
        with self._lock:
            if self._total is None:
                self._initial = done  # committed before this run: not part of the rate
            self._done, self._total = done, total
            self._draw(force=False)

    def waiting(self, text: str | None) -> None:
        with self._lock:
            if text == self._wait:
                return
            self._wait = text
            self._draw(force=False)

    def finish(self, text: str) -> None:
        with self._lock:
            self._final = text

    def close(self, ok: bool) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            if ok and not self._closed:
                self._draw(force=True)  # the final line, even for a stage that took no time
            self._closed = True
            bar, self._bar = self._bar, None
            if bar is None:
                return
            try:
                if not ok:
                    bar.leave = False  # cleared: the traceback starts on a clean line
                bar.close()
            except Exception:  # not to hide the error being raised, if any
                log.debug("snapstore: could not close the progress display", exc_info=True)

    def _refresh(self) -> None:
        while not self._stop.wait(REFRESH_SECONDS):
            with self._lock:
                if not self._stop.is_set():
                    self._draw(force=True)

    def _draw(self, force: bool) -> None:
        """Create the bar if needed, update it from the state and redraw (lock held)."""
        now = time.monotonic()
        if self._closed or (not force and now - self._drawn < MIN_DRAW_SECONDS):
            return
        self._drawn = now
        mode = "partitions" if self._total is not None else "samples"
        try:
            if self._bar is not None and self._mode != mode:
                self._bar.leave = False  # a partitioned stage reported late: start a bar for it
                self._bar.close()
                self._bar = None
            if self._bar is None:
                self._mode = mode
                self._bar = self._new_bar(mode)
            self._update(self._bar, now - self._start)
            self._bar.refresh()
        except Exception:  # a display must never fail the materialization it shows
            log.warning("snapstore: progress display failed; going on without it", exc_info=True)
            self._closed = True

    def _new_bar(self, mode: str) -> Any:
        from tqdm.auto import tqdm  # the notebook widget in Jupyter, text elsewhere

        desc, postfix = self._texts(time.monotonic() - self._start)
        bar = tqdm(
            total=self._total,
            initial=self._initial,
            desc=desc,
            postfix=postfix,
            smoothing=0,  # average rates: samples/s, MB/s and the ETA agree with each other
            dynamic_ncols=True,  # trimmed to the terminal's width, never wrapped
            file=self.file if self.file is not None else sys.stderr,
            bar_format=_SAMPLES_FORMAT if mode == "samples" else _PARTITIONS_FORMAT,
        )
        # Drawn from the first report on, but timed from the start of the materialization.
        bar.start_t -= time.monotonic() - self._start
        return bar

    def _update(self, bar: Any, elapsed: float) -> None:
        desc, postfix = self._texts(elapsed)
        if self._mode == "partitions":
            bar.n, bar.total = self._done, self._total
        bar.set_description_str(desc, refresh=False)
        bar.set_postfix_str(postfix, refresh=False)

    def _texts(self, elapsed: float) -> tuple[str, str]:
        """The description and the postfix (after the elapsed time) of the bar."""
        counts = f"{sizeof(self._samples)} samples, {sizeof(self._stored, 'B')} stored"
        seconds = max(elapsed, 1e-9)
        rates = (
            f"{sizeof(self._samples / seconds)} samples/s, {sizeof(self._stored / seconds, 'B/s')}"
        )
        if self._mode == "partitions":
            stats = f"{counts}, {rates}" if self._samples else ""
            return self.label, "; ".join(t for t in (stats, self._wait) if t)
        text = self._final or (self._wait if self._samples == 0 else None)
        return f"{self.label}: {text or counts}", "" if text else rates


def tee(*callbacks: Callable[[int, int], None]) -> Callable[[int, int], None]:
    """One progress callback that calls each of ``callbacks`` in turn."""

    def report(samples: int, stored_bytes: int) -> None:
        for callback in callbacks:
            callback(samples, stored_bytes)

    return report


def open_reporter(
    progress: ProgressArg | Reporter, label: str, clock: Clock | None = None
) -> Reporter:
    """The :class:`Reporter` for ``materialize(progress=...)`` (see the module docstring).

    Raises
    ------
    TypeError
        If ``progress`` is neither None, a bool nor a callable.
    """
    if isinstance(progress, Reporter):
        return progress
    if progress is None:
        progress = interactive()
    if progress is True:
        return Display(label, clock)
    if progress is False:
        return Reporter(label, clock=clock)
    if callable(progress):
        return Reporter(label, progress, clock)
    raise TypeError(
        f"progress: expected None (a display when stderr is a terminal or in Jupyter), True, "
        f"False or a callable progress(samples, stored_bytes); found {type(progress).__name__}"
    )
