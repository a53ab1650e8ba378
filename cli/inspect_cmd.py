"""``snapstore head``, ``bench`` and ``du``: look at samples, time a read, count bytes.

The JSON each prints with ``--json`` is documented in docs/cli.md; its keys are stable.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click
import numpy as np

import snapstore
from snapstore.manage.catalog import list_snapshots_sharing, resolve_fingerprint
from snapstore.manage.gc import find_garbage
from snapstore.read.prefetch import ReadStats
from snapstore.storage.simulate import Faults, faulty_store, simulated_store
from snapstore.storage.store import Store
from snapstore.verdict import analyze
from snapstore.write.engines import usable_cores

from .common import Context, human_bytes, table

__all__ = ["COMMANDS", "Duration", "Rate", "preview"]

# A preview shows this much of a value: enough to recognise it, one line per field.
_HEAD_VALUES = 8
_HEAD_CHARS = 40
_HEAD_BYTES = 32


# -- previews -------------------------------------------------------------------------------


def _json_number(x: Any) -> Any:
    """A JSON-able number: numpy scalars as Python ones, NaN and infinities as None."""
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, complex):
        return [_json_number(x.real), _json_number(x.imag)]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _array_preview(a: np.ndarray[Any, Any]) -> dict[str, Any]:
    flat = a.reshape(-1)
    # Statistics over finite real values: NaN would hide the range, complex has no order.
    values = flat[np.isfinite(flat)] if flat.dtype.kind == "f" else flat
    stats: dict[str, Any] = {"min": None, "max": None, "mean": None}
    if values.size and values.dtype.kind != "c":
        stats = {
            "min": _json_number(values.min()),
            "max": _json_number(values.max()),
            "mean": _json_number(float(values.mean())),
        }
    head = [_json_number(v) for v in flat[:_HEAD_VALUES].tolist()]
    return {"dtype": str(a.dtype), "shape": list(a.shape), **stats, "head": head}


def preview(value: Any) -> Any:
    """The ``--json`` preview of one field value (see docs/cli.md, ``snapstore head``).

    Arrays: ``{"dtype", "shape", "min", "max", "mean", "head"}``; ``str`` and ``bytes``:
    ``{"type", "length", "head"}``; lists of str or bytes: ``{"type": "list", "length",
    "head"}`` (previews of the first items); nested dicts: ``{"type": "dict", "fields"}``
    (key to preview); ``int``, ``float``, ``bool`` and None: the value itself.
    """
    if isinstance(value, dict):
        return {"type": "dict", "fields": {k: preview(v) for k, v in value.items()}}
    if isinstance(value, list):
        items = [preview(v) for v in value[:_HEAD_VALUES]]
        return {"type": "list", "length": len(value), "head": items}
    if isinstance(value, np.ndarray) or (isinstance(value, np.generic) and value.dtype.kind == "c"):
        return _array_preview(np.asarray(value))
    if isinstance(value, str):
        return {"type": "str", "length": len(value), "head": value[:_HEAD_CHARS]}
    if isinstance(value, bytes):
        head = repr(value[:_HEAD_BYTES])[2:-1]  # printable ASCII as is, the rest as \xNN
        return {"type": "bytes", "length": len(value), "head": head}
    return _json_number(value)


def _format_number(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def _format_preview(p: Any) -> str:
    """One line for a preview, as ``head`` prints it."""
    if isinstance(p, dict) and "dtype" in p:
        shape = ",".join(str(d) for d in p["shape"])
        more = ", ..." if math.prod(p["shape"]) > len(p["head"]) else ""
        head = ", ".join(_format_number(v) for v in p["head"])
        stats = " ".join(f"{k}={_format_number(p[k])}" for k in ("min", "max", "mean"))
        return f"{p['dtype']}[{shape}] {stats} [{head}{more}]"
    if isinstance(p, dict) and p["type"] == "dict":
        return "{" + ", ".join(f"{k}: {_format_preview(v)}" for k, v in p["fields"].items()) + "}"
    if isinstance(p, dict) and p["type"] == "list":
        more = ", ..." if p["length"] > len(p["head"]) else ""
        items = ", ".join(_format_preview(v) for v in p["head"])
        return f"[{items}{more}] ({p['length']} items)"
    if isinstance(p, dict):
        cut = "..." if p["length"] > len(p["head"]) and p["type"] == "str" else ""
        cut = "..." if p["type"] == "bytes" and p["length"] > _HEAD_BYTES else cut
        quote = "b'" if p["type"] == "bytes" else "'"
        unit = "chars" if p["type"] == "str" else "bytes"
        return f"{quote}{p['head']}'{cut} ({p['length']} {unit})"
    return "-" if p is None else str(p)


@click.command("head")
@click.argument("fingerprint")
@click.option(
    "-n",
    "count",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="How many samples, from the first in written order.",
)
@click.option(
    "--field",
    "fields",
    multiple=True,
    metavar="NAME",
    help="Show only this field (repeat for several).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.pass_obj
def head_command(
    obj: Context, fingerprint: str, count: int, fields: tuple[str, ...], as_json: bool
) -> None:
    """Show the first samples of a snapshot, one line per field."""
    with snapstore.open(fingerprint, root=obj.store) as snap:
        names = snap.schema.names
        unknown = [f for f in fields if f not in names]
        if unknown:
            raise click.UsageError(
                f"no field {', '.join(map(repr, unknown))} in snapshot {snap.fingerprint}; "
                f"its fields are: {', '.join(names)}"
            )
        shown = list(dict.fromkeys(fields)) or names
        samples = []
        for i in range(min(count, len(snap))):
            sample = snap[i]
            samples.append({name: preview(sample[name]) for name in shown})
        total = len(snap)
    if as_json:
        click.echo(json.dumps({"fingerprint": snap.fingerprint, "samples": samples}, indent=2))
        return
    width = max(len(n) for n in shown)
    for i, sample in enumerate(samples):
        click.echo(f"sample {i}")
        for name, p in sample.items():
            click.echo(f"  {name:<{width}}  {_format_preview(p)}")
    click.echo(f"{len(samples)} of {total} sample(s) of {snap.fingerprint}")


# -- bench ----------------------------------------------------------------------------------

_NUMBER = r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*"
if TYPE_CHECKING:
    _FloatParam = click.ParamType[float]
    _RatesParam = click.ParamType[dict[str, float]]
    _IntParam = click.ParamType[int]
else:  # click < 8.3's ParamType is not generic at run time
    _FloatParam = _IntParam = _RatesParam = click.ParamType
_SECONDS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}
_BYTES = {"": 1.0, "b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9}
_BYTES |= {"kib": 2.0**10, "mib": 2.0**20, "gib": 2.0**30}


class Duration(_FloatParam):
    """Seconds from ``50ms``, ``0.05s``, ``50us`` or a plain number of seconds (``0.05``)."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        match = re.fullmatch(_NUMBER + r"(s|ms|us|µs)?\s*", str(value))
        seconds = float(match[1]) * _SECONDS[match[2] or ""] if match else math.inf
        if not math.isfinite(seconds):
            self.fail(
                f"expected a duration such as 50ms, 0.05s or 0.05 (seconds), found {value!r}",
                param,
                ctx,
            )
        return seconds


