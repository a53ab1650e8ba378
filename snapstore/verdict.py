"""Where the time goes: a trace's figures rolled up into one verdict on what limits training.

:func:`analyze` reads the spans of a trace (:mod:`snapstore.tracing`) and adds them up per
process, then across processes. A process is a *consumer* when it reads (its ``pass`` spans)
or runs a training loop that :func:`snapstore.watch.watch` records (its ``train`` spans). For
each: its wall time, the time it waited for batches, the *input-bound share* (wait / wall),
and each reader stage's busy time: ``open``, ``request``, ``decode`` and ``assemble``. Where a
training loop was recorded (``train`` spans: the main process of a DataLoader), the input-bound
share is that loop's, and the stages are its workers'. Processes that write (``write`` spans)
are added up apart: the stage's own code against snapstore's work.

The bottleneck follows from the figures by the first rule that holds (thresholds below):

1. input-bound share under :data:`INPUT_BOUND`: the training step; the input keeps up.
2. most of the wait before the first batch (:data:`FIRST_WINDOW`): the first window.
3. the readers' decoding and assembly keep :data:`SATURATED` of the machine's cores busy
   (when the number of cores is given): the CPU, whatever the settings.
4. decode threads or the assembler busy :data:`SATURATED` of their time: that stage, the
   busier one if both (a stage busy all the time is the one the others wait for).
5. requests in flight :data:`STORE_BUSY` of the time or more: the store, its bandwidth when
   the bytes/s come within :data:`NEAR_CEILING` of a ceiling given, else its latency.
6. the busier of decoding and assembly busy :data:`BUSY` of its time: that stage (the two
   share the cores and the GIL, so neither reaches :data:`SATURATED` while both work).
7. otherwise no reader stage is busy: the time goes between the reader and the loop.

Writing: the stage's own code :data:`STAGE_CODE` of the writing time or more is the
bottleneck; else waiting for another job's claim, if as long; else the largest of snapstore's
parts (:data:`WRITE_HINTS` says what to change for each).

A training loop gets the verdict of each epoch from :func:`snapstore.watch.watch`; a trace
file from :func:`analyze`, or ``snapstore trace summary PATH``:

>>> verdict = snapstore.verdict.analyze("epoch.json")                 # doctest: +SKIP
>>> print(verdict.text())                                              # doctest: +SKIP
"""

from __future__ import annotations

import bisect
import math
import os
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from . import tracing

__all__ = [
    "ADVICE",
    "BUSY",
    "FIRST_WINDOW",
    "INPUT_BOUND",
    "NEAR_CEILING",
    "READ_STAGES",
    "SATURATED",
    "STAGE_CODE",
    "STORE_BUSY",
    "WRITE_HINTS",
    "WRITE_WORK",
    "Bottleneck",
    "Consumer",
    "StageTime",
    "Verdict",
    "WriteTime",
    "analyze",
    "check_events",
    "read_bottleneck",
    "render",
]

# Under a tenth of its time waiting, no input fix can make training more than ~10% faster:
# the step is what to speed up. (TensorFlow's input-pipeline analyzer draws its "highly input
# bound" line at 20% and calls under 5% not input bound; a tenth sits between.)
INPUT_BOUND = 0.10
# The wait before the first batch of each pass (a whole shuffle window fetched and decoded
# before the first batch can be cut) is most of the wait: the first window is what to shrink.
FIRST_WINDOW = 0.5
# A stage whose threads are busy this share of the wall time is the limit: the queue ahead of
# it stays full and the stages after it wait. Not 1.0: hand-offs and the GIL take some of every
# thread's time, so a saturated pool measures 85-95% busy.
SATURATED = 0.8
# With the consumer waiting and the store idle, a CPU stage this busy is the limit though not
# saturated: the decode threads and the assembler share the cores and the GIL, so when both
# work neither reaches SATURATED (on 2 cores: 75% and 47%, a read no faster with more threads).
BUSY = 0.5
# Requests in flight on average (request-seconds / wall): under half a request the store is
# idle most of the time, so waiting is not the store's doing.
STORE_BUSY = 0.5
# Bytes/s within this share of a known ceiling (a NIC, a bucket's quota) have nowhere to go:
# more requests in flight would only share the same bandwidth.
NEAR_CEILING = 0.8
# The stage's own code taking this share of a writing process's time is what to speed up.
STAGE_CODE = 0.5

