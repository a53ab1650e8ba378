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

While a display is drawn on a terminal, log records that the application's handlers write to
that terminal are written above it (:class:`LogsAboveBar`), not through it; and a terminal that
reports no width (0 columns) is drawn to :data:`FALLBACK_COLUMNS`.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import IO, Any

from ..oldpaths import historic_name
from ..storage.claims import ClaimState, Clock, SystemClock

__all__ = [
    "FALLBACK_COLUMNS",
    "Display",
    "LogsAboveBar",
    "ProgressArg",
    "Reporter",
    "interactive",
    "open_reporter",
    "tee",
    "terminal_columns",
]

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

FALLBACK_COLUMNS = 80
"""The width a display is drawn to when the terminal reports none: some CI pseudo-terminals
report 0 columns, where tqdm drew empty lines. 80, as ``shutil.get_terminal_size`` falls back."""

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


def terminal_columns(stream: IO[str] | None) -> int | None:
    """The width to draw a display on ``stream`` to: the terminal's; for a terminal that
    reports none (0 columns), ``$COLUMNS`` if a positive number, else :data:`FALLBACK_COLUMNS`;
    None (nothing is cut) when ``stream`` is not a terminal (a file, a pipe)."""
    try:
        if stream is None or not stream.isatty():
            return None
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):  # no file behind it, or closed
        return None
    if columns <= 0:
        try:
            columns = int(os.environ.get("COLUMNS", ""))
        except ValueError:
            columns = 0
    return columns if columns > 0 else FALLBACK_COLUMNS


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

    def summary(self, text: str, logger: logging.Logger) -> None:
        """Where the materialization's time went (one line, see :mod:`snapstore.write.times`),
        which ``logger`` also logs at INFO; shown by a display when it closes."""

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

    On a terminal the display is as wide as the terminal, or :data:`FALLBACK_COLUMNS` when it
    reports no width (see :func:`terminal_columns`); while it is drawn, log records written to
    the same terminal go above it (see :class:`LogsAboveBar`).

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
        self._summary: tuple[str, logging.Logger] | None = None
        self._closed = False
        self._widget = in_jupyter()  # tqdm.auto draws a notebook widget, sized by the notebook
        self._logs: LogsAboveBar | None = None
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

    def summary(self, text: str, logger: logging.Logger) -> None:
        with self._lock:
            self._summary = (text, logger)

    def close(self, ok: bool) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            try:
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
                if ok:
                    self._print_summary()
            finally:
                self._stop_logs()

    def _print_summary(self) -> None:
        """The summary line under the final one, unless its log record shows on the same
        terminal already (the application logs snapstore's INFO there)."""
        summary, self._summary = self._summary, None
        if summary is None or _logged_to(summary[1], self._stream()):
            return
        try:
            self._stream().write(summary[0] + "\n")
            self._stream().flush()
        except Exception:  # a display must never fail the materialization it shows
            log.debug("snapstore: could not print the summary line", exc_info=True)

    def _stop_logs(self) -> None:
        logs, self._logs = self._logs, None
        if logs is not None:
            logs.stop()

    def _stream(self) -> IO[str]:
        return self.file if self.file is not None else sys.stderr

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
            if self._logs is None and not self._widget:
                self._logs = LogsAboveBar(self._stream())
                self._logs.start()
            self._update(self._bar, now - self._start)
            self._bar.refresh()
        except Exception:  # a display must never fail the materialization it shows
            self._stop_logs()  # the warning below goes where logs went before
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
            # Trimmed to the terminal's width, never wrapped: measured at each draw (in
            # _update) with a fallback, as tqdm's own measure gives 0 or -1 on a terminal
            # that reports no width, and draws nothing then.
            dynamic_ncols=self._widget,
            ncols=None if self._widget else terminal_columns(self._stream()),
            file=self._stream(),
            bar_format=_SAMPLES_FORMAT if mode == "samples" else _PARTITIONS_FORMAT,
        )
        # Drawn from the first report on, but timed from the start of the materialization.
        bar.start_t -= time.monotonic() - self._start
        return bar

    def _update(self, bar: Any, elapsed: float) -> None:
        desc, postfix = self._texts(elapsed)
        if not self._widget:
            bar.ncols = terminal_columns(self._stream())
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