class FaultRates(_RatesParam):
    """``NAME=VALUE,...`` of :class:`snapstore.storage.simulate.Faults`' settings, checked as
    ``Faults`` checks them: ``error_rate=0.03,throttle_rate=0.01,short_body=0.01``."""

    name = "faults"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> dict[str, float]:
        if isinstance(value, dict):
            return value
        known = [f for f in Faults.__dataclass_fields__ if f != "seed"]
        settings: dict[str, float] = {}
        for item in str(value).split(","):
            name, sep, number = item.strip().partition("=")
            if not sep or name not in known:
                self.fail(
                    f"expected NAME=VALUE pairs separated by commas, NAME one of "
                    f"{', '.join(known)}, found {item.strip()!r} in {value!r}",
                    param,
                    ctx,
                )
            try:
                settings[name] = float(number)
            except ValueError:
                self.fail(f"expected a number for {name}, found {number!r}", param, ctx)
        try:
            Faults(**settings)  # type: ignore[arg-type]
        except ValueError as exc:
            self.fail(f"{exc} (in {value!r})", param, ctx)
        return settings


class Rate(_FloatParam):
    """Bytes per second from ``200MB/s``, ``1.5GB/s``, ``100MiB/s`` or a number (``200e6``)."""

    name = "rate"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        match = re.fullmatch(_NUMBER + r"([kmg]i?b|b)?\s*(?:/s)?\s*", str(value), re.IGNORECASE)
        rate = float(match[1]) * _BYTES[(match[2] or "").lower()] if match else 0.0
        if not (rate > 0 and math.isfinite(rate)):
            self.fail(
                f"expected a rate > 0 such as 200MB/s, 1.5GB/s, 100MiB/s or 200e6 (bytes per "
                f"second), found {value!r}",
                param,
                ctx,
            )
        return rate