READ_STAGES = ("open", "request", "decode", "assemble")
WRITE_WORK = ("validate", "encode", "compress", "upload", "commit")

Bottleneck = Literal[
    "step",
    "first-window",
    "cpu",
    "decode",
    "assemble",
    "latency",
    "bandwidth",
    "hand-off",
    "stage-code",
    "claim",
    "snapstore-write",
    "unknown",
]

# What to change when one of snapstore's parts of writing takes the most time (as the INFO line
# at the end of a materialization says, snapstore.write.times).
# What to change when a step of snapstore's write dominates (also the materialize line's hint,
# snapstore.write.times).
WRITE_HINTS = {
    "validate": "yield snapstore.Columns batches instead of one dict per sample",
    "encode": "more encoding threads (WriteOptions(threads=...)), or larger blocks",
    "compress": "a lower compression_level in WriteOptions (0 stores blocks raw), or more "
    "encoding threads (WriteOptions(threads=...))",
    "upload": "the store's write bandwidth: a store nearer the job, or more workers writing "
    "at once (partition_by)",
    "commit": "the store's latency: a commit is a few small writes and a create-if-absent",
}

ADVICE: dict[str, str] = {
    "step": "the training step: the input pipeline keeps up",
    "first-window": "the first window: the wait before each pass's first batch — smaller "
    "window_bytes",
    "cpu": "CPU: the readers keep {use:.1f} of the {cpus} cores busy decoding and assembling "
    "— more threads cannot help: less to decode (WriteOptions(compression_level=0) stores "
    "blocks raw), or more cores",
    "first-batch": "the first batch of each epoch: DataLoader workers starting, the first "
    "window — persistent_workers=True, smaller window_bytes",
    "decode": "CPU: decoding — raise decode_threads (now {threads}) or DataLoader num_workers",
    "assemble": "one assembler per reader — more DataLoader workers",
    "latency": "the store's latency — raise max_requests / prefetch_bytes, or a block cache "
    "(snapstore.storage.cache.cached_store) for repeated epochs",
    "bandwidth": "the store's bandwidth — a block cache (snapstore.storage.cache.cached_store) "
    "/ fewer bytes (compression)",
    "hand-off": "no reader stage is busy: the time goes between the readers and the loop (the "
    "workers' transforms and collation, the hand-off to the main process) — more DataLoader "
    "workers, or less work per batch outside snapstore",
    "stage-code": "the stage's own code — speed up the stage function, or partition it "
    "(partition_by) to run on an engine's workers",
    "claim": "waiting for another job's claim: it computes the same snapshot, this job reads it",
    "snapstore-write": "snapstore's work: {part} — {hint}",
    "unknown": "no snapstore spans in the trace: was recording on while snapstore read or wrote?",
}


@dataclass(frozen=True)
class StageTime:
    """One stage's time, in one consumer or added up over several.

    Attributes
    ----------
    name : str
        ``open``, ``request``, ``decode`` or ``assemble``.
    busy : float
        Seconds spent in the stage's spans, all threads together.
    threads : int
        Threads carrying its spans at once (the most in any pass).
    share : float
        ``busy`` over the readers' wall time; more than 1 where threads overlap (for
        ``request``: the requests in flight on average).
    utilization : float
        ``busy`` over threads x wall: how much of the stage's capacity was used.
    """

    name: str
    busy: float = 0.0
    threads: int = 0
    share: float = 0.0
    utilization: float = 0.0


@dataclass(frozen=True)
class Consumer:
    """One process's figures: a reader's, a training loop's, or both (``num_workers=0``).

    ``wall`` is the loop's time (its ``train`` spans) where :mod:`snapstore.watch` recorded
    one, else the reader's (first to last of its ``pass`` spans); ``wait`` and ``first_wait``
    (the waits for each pass's first batch) are seconds of it. ``reader_wall`` is the reader's
    time (0 without ``pass`` spans), over which ``stages`` are measured.
    """

    pid: int
    label: str
    loop: bool
    wall: float
    wait: float
    first_wait: float
    input_bound: float
    reader_wall: float
    stages: dict[str, StageTime]
    requests: int = 0
    bytes: int = 0
    latency_mean: float = math.nan
    latency_p95: float = math.nan
    bytes_per_s: float = math.nan


