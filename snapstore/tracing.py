"""Traces of what snapstore does, as Chrome trace events that Perfetto and chrome://tracing open.

Recording is off unless ``$SNAPSTORE_TRACE`` names a file or a ``with snapstore.trace(path):``
block runs. Off, :func:`span` returns one shared no-op context manager: a global read and a
call, nothing recorded (``benchmarks/bench_trace.py`` measures it). While ``torch.profiler`` is
recording, every span is also a ``record_function`` range in PyTorch's own trace, whether or
not snapstore's recording is on: by default PyTorch records only the thread that started the
profiler (the consumer's ``open`` and ``wait``); the reader's threads (``request``, ``decode``,
``assemble``) show as well under ``torch.profiler.profile(experimental_config=
torch._C._profiler._ExperimentalConfig(profile_all_threads=True))`` (PyTorch 2.7 on).
DataLoader worker processes are not in PyTorch's trace at all; they are in snapstore's.

Each process keeps its events in memory and appends them to its own part file,
``<path>.parts/<host>-<pid>.jsonl``: at the end of every reader pass (:func:`flush`), when a
``trace`` block ends, and when the process exits (DataLoader and engine workers included: a
forked one inherits the recording, a spawned one the environment variable). :func:`merge`
joins the parts into ``path``, one JSON object ``{"traceEvents": [...]}``; the process that
ends a ``trace`` block merges, and so does a main process (not a multiprocessing child) that
records at its exit, so with several ranks the last one to exit leaves the whole trace.
Every process is one track group (its label says rank and worker), every thread a track: its
``tid`` is the operating system's thread id, as in PyTorch's traces (Python's thread idents
are reused as soon as a thread ends, so a pool's new threads would take a finished one's name).

Timestamps are microseconds of wall-clock time (``time.time_ns`` at the process's start plus a
monotonic clock since), so the tracks of processes on one host line up, and those of other
hosts as well as their clocks agree.

Span names, by category (what :mod:`snapstore.verdict` adds up):

- ``read``: ``open`` (one metadata request: ``path``, ``bytes``), ``request`` (one range
  request to a remote store: ``bytes``, ``blocks``; a local store's reads are memory-map
  slices, paid in ``decode``), ``decode`` (the blocks of one request verified and decoded on a
  decode thread: the first ``block``, ``blocks``, stored ``bytes``), ``assemble`` (on the
  assembler thread: a chunk's rows located, ``chunk`` or mixture ``source`` and ``samples``;
  one batch copied, ``batch`` and ``samples``), ``wait`` (the consumer waiting for batch
  ``batch``: its input-bound time), ``pass`` (a reader's pass over its share of an epoch:
  ``epoch``, ``rank``, ``world_size``, ``worker``, ``num_workers``, ``samples``, ``batches``).
- ``write``: ``stage`` (the stage's own code producing samples), ``validate``, ``encode``,
  ``compress``, ``upload``, ``commit``, ``claim`` (waiting for another job's claim).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import multiprocessing
import multiprocessing.util
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "ENV",
    "RUN_ENV",
    "Tracing",
    "complete",
    "enabled",
    "flush",
    "label_process",
    "merge",
    "now",
    "parts_dir",
    "profiler_range",
    "read_events",
    "span",
    "trace",
]

ENV = "SNAPSTORE_TRACE"
RUN_ENV = "SNAPSTORE_TRACE_RUN"
MAX_EVENTS = 2_000_000  # per process between flushes; more are counted and dropped
FLUSH_SECONDS = 2.0  # a process's events are appended to its part at least this often
_OFF: contextlib.nullcontext[None] = contextlib.nullcontext()
_CLOCK_BASE = time.time_ns() // 1000 - time.perf_counter_ns() // 1000


def _now() -> float:
    """Microseconds of wall-clock time, from a monotonic clock."""
    return _CLOCK_BASE + time.perf_counter_ns() / 1000


class _Recorder:
    """This process's events, buffered until :meth:`flush` appends them to its part file."""

    def __init__(self, path: str) -> None:
        self.path = str(path)
        self.pid = os.getpid()
        self.events: list[dict[str, Any] | tuple[Any, ...]] = []  # spans as tuples
        self.dropped = 0
        self.threads: set[int] = set()
        self.label: str | None = None
        self.sort_index: int | None = None
        self.lock = threading.Lock()
        self.flushed = _now()
        self.run = _run_id()
        self.part = parts_dir(self.path) / f"{self.run}-{socket.gethostname()}-{self.pid}.jsonl"

    def add(self, event: dict[str, Any]) -> None:
        """Record an event given whole (metadata, instants)."""
        self._thread(event["tid"])
        if len(self.events) < MAX_EVENTS:
            self.events.append(event)
        else:
            self.dropped += 1

    def add_span(
        self, name: str, cat: str, ts: float, dur: float, tid: int, args: dict[str, Any] | None
    ) -> None:
        """Record a complete span, kept as a tuple until :meth:`flush` writes it."""
        self._thread(tid)
        if len(self.events) >= MAX_EVENTS:
            self.dropped += 1
            return
        self.events.append((name, cat, ts, dur, tid, args))
        if ts - self.flushed > FLUSH_SECONDS * 1e6:
            self.flushed = ts  # a worker killed later loses at most the last seconds
            threading.Thread(target=self.flush, name="snapstore-trace-flush").start()

    def _thread(self, tid: int) -> None:
        if tid not in self.threads:
            self.threads.add(tid)
            name = threading.current_thread().name
            self.events.append(_meta("thread_name", self.pid, tid, name))

    def flush(self) -> None:
        with self.lock:
            events, self.events = self.events, []
            if self.label is not None:
                events.insert(0, _meta("process_name", self.pid, 0, self.label))
            if self.sort_index is not None:
                sort = _meta("process_sort_index", self.pid, 0, "")
                sort["args"] = {"sort_index": self.sort_index}
                events.insert(0, sort)
            if self.dropped:
                args = {"dropped": self.dropped, "max": MAX_EVENTS}
                events.append(_instant("events dropped", "trace", args))
                self.dropped = 0
            if not events:
                return
            lines = list(map(self._line, events))
            self.part.parent.mkdir(parents=True, exist_ok=True)
            with open(self.part, "a", encoding="utf-8") as out:
                out.writelines(lines)

    def _line(self, event: dict[str, Any] | tuple[Any, ...]) -> str:
        """One event as a JSON line; spans by a template (twice as fast as ``json.dumps``)."""
        if isinstance(event, dict):
            return _dumps(event) + "\n"
        name, cat, ts, dur, tid, args = event
        extra = f',"args":{_dumps(args)}' if args else ""
        return (
            f'{{"ph":"X","name":{_quoted(name)},"cat":{_quoted(cat)},"ts":{ts:.3f},'
            f'"dur":{dur:.3f},"pid":{self.pid},"tid":{tid}{extra}}}\n'
        )