class _AboveBars:
    """A handler's stream while a display is up: each write clears the bars drawn on the same
    terminal, writes, and draws them again (tqdm's external write mode, under its lock)."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        from tqdm import tqdm

        with tqdm.external_write_mode(file=self.stream):
            written = self.stream.write(text)
            self.stream.flush()
        return written

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, isatty...: the stream's
        return getattr(self.stream, name)


def _same_terminal(a: Any, b: Any) -> bool:
    """Whether writes to ``a`` and ``b`` land on the same screen: the same stream, both standard
    streams (mixed on a terminal), or one terminal open twice."""
    std = (sys.stdout, sys.stderr)
    if a is b or (any(a is s for s in std) and any(b is s for s in std)):
        return True
    try:
        return bool(a.isatty() and b.isatty()) and os.path.sameopenfile(a.fileno(), b.fileno())
    except (AttributeError, OSError, ValueError):
        return False


def _logged_to(logger: logging.Logger, stream: IO[str]) -> bool:
    """Whether ``logger``'s INFO records are written to ``stream``'s terminal by a handler
    (of the logger or of one it propagates to)."""
    if not logger.isEnabledFor(logging.INFO):
        return False
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            target = getattr(handler, "stream", None)
            target = getattr(target, "stream", target) if isinstance(target, _AboveBars) else target
            if (
                handler.level <= logging.INFO
                and target is not None
                and _same_terminal(target, stream)
            ):
                return True
        current = current.parent if current.propagate else None
    return False


def _stream_handlers() -> Iterator[logging.StreamHandler[Any]]:
    """Every StreamHandler configured on a logger (the root included)."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    seen: set[int] = set()
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            if isinstance(handler, logging.StreamHandler) and id(handler) not in seen:
                seen.add(id(handler))
                yield handler


class LogsAboveBar:
    """While a display is drawn on ``stream``, log records and warnings go above it, not
    through it.

    The application's handlers that write to the same terminal (and logging's last resort,
    which prints warnings when no handler is configured) get a stream that clears the display,
    writes the record and draws the display again; so do Python warnings printed there by the
    default ``warnings.showwarning`` (a replaced one, such as ``logging.captureWarnings``', is
    left alone). No handler is added: the streams of those already configured are swapped on
    :meth:`start` and put back on :meth:`stop` (their levels, formats and filters stay theirs).
    """

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self._swapped: list[tuple[logging.StreamHandler[Any], Any]] = []
        self._last_resort: tuple[logging.Handler | None, logging.Handler] | None = None
        self._showwarning: tuple[Any, Any] | None = None

    def start(self) -> None:
        """Swap the streams (once; a second call does nothing)."""
        if self._swapped or self._last_resort or self._showwarning:
            return
        self._start_warnings()
        for handler in _stream_handlers():
            target = handler.stream
            if not isinstance(target, _AboveBars) and _same_terminal(target, self.stream):
                handler.setStream(_AboveBars(target))
                self._swapped.append((handler, target))
        last = logging.lastResort
        redirected = isinstance(getattr(last, "stream", None), _AboveBars)  # by another display
        if last is not None and not redirected and _same_terminal(sys.stderr, self.stream):
            above = logging.StreamHandler(_AboveBars(sys.stderr))
            above.setLevel(last.level)
            logging.lastResort = above
            self._last_resort = (last, above)

    def stop(self) -> None:
        """Put the streams back (those not changed meanwhile by someone else)."""
        swapped, self._swapped = self._swapped, []
        for handler, target in swapped:
            if isinstance(handler.stream, _AboveBars):
                handler.setStream(target)
        if self._last_resort is not None:
            last, above = self._last_resort
            if logging.lastResort is above:
                logging.lastResort = last
            self._last_resort = None
        if self._showwarning is not None:
            original, above = self._showwarning
            if warnings.showwarning is above:
                warnings.showwarning = original
            self._showwarning = None

    def _start_warnings(self) -> None:
        original = warnings.showwarning
        if original is not _SHOWWARNING:
            return  # the application's, or logging's: it decides where warnings go

        def showwarning(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: Any = None,
            line: str | None = None,
        ) -> None:
            target = sys.stderr if file is None else file
            if _same_terminal(target, self.stream):
                target = _AboveBars(target)
            original(message, category, filename, lineno, target, line)

        warnings.showwarning = showwarning
        self._showwarning = (original, showwarning)


# Python's own showwarning (which catch_warnings puts back while it records).
_SHOWWARNING = getattr(warnings, "_showwarning_orig", warnings.showwarning)


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