class Size(_IntParam):
    """Bytes from ``32MiB``, ``64MB``, ``1GiB`` or a plain number (``33554432``), at least 1."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        match = re.fullmatch(_NUMBER + r"([kmg]i?b|b)?\s*", str(value), re.IGNORECASE)
        size = float(match[1]) * _BYTES[(match[2] or "").lower()] if match else 0.0
        if not (1 <= size < math.inf):
            self.fail(
                f"expected a size >= 1 byte such as 32MiB, 64MB or 33554432, found {value!r}",
                param,
                ctx,
            )
        return int(size)


def _read_epochs(
    snap: snapstore.Snapshot,
    epochs: int,
    batch_size: int,
    options: snapstore.ReaderOptions,
    workers: int,
) -> tuple[list[ReadStats], float, float]:
    """Read ``epochs`` epochs; the stats of each, the seconds to the first batch, in all."""
    reader = snap.batches(batch_size, options, num_workers=workers)
    per_epoch: list[ReadStats] = []
    first: float | None = None
    start = time.perf_counter()
    try:
        for epoch in range(epochs):
            reader.set_epoch(epoch)
            for _ in reader:
                if first is None:
                    first = time.perf_counter() - start
            per_epoch.append(reader.stats())
    finally:
        reader.close()
    return per_epoch, first if first is not None else math.nan, time.perf_counter() - start


def _bench_result(per_epoch: Sequence[ReadStats], first: float, wall: float) -> dict[str, Any]:
    """The ``results`` object of ``bench --json``: all epochs together."""
    requests = sum(s.requests for s in per_epoch)
    samples, nbytes = sum(s.samples for s in per_epoch), sum(s.bytes for s in per_epoch)
    reader_wall = sum(s.wall for s in per_epoch)
    timed = [s for s in per_epoch if s.requests and not math.isnan(s.latency_mean)]
    mean = (
        sum(s.latency_mean * s.requests for s in timed) / sum(s.requests for s in timed)
        if timed
        else math.nan
    )
    p95 = max((s.latency_p95 for s in timed), default=math.nan)
    busy = sum(s.concurrency * s.wall for s in per_epoch)
    stall = sum(s.stall for s in per_epoch)
    return {
        "samples": samples,
        "batches": sum(s.batches for s in per_epoch),
        "bytes": nbytes,
        "seconds": round(wall, 6),
        "samples_per_s": _json_number(round(samples / wall, 1) if wall > 0 else math.nan),
        "bytes_per_s": _json_number(round(nbytes / wall, 1) if wall > 0 else math.nan),
        "first_batch_s": _json_number(round(first, 6)),
        "stall_fraction": round(stall / reader_wall, 4) if reader_wall > 0 else 0.0,
        "requests": requests,
        "latency_mean_s": _json_number(round(mean, 6)),
        "latency_p95_s": _json_number(round(p95, 6)),
        "concurrency": round(busy / reader_wall, 3) if reader_wall > 0 else 0.0,
    }


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f} ms"


def _format_bench(data: dict[str, Any]) -> str:
    s, r, sim = data["settings"], data["results"], data["simulated"]
    order = "shuffled" if s["shuffle"] else "in written order"
    lines = [
        f"snapshot        {data['fingerprint']}",
        f"read            {s['epochs']} epoch(s), {order}, batches of {s['batch_size']}",
    ]
    if s["workers"] > 1:
        lines.append(
            f"consumer        worker 0 of {s['workers']} (its share only, as one DataLoader "
            f"worker reads)"
        )
    if sim is not None:
        bandwidth = "unlimited" if sim["bandwidth"] is None else f"{sim['bandwidth'] / 1e6:g} MB/s"
        lines.append(f"simulated       ttfb {_ms(sim['ttfb'])}, {bandwidth} per request")
    faults = data.get("simulated_faults")
    if faults is not None:
        asked = ", ".join(f"{k} {v:g}" for k, v in faults["settings"].items())
        met = ", ".join(f"{k} x{n}" for k, n in sorted(faults["met"].items())) or "none"
        lines.append(f"faults          {asked} (seed {faults['seed']}); met: {met}")
    rate = r["bytes_per_s"]
    per_s = "-" if r["samples_per_s"] is None else f"{r['samples_per_s']:,.0f}"
    lines += [
        f"samples         {r['samples']} in {r['batches']} batch(es), {r['seconds']:.3f} s",
        f"throughput      {per_s} samples/s, "
        f"{'-' if rate is None else f'{rate / 1e6:.1f}'} MB/s ({human_bytes(r['bytes'])} read)",
        f"first batch     {_ms(r['first_batch_s'])}",
        f"stall           {r['stall_fraction']:.1%} of the reader's time waiting for data",
        f"requests        {r['requests']}, latency mean {_ms(r['latency_mean_s'])}, "
        f"p95 {_ms(r['latency_p95_s'])}"
        if r["latency_mean_s"] is not None
        else f"requests        {r['requests']} (local reads: latency not measured)",
        f"concurrency     {r['concurrency']:.1f} requests in flight on average",
    ]
    return "\n".join(lines)


@click.command("bench")
@click.argument("fingerprint")
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True)
@click.option(
    "--shuffle/--no-shuffle",
    default=True,
    show_default=True,
    help="Read in shuffled order, as training does, or in written order.",
)
@click.option("--epochs", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Read the share of worker 0 of this many (one DataLoader worker's reads).",
)
@click.option(
    "--simulate-ttfb",
    type=Duration(),
    default=None,
    help="Delay every request by this time to first byte (e.g. 50ms), as a bucket would.",
)
@click.option(
    "--simulate-bandwidth",
    type=Rate(),
    default=None,
    help="Limit each request to this rate (e.g. 200MB/s), as a bucket would.",
)
@click.option(
    "--simulate-faults",
    type=FaultRates(),
    default=None,
    help="Fail requests as a bucket does, e.g. error_rate=0.03,throttle_rate=0.01,short_body=0.01 "
    "(faulty_store's settings); the store's retries answer them.",
)
@click.option("--fault-seed", type=int, default=0, show_default=True, help="Which requests fail.")
@click.option("--seed", type=int, default=None, help="Shuffle seed (default 0).")
@click.option(
    "--window-bytes", type=Size(), default=None, help="Shuffle window, e.g. 32MiB (the default)."
)
@click.option(
    "--prefetch-bytes",
    type=Size(),
    default=None,
    help="Decoded bytes read ahead, e.g. 256MiB (default: the reader's, see ReaderOptions).",
)
@click.option(
    "--max-requests",
    type=click.IntRange(min=1),
    default=None,
    help="Cap on requests in flight (default: the reader's).",
)
@click.option(
    "--decode-threads",
    type=click.IntRange(min=1),
    default=None,
    help="Decoding threads (default: min(4, CPUs)).",
)
@click.option(
    "--trace",
    "trace_path",
    default=None,
    metavar="PATH",
    help="Record the read into this trace file (Chrome trace JSON, for Perfetto) and print "
    "the verdict on what limits it after the table.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.pass_obj
def bench_command(
    obj: Context,
    fingerprint: str,
    batch_size: int,
    shuffle: bool,
    epochs: int,
    workers: int,
    simulate_ttfb: float | None,
    simulate_bandwidth: float | None,
    simulate_faults: dict[str, float] | None,
    fault_seed: int,
    seed: int | None,
    window_bytes: int | None,
    prefetch_bytes: int | None,
    max_requests: int | None,
    decode_threads: int | None,
    trace_path: str | None,
    as_json: bool,
) -> None:
    """Read a snapshot as training would and report throughput, stalls and requests; with
    --trace, where the time went and what limits."""
    chosen: dict[str, Any] = {
        "seed": seed,
        "window_bytes": window_bytes,
        "prefetch_bytes": prefetch_bytes,
    }
    chosen |= {"max_requests": max_requests, "decode_threads": decode_threads}
    chosen = {name: value for name, value in chosen.items() if value is not None}
    options = snapstore.ReaderOptions(shuffle=shuffle, **chosen)
    full = resolve_fingerprint(obj.store, fingerprint)
    simulated: dict[str, Any] | None = None
    store: Store = obj.store
    if simulate_ttfb is not None or simulate_bandwidth is not None:
        simulated = {"ttfb": simulate_ttfb or 0.0, "bandwidth": simulate_bandwidth}
        store = simulated_store(obj.store, ttfb=simulated["ttfb"], bandwidth=simulate_bandwidth)
    if simulate_faults is not None:
        rates: dict[str, Any] = dict(simulate_faults)
        store = faulty_store(store, seed=fault_seed, **rates)
    recording = snapstore.trace(trace_path) if trace_path else contextlib.nullcontext()
    with recording, snapstore.open(full, root=store) as snap:
        per_epoch, first, wall = _read_epochs(snap, epochs, batch_size, options, workers)
    settings: dict[str, Any] = {"batch_size": batch_size, "shuffle": shuffle, "epochs": epochs}
    settings |= {"workers": workers, "worker": 0} | chosen
    data = {
        "fingerprint": full,
        "root": obj.store.url,
        "settings": settings,
        "simulated": simulated,
        "results": _bench_result(per_epoch, first, wall),
    }
    if simulate_faults is not None:
        met = dict(getattr(getattr(store, "fs", None), "injected", {}))
        data["simulated_faults"] = {"settings": simulate_faults, "seed": fault_seed, "met": met}
    verdict = analyze(trace_path, cpus=usable_cores()) if trace_path else None
    if verdict is not None:
        data["trace"] = {"path": trace_path, "verdict": verdict.as_dict()}
    click.echo(json.dumps(data, indent=2) if as_json else _format_bench(data))
    if verdict is not None and not as_json:
        click.echo(f"\n{verdict.text()}")


# -- du -------------------------------------------------------------------------------------


# States of snapshot directories other than committed, as describe() reports them.
_OTHER_STATES = ("writing", "incomplete", "corrupt")


def _usage(store: Store) -> dict[str, Any]:
    """The object ``du --json`` prints. A partition several snapshots share (format version 4)
    is counted once: in its stage's row, and in the total."""
    infos, sharing = list_snapshots_sharing(store)
    stages: dict[str | None, dict[str, Any]] = {}
    members: dict[str | None, list[str]] = {}
    others = {state: {"snapshots": 0, "bytes": 0} for state in _OTHER_STATES}
    for info in infos:
        own = info["bytes"] - info.get("partition_bytes", 0)
        if info["state"] == "committed":
            name = info.get("stage")
            row = stages.setdefault(name, {"stage": name, "snapshots": 0, "bytes": 0})
            members.setdefault(name, []).append(info["fingerprint"])
        else:  # a state added later is counted as incomplete rather than lost
            row = others.get(info["state"], others["incomplete"])
        row["snapshots"] += 1
        row["bytes"] += own
    for name, row in stages.items():
        refs = {r for fp in members[name] for r in sharing.refs.get(fp, ())}
        shared = [r for r in refs if sharing.shared(r)]
        row["bytes"] += sum(sharing.sizes.get(r, 0) for r in refs)
        row["partitions"] = len(refs)
        row["shared_bytes"] = sum(sharing.sizes.get(r, 0) for r in shared)
    loose = sharing.unreferenced()
    shared = [r for r in sharing.users if sharing.shared(r)]
    garbage = find_garbage(store, min_age=0)
    own_total = sum(i["bytes"] - i.get("partition_bytes", 0) for i in infos)
    return {
        "root": store.url,
        "stages": sorted(stages.values(), key=lambda r: (-r["bytes"], str(r["stage"]))),
        **others,
        "unreferenced_partitions": {"partitions": len(loose), "bytes": sum(loose.values())},
        "garbage": {"items": len(garbage), "bytes": sum(g.bytes for g in garbage)},
        "shared_bytes": sum(sharing.sizes.get(r, 0) for r in shared),
        "saved_bytes": sum((len(sharing.users[r]) - 1) * sharing.sizes.get(r, 0) for r in shared),
        "total_bytes": own_total + sum(sharing.sizes.values()),
    }