_dumps = json.JSONEncoder(separators=(",", ":")).encode


@functools.lru_cache(maxsize=256)
def _quoted(text: str) -> str:
    """A span's name or category as a JSON string (a few distinct ones, so cached)."""
    return _dumps(text)


_recorder: _Recorder | None = None
_blocks = 0  # trace() blocks entered in this process
_torch_profiler: Any = None  # torch.autograd.profiler, once torch is imported


def _run_id() -> str:
    """The job this process belongs to: torchrun's run id, else one its first process chose
    (children inherit it through the environment)."""
    run = os.environ.get(RUN_ENV) or os.environ.get("TORCHELASTIC_RUN_ID")
    if not run:
        run = os.environ[RUN_ENV] = f"{int(time.time())}{os.getpid():07d}"
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in run)


def enabled() -> bool:
    """Whether this process records a trace."""
    return _recorder is not None


def parts_dir(path: str | os.PathLike[str]) -> Path:
    """Where the processes of a trace written to ``path`` keep their parts."""
    return Path(f"{os.fspath(path)}.parts")


def _meta(name: str, pid: int, tid: int, value: str) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": {"name": value}}


def _instant(name: str, cat: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "ph": "i",
        "s": "t",
        "name": name,
        "cat": cat,
        "ts": _now(),
        "pid": os.getpid(),
        "tid": threading.get_native_id(),
        "args": args,
    }


def _torch_recording() -> Any:
    """``torch.autograd.profiler`` while a PyTorch profiler records, else None."""
    global _torch_profiler
    if _torch_profiler is None:
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        _torch_profiler = torch.autograd.profiler
    return _torch_profiler if _torch_profiler._is_profiler_enabled else None