@dataclass(frozen=True)
class WriteTime:
    """The writing processes' time: the stage's own code against snapstore's work.

    ``wall`` adds up each writing process's first to last ``write`` span; ``stage`` and
    ``claim`` are seconds of the stage's code and of waiting for another job's claim;
    ``work`` maps each of snapstore's parts (validate, encode, compress, upload, commit) to
    its seconds.
    """

    processes: int
    wall: float
    stage: float
    claim: float
    work: dict[str, float]
    bottleneck: Bottleneck
    advice: str

    @property
    def stage_share(self) -> float:
        """The stage's own code over the writing time."""
        return self.stage / self.wall if self.wall > 0 else 0.0


@dataclass(frozen=True)
class Verdict:
    """What a trace says limits training; :meth:`text` is the short report.

    Attributes
    ----------
    consumers : tuple of Consumer
        Each reading process and training loop.
    wall, wait, first_wait : float
        Seconds, over the training loops if a loop was recorded, else over the readers.
    input_bound : float
        ``wait / wall``: the share of the consumers' time spent waiting for batches.
    stages : dict of str to StageTime
        The readers' stages, added up over the readers.
    requests, bytes : int
        Range requests and the stored bytes read (by the requests; from a local store, by the
        decode threads).
    latency_mean, latency_p95 : float
        Seconds per request (NaN without requests).
    bytes_per_s : float
        Bytes over the time from the first pass's start to the last one's end.
    decode_threads : int
        The most decode threads any reader had.
    cpu_use : float
        Thread-seconds of decoding and assembly per second, over all readers (from the first
        pass's start to the last one's end): the cores they kept busy.
    bottleneck : str
        What limits: one of :data:`Bottleneck`.
    advice : str
        The bottleneck in words, with the setting to change.
    write : WriteTime, optional
        The writing processes' figures, when the trace holds ``write`` spans.
    trace : str, optional
        The trace file analyzed.
    """

    consumers: tuple[Consumer, ...]
    wall: float
    wait: float
    first_wait: float
    input_bound: float
    stages: dict[str, StageTime]
    requests: int
    bytes: int
    latency_mean: float
    latency_p95: float
    bytes_per_s: float
    decode_threads: int
    cpu_use: float
    bottleneck: Bottleneck
    advice: str
    write: WriteTime | None = None
    trace: str | None = field(default=None, compare=False)

    @property
    def in_flight(self) -> float:
        """Requests in flight on average, per reader."""
        return self.stages["request"].share

    def as_dict(self) -> dict[str, Any]:
        """The figures as plain JSON-able values (NaN as None)."""
        return _plain(asdict(self))  # type: ignore[no-any-return]

    def text(self) -> str:
        """The report: the input-bound share, the stages' table, the bottleneck and what to do."""
        return render(self)

    def __str__(self) -> str:
        return self.text()


# -- reading the events ----------------------------------------------------------------------

Span = tuple[float, float, int, dict[str, Any]]  # start, end (microseconds), thread, args