def _format_usage(usage: dict[str, Any]) -> str:
    parted = (
        any(r["partitions"] for r in usage["stages"])
        or usage["unreferenced_partitions"]["partitions"]
    )
    rows = [
        [r["stage"] or "-", str(r["snapshots"]), human_bytes(r["bytes"]),
         str(r["partitions"]), human_bytes(r["shared_bytes"])]
        for r in usage["stages"]
    ]  # fmt: skip
    for state in _OTHER_STATES:
        if usage[state]["snapshots"]:
            row = usage[state]
            rows.append([f"({state})", str(row["snapshots"]), human_bytes(row["bytes"]), "-", "-"])
    loose = usage["unreferenced_partitions"]
    count = sum(int(r[1]) for r in rows)
    if loose["partitions"]:
        rows.append(
            ["(partitions no snapshot uses)", "-", human_bytes(loose["bytes"]),
             str(loose["partitions"]), "-"]
        )  # fmt: skip
    header = ["STAGE", "SNAPSHOTS", "SIZE", "PARTITIONS", "SHARED"]
    if not parted:  # the partition columns only where there are partitions
        rows, header = [r[:3] for r in rows], header[:3]
    lines = [table(rows, header)] if rows else []
    lines.append(
        f"total: {count} snapshot(s), {human_bytes(usage['total_bytes'])} under {usage['root']}"
    )
    if usage["shared_bytes"]:
        lines.append(
            f"shared: {human_bytes(usage['shared_bytes'])} in partitions that several snapshots "
            f"use, counted once (sharing saves {human_bytes(usage['saved_bytes'])})"
        )
    g = usage["garbage"]
    lines.append(
        f"reclaimable by gc: {human_bytes(g['bytes'])} in {g['items']} item(s) "
        "(failed attempts and stale claims; `snapstore gc` removes them)"
        if g["items"]
        else "reclaimable by gc: nothing"
    )
    return "\n".join(lines)


@click.command("du")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_obj
def du_command(obj: Context, as_json: bool) -> None:
    """Show the bytes under the root by stage, and what gc could reclaim."""
    usage = _usage(obj.store)
    click.echo(json.dumps(usage, indent=2) if as_json else _format_usage(usage))


COMMANDS: list[click.Command] = [head_command, bench_command, du_command]