class _Span:
    __slots__ = ("args", "cat", "name", "ranges", "start")

    def __init__(self, name: str, cat: str, args: dict[str, Any], ranges: Any) -> None:
        self.name, self.cat, self.args, self.ranges = name, cat, args, ranges
        self.start = 0.0

    def __enter__(self) -> _Span:
        if self.ranges is not None:
            self.ranges = self.ranges.record_function(f"snapstore.{self.cat}.{self.name}")
            self.ranges.__enter__()
        self.start = _now()
        return self

    def __exit__(self, *exc: object) -> None:
        complete(self.name, self.cat, self.start, _now(), **self.args)
        if self.ranges is not None:
            self.ranges.__exit__(None, None, None)


def span(name: str, cat: str, **args: Any) -> contextlib.AbstractContextManager[Any]:
    """A context manager that records what it encloses as one span (and a ``torch.profiler``
    range while PyTorch's profiler records); a shared no-op when neither records.

    ``args`` are shown with the span (bytes, block numbers...); keep them small. The block
    enters None when nothing records, else an object whose ``args`` dict may be added to until
    the block ends: args known only at the end (bytes read), or costly to make, go there::

        with tracing.span("open", "read") as recorded:
            data = store.read_bytes(path)
            if recorded is not None:
                recorded.args.update(path=path, bytes=len(data))
    """
    ranges = _torch_recording()
    if _recorder is None and ranges is None:
        return _OFF
    return _Span(name, cat, args, ranges)


def complete(name: str, cat: str, start: float, end: float, **args: Any) -> None:
    """Record a span measured elsewhere: ``start`` and ``end`` from :func:`now`."""
    recorder = _recorder
    if recorder is None:
        return
    recorder.add_span(
        name, cat, start, max(0.0, end - start), threading.get_native_id(), args or None
    )


now = _now


def profiler_range(name: str, cat: str) -> contextlib.AbstractContextManager[Any]:
    """The ``torch.profiler`` range alone of a span that :func:`complete` records (whose time
    is measured anyway); a shared no-op unless PyTorch's profiler records."""
    ranges = _torch_recording()
    return _OFF if ranges is None else ranges.record_function(f"snapstore.{cat}.{name}")


def label_process(label: str, sort_index: int | None = None) -> None:
    """Name this process's track group (``"rank 1 worker 3"``); ``sort_index`` orders the
    groups in a viewer (Perfetto, chrome://tracing), lowest first."""
    if _recorder is not None:
        _recorder.label = label
        if sort_index is not None:
            _recorder.sort_index = sort_index


def flush() -> None:
    """Append this process's events so far to its part file (no-op when not recording)."""
    recorder = _recorder
    if recorder is not None and recorder.pid == os.getpid():
        recorder.flush()
    elif recorder is not None:  # forked outside os.fork's hooks: a recorder of its own
        _start(recorder.path)


def _start(path: str) -> _Recorder:
    global _recorder
    _recorder = _Recorder(path)
    rank = os.environ.get("RANK")
    if rank is not None:
        _recorder.label = f"rank {rank}"
    return _recorder


def _stop() -> None:
    global _recorder
    recorder, _recorder = _recorder, None
    if recorder is not None and recorder.pid == os.getpid():
        recorder.flush()


def read_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The events of a merged trace file, or of a trace's parts when it is not merged yet."""
    path = Path(path)
    if path.is_file():
        with open(path, encoding="utf-8") as f:
            try:
                loaded = json.load(f)
            except ValueError as exc:
                raise ValueError(f"{path} is not a trace: not JSON ({exc})") from None
        events = loaded.get("traceEvents") if isinstance(loaded, dict) else loaded
        if not isinstance(events, list):
            raise ValueError(
                f"{path} is not a trace: expected a JSON object with a traceEvents list (or a "
                f"list of events), found {type(loaded).__name__} with keys "
                f"{sorted(loaded)[:5] if isinstance(loaded, dict) else '-'}; pass a file written "
                "by snapstore.trace or $SNAPSTORE_TRACE"
            )
        return events
    return list(_part_events(parts_dir(path)))


def _part_events(parts: Path, run: str | None = None) -> Iterator[dict[str, Any]]:
    for part in sorted(parts.glob(f"{run or ''}*.jsonl")):
        with open(part, encoding="utf-8") as f:
            for line in f:
                if line.endswith("\n"):  # a line still being written is left for next time
                    yield json.loads(line)