class _Process:
    """One process's spans by (category, name), sorted by start."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.label = f"pid {pid}"
        self.spans: dict[tuple[str, str], list[Span]] = defaultdict(list)

    def get(self, cat: str, name: str) -> list[Span]:
        return self.spans.get((cat, name), [])

    def category(self, cat: str) -> list[Span]:
        return sorted(s for (c, _), spans in self.spans.items() if c == cat for s in spans)


def _processes(
    events: Iterable[dict[str, Any]], start: float | None, end: float | None
) -> list[_Process]:
    found: dict[int, _Process] = {}
    for e in events:
        pid = e.get("pid")
        if not isinstance(pid, int):
            continue
        if e.get("ph") == "M" and e.get("name") == "process_name":
            found.setdefault(pid, _Process(pid)).label = str(e.get("args", {}).get("name"))
        if e.get("ph") != "X":
            continue
        ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        if (start is not None and ts + dur < start) or (end is not None and ts > end):
            continue
        span = (ts, ts + dur, int(e.get("tid", 0)), e.get("args") or {})
        found.setdefault(pid, _Process(pid)).spans[(e.get("cat", ""), e["name"])].append(span)
    for process in found.values():
        for spans in process.spans.values():
            spans.sort(key=lambda s: s[0])
    return [found[pid] for pid in sorted(found)]


def _busy(spans: list[Span]) -> float:
    return sum(s[1] - s[0] for s in spans) / 1e6


def _extent(spans: list[Span]) -> tuple[float, float]:
    return min(s[0] for s in spans), max(s[1] for s in spans)


def _threads(spans: list[Span], windows: list[Span]) -> int:
    """The most distinct threads carrying ``spans`` inside any one of ``windows`` (a reader's
    pools are made per pass: counting over the whole process would add up every pass's)."""
    starts = [s[0] for s in spans]
    most = 0
    for w in windows:
        inside = spans[bisect.bisect_left(starts, w[0]) : bisect.bisect_right(starts, w[1])]
        most = max(most, len({s[2] for s in inside}))
    return most or len({s[2] for s in spans})


def _first_waits(waits: list[Span], episodes: list[Span]) -> float:
    """Seconds of the waits for each episode's (a pass's, an epoch's) first batch: those of
    batch 0 where the waits are numbered (the readers' and :mod:`snapstore.watch`'s are),
    else the first wait of each episode, the latest one started before the wait ended."""
    if waits and all("batch" in w[3] for w in waits):
        return sum(w[1] - w[0] for w in waits if w[3]["batch"] == 0) / 1e6
    starts = [e[0] for e in episodes]
    seen: set[int] = set()
    total = 0.0
    for w in waits:
        k = bisect.bisect_right(starts, w[1]) - 1
        if k >= 0 and k not in seen:
            seen.add(k)
            total += (w[1] - w[0]) / 1e6
    return total


def _p95(values: list[float]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def _stage_times(process: _Process, passes: list[Span], wall: float) -> dict[str, StageTime]:
    stages = {}
    for name in READ_STAGES:
        spans = process.get("read", name)
        busy = _busy(spans)
        threads = _threads(spans, passes) if spans else 0
        share = busy / wall if wall > 0 else 0.0
        stages[name] = StageTime(name, busy, threads, share, share / threads if threads else 0.0)
    return stages


def _consumer(process: _Process) -> Consumer | None:
    passes = process.get("read", "pass")
    loop = process.category("train")
    if not passes and not loop:
        return None
    reader_wall = 0.0
    if passes:
        first, last = _extent(passes)
        reader_wall = (last - first) / 1e6
    if loop:
        epochs = process.get("train", "epoch") or [(*_extent(loop), 0, {})]
        waits = process.get("train", "wait")
        wall = sum(e[1] - e[0] for e in epochs) / 1e6
    else:
        epochs, waits, wall = passes, process.get("read", "wait"), reader_wall
    wait = _busy(waits)
    requests = process.get("read", "request")
    # Stored bytes fetched; a local store has no requests, its decode threads read the blocks.
    nbytes = sum(int(s[3].get("bytes", 0)) for s in requests or process.get("read", "decode"))
    latencies = [(s[1] - s[0]) / 1e6 for s in requests]
    named = process.label != f"pid {process.pid}"
    return Consumer(
        pid=process.pid,
        label=process.label if named or not loop else f"training loop (pid {process.pid})",
        loop=bool(loop),
        wall=wall,
        wait=wait,
        first_wait=_first_waits(waits, epochs),
        input_bound=wait / wall if wall > 0 else 0.0,
        reader_wall=reader_wall,
        stages=_stage_times(process, passes, reader_wall),
        requests=len(requests),
        bytes=nbytes,
        latency_mean=sum(latencies) / len(latencies) if latencies else math.nan,
        latency_p95=_p95(latencies),
        bytes_per_s=nbytes / reader_wall if reader_wall > 0 else math.nan,
    )


def _order(consumer: Consumer) -> tuple[bool, list[Any], int]:
    """Training loops first, then by label, numbers as numbers (worker 2 before worker 10)."""
    words = re.split(r"(\d+)", consumer.label)
    return not consumer.loop, [int(w) if w.isdigit() else w for w in words], consumer.pid


# -- the rules ---------------------------------------------------------------------------------


def _roll_up(readers: list[Consumer]) -> dict[str, StageTime]:
    """Each stage over all readers: shares of their summed wall, utilization of their summed
    capacity (threads x wall)."""
    wall = sum(c.reader_wall for c in readers)
    stages = {}
    for name in READ_STAGES:
        busy = sum(c.stages[name].busy for c in readers)
        capacity = sum(c.stages[name].threads * c.reader_wall for c in readers)
        threads = max((c.stages[name].threads for c in readers), default=0)
        share = busy / wall if wall > 0 else 0.0
        stages[name] = StageTime(name, busy, threads, share, busy / capacity if capacity else 0.0)
    return stages


def read_bottleneck(
    *,
    input_bound: float,
    wait: float,
    first_wait: float,
    stages: dict[str, StageTime],
    bytes_per_s: float = math.nan,
    latency_p95: float = math.nan,
    cpu_use: float = 0.0,
    bandwidth: float | None = None,
    cpus: int | None = None,
    loop: bool = False,
) -> tuple[Bottleneck, str]:
    """The reading side's bottleneck and its advice, from the rolled-up figures (the rules of
    the module docstring, in order; ``cpu_use``: see :attr:`Verdict.cpu_use`). ``loop``: the
    waits are a training loop's (:mod:`snapstore.watch`), whose first includes the start of
    its DataLoader's workers."""
    if input_bound < INPUT_BOUND:
        return "step", ADVICE["step"]
    if wait > 0 and first_wait / wait >= FIRST_WINDOW:
        return "first-window", ADVICE["first-batch" if loop else "first-window"]
    if cpus and cpu_use >= SATURATED * cpus:
        return "cpu", ADVICE["cpu"].format(cpus=cpus, use=cpu_use)
    decode, assemble = stages["decode"].utilization, stages["assemble"].utilization
    busier: Bottleneck = "decode" if decode >= assemble else "assemble"
    advice = ADVICE[busier].format(threads=stages["decode"].threads)
    if max(decode, assemble) >= SATURATED:
        return busier, advice
    request = stages["request"]
    if request.share >= STORE_BUSY:
        if bandwidth and bytes_per_s >= NEAR_CEILING * bandwidth:
            return "bandwidth", ADVICE["bandwidth"]
        figures = f" (p95 {latency_p95 * 1e3:.0f} ms, {request.share:.1f} requests in flight)"
        return "latency", ADVICE["latency"].replace(" — ", figures + " — ", 1)
    if max(decode, assemble) >= BUSY:
        return busier, advice
    return "hand-off", ADVICE["hand-off"]


def _write_time(processes: list[_Process]) -> WriteTime | None:
    writers = [p for p in processes if p.category("write")]
    if not writers:
        return None
    wall = 0.0
    for p in writers:
        first, last = _extent(p.category("write"))
        wall += (last - first) / 1e6
    stage = sum(_busy(p.get("write", "stage")) for p in writers)
    claim = sum(_busy(p.get("write", "claim")) for p in writers)
    work = {name: sum(_busy(p.get("write", name)) for p in writers) for name in WRITE_WORK}
    bottleneck: Bottleneck
    if wall > 0 and stage / wall >= STAGE_CODE:
        bottleneck, advice = "stage-code", ADVICE["stage-code"]
    elif wall > 0 and claim / wall >= STAGE_CODE:
        bottleneck, advice = "claim", ADVICE["claim"]
    else:
        part = max(work, key=lambda k: work[k])
        advice = ADVICE["snapstore-write"].format(part=part, hint=WRITE_HINTS[part])
        bottleneck = "snapstore-write"
    return WriteTime(len(writers), wall, stage, claim, work, bottleneck, advice)


def analyze(
    source: str | os.PathLike[str] | Iterable[dict[str, Any]],
    *,
    bandwidth: float | None = None,
    cpus: int | None = None,
    start: float | None = None,
    end: float | None = None,
) -> Verdict:
    """The verdict of a trace: its figures per consumer and rolled up, and the bottleneck.

    Parameters
    ----------
    source : str, PathLike or iterable of dict
        A trace file (merged, or its parts if not merged yet; see
        :func:`snapstore.tracing.read_events`) or its events.
    bandwidth : float, optional
        The bytes/s the store or the link can deliver at most, if known (a NIC's, a bucket's
        quota): reads near it are bandwidth-bound. A trace cannot tell it.
    cpus : int, optional
        The cores of the machine that read (``os.cpu_count()`` there), if known: readers that
        keep nearly all of them busy are CPU-bound whatever their settings. With the processes
        of several machines in one trace, their use is added up as if on one.
    start, end : float, optional
        Only spans overlapping this time (microseconds, as :func:`snapstore.tracing.now`).

    Returns
    -------
    Verdict
    """
    trace = None
    if isinstance(source, (str, os.PathLike)):
        trace = os.fspath(source)
        source = tracing.read_events(trace)
    processes = _processes(source, start, end)
    consumers = sorted((c for p in processes if (c := _consumer(p)) is not None), key=_order)
    loops = [c for c in consumers if c.loop]
    inputs = loops or consumers
    readers = [c for c in consumers if c.reader_wall > 0]
    wall, wait = sum(c.wall for c in inputs), sum(c.wait for c in inputs)
    first_wait = sum(c.first_wait for c in inputs)
    input_bound = wait / wall if wall > 0 else 0.0
    stages = _roll_up(readers)
    spans = [s for p in processes for s in p.get("read", "pass")]
    extent = (lambda e: (e[1] - e[0]) / 1e6)(_extent(spans)) if spans else 0.0
    nbytes = sum(c.bytes for c in readers)
    bytes_per_s = nbytes / extent if extent > 0 else math.nan
    cpu_busy = stages["decode"].busy + stages["assemble"].busy
    cpu_use = cpu_busy / extent if extent > 0 else 0.0
    latencies = [(s[1] - s[0]) / 1e6 for p in processes for s in p.get("read", "request")]
    write = _write_time(processes)
    bottleneck: Bottleneck
    if inputs:
        bottleneck, advice = read_bottleneck(
            input_bound=input_bound,
            wait=wait,
            first_wait=first_wait,
            stages=stages,
            bytes_per_s=bytes_per_s,
            latency_p95=_p95(latencies),
            cpu_use=cpu_use,
            bandwidth=bandwidth,
            cpus=cpus,
            loop=bool(loops),
        )
    elif write is not None:
        bottleneck, advice = write.bottleneck, write.advice
    else:
        bottleneck, advice = "unknown", ADVICE["unknown"]
    return Verdict(
        consumers=tuple(consumers),
        wall=wall,
        wait=wait,
        first_wait=first_wait,
        input_bound=input_bound,
        stages=stages,
        requests=len(latencies),
        bytes=nbytes,
        latency_mean=sum(latencies) / len(latencies) if latencies else math.nan,
        latency_p95=_p95(latencies),
        bytes_per_s=bytes_per_s,
        decode_threads=stages["decode"].threads,
        cpu_use=cpu_use,
        bottleneck=bottleneck,
        advice=advice,
        write=write,
        trace=trace,
    )


# -- the report --------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1e3:.1f} ms"


def _stage_rows(v: Verdict) -> list[str]:
    """The stages' table: busy seconds, share of the readers' wall time, threads, use."""
    rows = [["reader stage", "busy", "of wall", "threads", "use"]]
    for name in READ_STAGES:
        s = v.stages[name]
        # A request's share is the requests in flight on average; its threads, the most ever
        # in flight at once (the I/O pool makes a thread only when all of them are busy).
        share = f"{s.share:.1f} in flight" if name == "request" else f"{s.share:.0%}"
        use = f"{s.utilization:.0%}" if s.threads else "-"
        rows.append([f"  {name}", f"{s.busy:.2f} s", share, str(s.threads or "-"), use])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join([r[0].ljust(12), *(c.rjust(w) for c, w in zip(r[1:], widths[1:]))]).rstrip()
        for r in rows
    ]


def render(v: Verdict) -> str:
    """The text of :meth:`Verdict.text`."""
    lines = []
    if v.consumers:
        loops = sum(c.loop for c in v.consumers)
        count = loops or len(v.consumers)
        who = f"{count} {'training loop' if loops else 'consumer'}{'s' if count > 1 else ''}"
        lines.append(
            f"input-bound   {v.input_bound:.0%} of {v.wall:.2f} s waiting for batches ({who}; "
            f"{v.first_wait:.2f} s before first batches)"
        )
        if len(v.consumers) > 1:
            each = ", ".join(
                f"{c.label} {c.input_bound:.0%}" for c in v.consumers[:8] if c.wall > 0
            )
            lines.append(f"per consumer  {each}{', ...' if len(v.consumers) > 8 else ''}")
        if any(c.reader_wall > 0 for c in v.consumers):
            lines += _stage_rows(v)
            rate = "-" if math.isnan(v.bytes_per_s) else f"{v.bytes_per_s / 1e6:.1f} MB/s"
            lines.append(
                f"requests      {v.requests}, latency mean {_ms(v.latency_mean)}, p95 "
                f"{_ms(v.latency_p95)}; {rate} fetched"
                if v.requests
                else f"requests      none (a local store: the decode threads read); {rate} read"
            )
    if v.write is not None:
        w = v.write
        work = ", ".join(f"{k} {s / w.wall:.0%}" for k, s in w.work.items() if s and w.wall)
        lines.append(
            f"writing       {w.wall:.2f} s in {w.processes} process(es): the stage's own code "
            f"{w.stage_share:.0%}; snapstore {work or 'nothing recorded'}"
            + (f"; claims {w.claim / w.wall:.0%}" if w.claim and w.wall else "")
        )
        if v.consumers:
            lines.append(f"writes        {w.advice}")
    lines.append(f"bottleneck    {v.advice}")
    if v.trace:
        lines.append(f"trace         {v.trace} (open it in https://ui.perfetto.dev)")
    return "\n".join(lines)


# -- checking a trace --------------------------------------------------------------------------

_PHASES = set("XBEiIMCbensftPON") | {"D"}
_METADATA = {
    "process_name",
    "process_labels",
    "process_sort_index",
    "thread_name",
    "thread_sort_index",
}


def _event_problem(e: Any) -> str | None:
    if not isinstance(e, dict):
        return f"expected an object, found {type(e).__name__}"
    ph = e.get("ph")
    if ph not in _PHASES:
        return f"unknown phase ph={ph!r}"
    if not isinstance(e.get("name"), str):
        return "expected a string name"
    for key in ("pid", "tid"):
        if key in e and not isinstance(e[key], int):
            return f"expected an integer {key}, found {e[key]!r}"
    if "args" in e and not isinstance(e["args"], dict):
        return "expected args to be an object"
    if ph == "M":
        if e["name"] not in _METADATA or "pid" not in e:
            return f"unknown metadata event {e['name']!r} or no pid"
        return None
    if not isinstance(e.get("ts"), (int, float)) or "pid" not in e or "tid" not in e:
        return "expected a numeric ts, a pid and a tid"
    if ph == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
        return f"a complete event needs a duration >= 0, found {e.get('dur')!r}"
    if ph in "iI" and e.get("s", "t") not in ("g", "p", "t"):
        return f"an instant event's scope must be g, p or t, found {e.get('s')!r}"
    return None


def check_events(events: Any, most: int = 20) -> list[str]:
    """Problems of a trace against the Chrome trace event format (empty: none).

    ``events`` is the trace's JSON object (``{"traceEvents": [...]}``) or its event list. Each
    event needs a known phase and a name; complete events (``X``) a numeric ``ts``, a ``pid``,
    a ``tid`` and a duration >= 0; metadata events (``M``) a known name. At most ``most``
    problems are listed.
    """
    if isinstance(events, dict):
        unit = events.get("displayTimeUnit", "ms")
        if unit not in ("ms", "ns"):
            return [f"displayTimeUnit must be 'ms' or 'ns', found {unit!r}"]
        events = events.get("traceEvents")
    if not isinstance(events, list):
        return [f"expected a list of events, found {type(events).__name__}"]
    problems = []
    for k, e in enumerate(events):
        problem = _event_problem(e)
        if problem is not None:
            problems.append(f"event {k}: {problem}: {str(e)[:120]}")
            if len(problems) >= most:
                break
    return problems
