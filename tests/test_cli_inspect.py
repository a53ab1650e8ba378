"""``snapstore head``, ``bench`` and ``du`` through click's CliRunner, on local and memory roots."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

import snapstore
from snapstore.cli.main import main
from snapstore.storage.store import Store


def mixed(n: int):
    for i in range(n):
        yield {
            "image": np.arange(24, dtype=np.int32).reshape(2, 3, 4) + i,
            "weights": np.array([0.5, np.nan, 1.5 + i], np.float32),
            "text": "word " * (i + 1) * 10,
            "blob": b"\x00ab" + bytes([i]) * 40,
            "label": i,
            "score": i / 2,
            "flag": i % 2 == 0,
        }


def numbers(n: int):
    for i in range(n):
        yield {"x": np.full(8, i, np.float32), "label": i}


def run(store: Store, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["--root", store.url, *args], catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture
def snap(store: Store) -> snapstore.Snapshot:
    return snapstore.snapshot(mixed, root=store)(6).materialize()


# -- head -----------------------------------------------------------------------------------


def test_head_previews_every_kind(store: Store, snap: snapstore.Snapshot) -> None:
    code, out = run(store, "head", snap.fingerprint[:10])
    assert code == 0, out
    assert out.count("sample ") == 5 and "5 of 6 sample(s)" in out
    assert "int32[2,3,4] min=0 max=23 mean=11.5 [0, 1, 2, 3, 4, 5, 6, 7, ...]" in out
    assert "float32[3] min=0.5 max=1.5 mean=1 [0.5, -, 1.5]" in out  # NaN: not in the stats
    assert "'word word word word word word word word '... (50 chars)" in out
    assert "b'\\x00ab\\x00\\x00" in out and "(43 bytes)" in out
    assert "  label    0\n" in out and "score    0.0" in out and "flag     True" in out


def test_head_count_and_fields(store: Store, snap: snapstore.Snapshot) -> None:
    code, out = run(store, "head", snap.fingerprint, "-n", "2", "--field", "label")
    assert code == 0
    assert out.count("sample ") == 2 and "label" in out and "image" not in out
    code, out = run(store, "head", snap.fingerprint, "-n", "100", "--json")
    assert len(json.loads(out)["samples"]) == 6


def test_head_unknown_field_lists_fields(store: Store, snap: snapstore.Snapshot) -> None:
    code, out = run(store, "head", snap.fingerprint, "--field", "nope")
    assert code == 2
    assert "no field 'nope'" in out and "image, weights, text, blob, label, score, flag" in out


def test_head_json_shape(store: Store, snap: snapstore.Snapshot) -> None:
    code, out = run(store, "head", snap.fingerprint, "-n", "2", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["fingerprint"] == snap.fingerprint and len(data["samples"]) == 2
    s = data["samples"][1]
    assert list(s) == ["image", "weights", "text", "blob", "label", "score", "flag"]
    assert s["image"] == {
        "dtype": "int32",
        "shape": [2, 3, 4],
        "min": 1,
        "max": 24,
        "mean": 12.5,
        "head": [1, 2, 3, 4, 5, 6, 7, 8],
    }
    assert s["weights"]["head"] == [0.5, None, 2.5] and s["weights"]["max"] == 2.5
    assert s["text"] == {"type": "str", "length": 100, "head": ("word " * 8)}
    assert s["blob"] == {"type": "bytes", "length": 43, "head": "\\x00ab" + "\\x01" * 29}
    assert (s["label"], s["score"], s["flag"]) == (1, 0.5, False)


def test_head_unknown_fingerprint(store: Store, snap: snapstore.Snapshot) -> None:
    code, out = run(store, "head", "zzzz")
    assert code == 1 and "error: no committed snapshot matches 'zzzz'" in out


# -- bench ----------------------------------------------------------------------------------


def test_bench_json_one_epoch_in_order(store: Store) -> None:
    snap = snapstore.snapshot(numbers, root=store)(300).materialize()
    code, out = run(
        store, "bench", snap.fingerprint, "--no-shuffle", "--batch-size", "64", "--json"
    )
    assert code == 0, out
    data = json.loads(out)
    assert data["fingerprint"] == snap.fingerprint and data["simulated"] is None
    assert data["settings"] == {
        "batch_size": 64,
        "shuffle": False,
        "epochs": 1,
        "workers": 1,
        "worker": 0,
    }
    r = data["results"]
    assert set(r) == {
        "samples", "batches", "bytes", "seconds", "samples_per_s", "bytes_per_s",
        "first_batch_s", "stall_fraction", "requests", "latency_mean_s", "latency_p95_s",
        "concurrency",
    }  # fmt: skip
    assert r["samples"] == 300 and r["batches"] == 5 and r["bytes"] > 0 and r["requests"] >= 1
    assert 0 <= r["stall_fraction"] <= 1 and r["samples_per_s"] > 0
    assert 0 < r["first_batch_s"] <= r["seconds"]


def test_bench_simulated_bucket_and_workers(store: Store) -> None:
    snap = snapstore.snapshot(numbers, root=store)(300).materialize()
    args = ["--simulate-ttfb", "10ms", "--simulate-bandwidth", "1GB/s", "--workers", "4"]
    code, out = run(store, "bench", snap.fingerprint, "--epochs", "2", *args, "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["simulated"] == {"ttfb": 0.01, "bandwidth": 1e9}
    r = data["results"]
    assert r["samples"] == 2 * math.ceil(300 / 4) and r["requests"] >= 1
    assert r["latency_mean_s"] >= 0.0099 and r["latency_p95_s"] >= 0.0099
    code, out = run(store, "bench", snap.fingerprint, *args)
    assert code == 0
    assert "worker 0 of 4" in out and "ttfb 10.0 ms, 1000 MB/s per request" in out
    assert "samples/s" in out and "first batch" in out and "stall" in out


def test_bench_through_simulated_faults_reads_every_sample(store: Store) -> None:
    """Faults injected (5% of the requests fail with a 503, 2% of bodies cut short) over 250
    blocks read in small windows: the store's retries answer them, the epochs are whole, and
    the report says what was met."""
    options = snapstore.WriteOptions(block_bytes=256, block_min_rows=8)
    snap = snapstore.snapshot(numbers, root=store, options=options)(2000).materialize()
    faults = "error_rate=0.05,short_body=0.02"
    args = ["--simulate-faults", faults, "--fault-seed", "7", "--epochs", "2", "--batch-size", "50"]
    args += ["--window-bytes", "1KiB"]  # windows of a few blocks: hundreds of requests
    code, out = run(store, "bench", snap.fingerprint, *args, "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["results"]["samples"] == 2 * 2000
    sim = data["simulated_faults"]
    assert sim["settings"] == {"error_rate": 0.05, "short_body": 0.02} and sim["seed"] == 7
    assert sim["met"].get("503", 0) > 0, sim
    code, out = run(store, "bench", snap.fingerprint, *args)
    assert code == 0 and "error_rate 0.05, short_body 0.02 (seed 7); met: " in out, out


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("error_rate", "expected NAME=VALUE pairs"),
        ("typo_rate=0.1", "NAME one of error_rate, throttle_rate"),
        ("error_rate=lots", "expected a number for error_rate, found 'lots'"),
        ("error_rate=0.7,throttle_rate=0.5", "add up to 1.2"),
        ("error_rate=-1", "error_rate must be a finite number >= 0"),
    ],
)
def test_bench_bad_fault_settings(store: Store, value: str, message: str) -> None:
    snap = snapstore.snapshot(numbers, root=store)(10).materialize()
    code, out = run(store, "bench", snap.fingerprint, "--simulate-faults", value)
    assert code == 2 and message in out, out


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--simulate-ttfb", "fast", "expected a duration such as 50ms"),
        ("--simulate-ttfb", "-5ms", "expected a duration"),
        ("--simulate-ttfb", "1e999s", "expected a duration"),
        ("--simulate-bandwidth", "lots", "expected a rate > 0 such as 200MB/s"),
        ("--simulate-bandwidth", "0", "expected a rate > 0"),
    ],
)
def test_bench_bad_values(store: Store, option: str, value: str, message: str) -> None:
    snap = snapstore.snapshot(numbers, root=store)(10).materialize()
    code, out = run(store, "bench", snap.fingerprint, option, value)
    assert code == 2 and message in out and repr(value) in out


def test_units_parse() -> None:
    from snapstore.cli.inspect_cmd import Duration, Rate

    seconds = [Duration().convert(v, None, None) for v in ("50ms", "0.05s", "0.05", "50000us")]
    assert seconds == pytest.approx([0.05] * 4)
    rates = [Rate().convert(v, None, None) for v in ("200MB/s", "0.2 GB/s", "200e6", "200mb")]
    assert rates == pytest.approx([200e6] * 4)
    assert Rate().convert("1MiB/s", None, None) == 1 << 20


# -- du -------------------------------------------------------------------------------------


def test_du_by_stage_with_garbage(store: Store) -> None:
    a = snapstore.snapshot(numbers, root=store)(50).materialize()
    snapstore.snapshot(numbers, root=store)(60).materialize()
    b = snapstore.snapshot(mixed, root=store)(3).materialize()
    # A crashed writer's run, left behind in a fingerprint that never committed.
    store.write_bytes("deadbeef/runs/20200101T000000-h-1-00000000/x", b"x" * 1000)
    code, out = run(store, "du", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["root"] == store.url
    stages = {s["stage"]: s for s in data["stages"]}
    assert stages["test_cli_inspect.numbers"]["snapshots"] == 2
    assert stages["test_cli_inspect.mixed"]["snapshots"] == 1
    assert data["incomplete"] == {"snapshots": 1, "bytes": 1000}
    assert data["writing"] == data["corrupt"] == {"snapshots": 0, "bytes": 0}
    assert data["garbage"]["items"] >= 1 and data["garbage"]["bytes"] >= 1000
    assert data["total_bytes"] == sum(s["bytes"] for s in data["stages"]) + 1000
    by_fp = store.disk_usage(a.fingerprint) + store.disk_usage(b.fingerprint)
    assert data["total_bytes"] > by_fp
    code, out = run(store, "du")
    assert code == 0
    assert "test_cli_inspect.numbers  2" in out and "(incomplete)" in out
    assert "total: 4 snapshot(s)" in out and "reclaimable by gc:" in out


def test_du_empty_root(store: Store) -> None:
    code, out = run(store, "du", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["stages"] == [] and data["total_bytes"] == 0 and data["garbage"]["items"] == 0
    code, out = run(store, "du")
    assert "total: 0 snapshot(s), 0 B" in out and "reclaimable by gc: nothing" in out