def merge(path: str | os.PathLike[str], run: str | None = None) -> Path:
    """Join the parts of the trace ``path`` into ``path`` (Chrome trace JSON); returns it.

    ``run`` keeps the parts of one job (this process's, by default, when it records; all of
    them when it does not). Safe to run in several processes at once: each writes a temp file
    and renames it, and merges again if more parts were written meanwhile. Parts of other jobs
    older than a day are removed.
    """
    path = Path(path)
    parts = parts_dir(path)
    if run is None and _recorder is not None and _recorder.path == os.fspath(path):
        run = _recorder.run

    def sizes() -> dict[str, int]:
        found = parts.glob(f"{run or ''}*.jsonl") if parts.is_dir() else []
        return {p.name: p.stat().st_size for p in found}

    for _ in range(5):
        seen = sizes()
        events = sorted(_part_events(parts, run), key=lambda e: (e["ph"] != "M", e.get("ts", 0)))
        temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temp, "w", encoding="utf-8") as out:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, out)
        os.replace(temp, path)
        if sizes() == seen:
            break
    if run and parts.is_dir():
        stale = time.time() - 86400
        for old in parts.glob("*.jsonl"):
            with contextlib.suppress(OSError):
                if not old.name.startswith(run) and old.stat().st_mtime < stale:
                    old.unlink()
    return path


class Tracing:
    """``with snapstore.trace(path):`` records this process, and the processes it starts
    inside the block, into ``path``; see :func:`trace`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._saved: tuple[_Recorder | None, str | None, str | None] | None = None

    def __enter__(self) -> Tracing:
        global _blocks
        self._saved = (_recorder, os.environ.get(ENV), os.environ.get(RUN_ENV))
        if _recorder is not None:
            _recorder.flush()
        # A run of its own: under torchrun, the job's id and the block's number, which the
        # ranks running the same code agree on; else this process's.
        _blocks += 1
        job = os.environ.get("TORCHELASTIC_RUN_ID") or f"{int(time.time())}{os.getpid():07d}"
        os.environ[RUN_ENV] = f"{job}-{_blocks}"
        os.environ[ENV] = self.path
        _start(self.path)
        return self

    def __exit__(self, *exc: object) -> None:
        global _recorder
        _stop()
        assert self._saved is not None
        run = os.environ[RUN_ENV]
        _recorder, *saved = self._saved
        for name, value in zip((ENV, RUN_ENV), saved, strict=True):
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        merge(self.path, run)


def trace(path: str | os.PathLike[str]) -> Tracing:
    """Record what snapstore does into ``path``, a Chrome trace JSON file, while in the block.

    DataLoader workers, engine workers and other processes started inside the block record into
    the same trace (a reader's worker flushes its part at the end of every pass); it is merged
    when the block ends. ``snapstore trace merge PATH`` merges again, for parts flushed later.

    Examples
    --------
    >>> with snapstore.trace("epoch.json"):                 # doctest: +SKIP
    ...     for batch in loader: ...
    """
    return Tracing(path)


def _at_exit() -> None:
    recorder = _recorder
    if recorder is None or recorder.pid != os.getpid():
        return
    recorder.flush()
    if multiprocessing.parent_process() is None:
        merge(recorder.path)


class _ForkHook:
    """What ``multiprocessing.util.register_after_fork`` holds (it keeps a weak reference)."""


_FORK_HOOK = _ForkHook()


def _after_fork() -> None:
    """In a forked child: a recorder of its own (the parent's buffered events are not ours)."""
    if _recorder is not None:
        _start(_recorder.path)


def _in_worker(_: object) -> None:
    """In a multiprocessing child (after its bootstrap cleared the finalizers it inherited):
    flush at its exit, which goes through ``os._exit`` past ``atexit``."""
    if _recorder is not None:
        multiprocessing.util.Finalize(None, _at_exit, exitpriority=0)


def _from_environment() -> None:
    path = os.environ.get(ENV)
    if path:
        _start(path)
    atexit.register(_at_exit)
    os.register_at_fork(after_in_child=_after_fork)
    multiprocessing.util.register_after_fork(_FORK_HOOK, _in_worker)


_from_environment()
