"""The managing operations and readers under faults met on the wire (issue 29): ``cp``,
``verify``, ``rm``, ``gc``, DataLoader workers and a partitioned stage, through
tests/faultproxy.py in front of fake-gcs-server (gcsfs) and moto (s3fs), at the rates of
tests/test_fault_proxy.py (5% of requests failing, 1% acted-then-reset, 1% bodies cut short).

Each test checks the result against the source or a fault-free read (made through the same
proxy with no faults, or straight to the emulator), and that the proxy did inject faults.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import FaultyRoot
from faultproxy import ProxyFaults
from test_fault_proxy import POLICY, RATES, _clean
from test_removal_races import FP as ABANDONED_FP
from test_removal_races import OLD_RUN, abandoned

import snapstore
from snapstore.cli.main import main
from snapstore.errors import SnapshotNotFoundError
from snapstore.manage.catalog import list_fingerprints, list_snapshots, remove_snapshot
from snapstore.manage.copy import copy_snapshot
from snapstore.manage.gc import collect_garbage
from snapstore.manage.verify import verify_snapshot
from snapstore.read.reader import load_manifest
from snapstore.storage.store import FsspecStore, LocalStore, Store
from snapstore.write.writer import WriteOptions

# Small uncompressed shards and blocks: 300 samples make about 25 shards, so that each test
# makes enough requests to meet faults at these rates.
SMALL = WriteOptions(shard_bytes=4096, block_bytes=1024, block_min_rows=1, compression_level=0)
STORES = ["gcs", "s3"]


def rows(n: int, offset: int = 0) -> Iterator[dict[str, Any]]:
    for i in range(offset, offset + n):
        yield {"x": i, "v": np.full(32, i, np.int64)}


def _faulty(request: pytest.FixtureRequest, where: str) -> FaultyRoot:
    faulty: FaultyRoot = request.getfixturevalue(f"{where}_faulty")
    return faulty


def _direct(faulty: FaultyRoot) -> FsspecStore:
    """The same prefix straight on the emulator, bypassing the proxy."""
    options = {**faulty.storage_options, "endpoint_url": faulty.proxy.upstream}
    store = snapstore.open_store(faulty.url, **options)
    assert isinstance(store, FsspecStore)
    return store


def _through_faults(faulty: FaultyRoot, seed: int) -> FsspecStore:
    """A store through the proxy, the faults turned on from now (counted afresh)."""
    faulty.proxy.injected.clear()
    faulty.proxy.requests = 0
    faulty.proxy.faults = ProxyFaults(seed=seed, **RATES)
    store = snapstore.open_store(faulty.url, **faulty.storage_options, retry=POLICY)
    assert isinstance(store, FsspecStore)
    return store


def _faults_met(faulty: FaultyRoot, what: str) -> None:
    """Turn the faults off and check that some were injected."""
    faulty.proxy.faults = ProxyFaults()
    print(f"\n{what}: {faulty.proxy.requests} requests, faults {dict(faulty.proxy.injected)}")
    assert sum(faulty.proxy.injected.values()) > 0, "no fault was injected"


def _values(fp: str, root: Any) -> list[tuple[int, list[int]]]:
    with snapstore.open(fp, root=root) as snap:
        return [(int(s["x"]), s["v"].tolist()) for s in snap]


def _run_files(store: Store, fp: str) -> dict[str, Any]:
    """The committed run's files by name (the manifest parsed, without what names the run, its
    creation second and its origin) and the names of every run present."""
    manifest = load_manifest(store, fp)
    run = manifest["run"]
    names = sorted(n.rsplit("/", 1)[-1] for n in store.list_dir(f"{fp}/runs/{run}"))
    files: dict[str, Any] = {n: bytes(store.read_bytes(f"{fp}/runs/{run}/{n}")) for n in names}
    parsed = json.loads(files.pop("manifest.json"))
    for volatile in ("run", "created_at", "copied_from"):
        parsed.pop(volatile, None)
    files["manifest.json"] = parsed
    return files


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def _option_args(flag: str, options: dict[str, Any]) -> list[str]:
    return [f"{flag}={k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in options.items()]


# -- cp -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", STORES)
def test_cp_to_a_faulty_bucket_is_byte_identical(
    where: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    faulty = _faulty(request, where)
    src = LocalStore(tmp_path / "src")
    by_api = snapstore.snapshot(rows, root=src, options=SMALL)(150).materialize().fingerprint
    by_cli = snapstore.snapshot(rows, root=src, options=SMALL)(100, 1000).materialize().fingerprint
    dst = _through_faults(faulty, seed=11)
    result = copy_snapshot(src, by_api, dst, jobs=8)
    assert result.status == "copied" and result.committed
    dst.close()
    code, out = _cli("--root", str(tmp_path / "src"), "cp", by_cli, faulty.url, "--jobs", "8",
                     *_option_args("--dest-option", faulty.storage_options), "--json")  # fmt: skip
    assert code == 0, out
    assert json.loads(out)["status"] == "copied"
    _faults_met(faulty, f"{where} cp")
    direct = _direct(faulty)
    for fp in (by_api, by_cli):
        copied, source = _run_files(direct, fp), _run_files(src, fp)
        assert len([n for n in copied if n.startswith("shard-")]) > 5
        assert copied == source, fp
        assert direct.list_dir(f"{fp}/runs") == [load_manifest(direct, fp)["run"]]
        assert _values(fp, direct) == _values(fp, src)
    assert _values(by_api, src) == [(i, [i] * 32) for i in range(150)]
    direct.close()


# -- verify -------------------------------------------------------------------------------------


def _block_start(store: Store, fp: str) -> tuple[str, int]:
    """The path of the snapshot's first shard and the offset of its first block."""
    manifest = load_manifest(store, fp)
    path = f"{fp}/runs/{manifest['run']}/{manifest['shards'][0]['path']}"
    return path, 64  # a shard's first block starts at offset 64


@pytest.mark.parametrize("where", STORES)
def test_verify_through_faults_checks_every_block_and_finds_a_flipped_byte(
    where: str, request: pytest.FixtureRequest
) -> None:
    faulty = _faulty(request, where)
    direct = _direct(faulty)
    good = snapstore.snapshot(rows, root=direct, options=SMALL)(200).materialize().fingerprint
    bad = snapstore.snapshot(rows, root=direct, options=SMALL)(200, 5000).materialize().fingerprint
    clean_good = verify_snapshot(direct, good)
    assert clean_good.ok and clean_good.blocks > 20
    path, offset = _block_start(direct, bad)
    data = bytearray(direct.read_bytes(path))
    data[offset + 10] ^= 0x01
    direct.fs.pipe_file(direct.join(path), bytes(data))  # on the emulator, not through the proxy
    store = _through_faults(faulty, seed=12)
    report = verify_snapshot(store, good, jobs=8)
    assert report.ok, report.problems
    assert (report.blocks, report.bytes) == (clean_good.blocks, clean_good.bytes)
    done: list[Any] = []
    thread = threading.Thread(target=lambda: done.append(verify_snapshot(store, bad, jobs=8)))
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "verify of a corrupt snapshot did not end"
    (report,) = done
    assert not report.ok
    assert [(p["kind"], p["shard"], p["offset"]) for p in report.errors] == [
        ("block", path, offset)
    ]
    assert report.blocks == verify_snapshot(direct, bad).blocks  # every block still checked
    store.close()
    # The command line says so too, through the faults, with exit status 1.
    faulty.proxy.faults = ProxyFaults(seed=13, **RATES)
    args = ["--root", faulty.url, *_option_args("--storage-option", faulty.storage_options)]
    code, out = _cli(*args, "verify", good, bad)
    assert code == 1, out
    assert f"OK      {good}" in out and f"FAILED  {bad}" in out and "1 failed" in out
    _faults_met(faulty, f"{where} verify")
    direct.close()


# -- rm and gc ----------------------------------------------------------------------------------


def _tree(store: FsspecStore) -> list[str]:
    """Every file under the root, relative to it."""
    root = store.fs._strip_protocol(store.root).rstrip("/")
    return sorted(p[len(root) + 1 :] for p in store.fs.find(root))


@pytest.mark.parametrize("where", STORES)
def test_rm_and_gc_through_faults(where: str, request: pytest.FixtureRequest) -> None:
    faulty = _faulty(request, where)
    direct = _direct(faulty)
    make = snapstore.snapshot(rows, root=direct, options=SMALL)
    gone = [make(100, 1000 * k).materialize().fingerprint for k in range(1, 6)]
    kept = make(150, 7000).materialize().fingerprint
    kept_files = [p for p in _tree(direct) if p.startswith(f"{kept}/")]
    # Garbage: a crashed writer's run beside the committed one, and an abandoned fingerprint
    # (an old run and an expired claim) with no commit record.
    crashed = f"{kept}/runs/{OLD_RUN}"
    for i in range(3):
        direct.write_bytes(f"{crashed}/shard-{i:05d}.snap", b"x" * 5000)
    abandoned(direct)
    assert ABANDONED_FP in list_fingerprints(direct, committed_only=False)

    store = _through_faults(faulty, seed=14)
    args = ["--root", faulty.url, *_option_args("--storage-option", faulty.storage_options)]
    for fp in gone[:3]:
        assert remove_snapshot(store, fp) > 0
    code, out = _cli(*args, "rm", *gone[3:])
    assert code == 0 and f"removed {gone[3]}" in out and f"removed {gone[4]}" in out, out
    for fp in gone:
        with pytest.raises(SnapshotNotFoundError):
            snapstore.open(fp, root=store)
    removed = {g.path for g in collect_garbage(store, min_age=0)}
    assert {crashed, f"{ABANDONED_FP}/runs/{OLD_RUN}", f"{ABANDONED_FP}/claims"} <= removed
    assert not [p for p in removed if p.startswith(f"{kept}/runs/") and p != crashed], removed
    # again through the command line: nothing left to collect
    code, out = _cli(*args, "gc", "--min-age", "0", "--json")
    assert code == 0, out
    assert json.loads(out)["garbage"] == []
    store.close()
    _faults_met(faulty, f"{where} rm and gc")

    # Nothing half-removed: no file of a removed snapshot or of the garbage; the live one whole
    # (but for the claims its commit left, which are garbage too).
    files = _tree(direct)
    assert not [p for p in files if p.startswith((*gone, ABANDONED_FP))], files
    assert [p for p in files if p.startswith(f"{kept}/")] == [
        p for p in kept_files if not p.startswith(f"{kept}/claims/")
    ]
    assert [s["fingerprint"] for s in list_snapshots(direct)] == [kept]
    assert list_fingerprints(direct, committed_only=False) == [kept]
    for fp in gone:
        with pytest.raises(SnapshotNotFoundError):
            snapstore.open(fp, root=direct)
    assert _values(kept, direct) == [(i, [i] * 32) for i in range(7000, 7150)]
    assert verify_snapshot(direct, kept).ok
    direct.close()


# -- DataLoader workers -------------------------------------------------------------------------


def test_dataloader_workers_read_exact_epochs_through_faults(
    gcs_faulty: FaultyRoot,
) -> None:
    torch = pytest.importorskip("torch")
    from snapstore.torch import SnapshotIterableDataset

    n = 384
    clean = _clean(gcs_faulty)
    fp = snapstore.snapshot(rows, root=clean, options=SMALL)(n).materialize().fingerprint
    clean.close()
    _through_faults(gcs_faulty, seed=15).close()
    # As a user would: the bucket's URL and the storage options that point at the proxy. The
    # store's recipe (filesystem options, retry policy) travels to each worker process.
    snap = snapstore.open(fp, root=gcs_faulty.url, retry=POLICY, **gcs_faulty.storage_options)
    ds = SnapshotIterableDataset(snap, batch_size=16, seed=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    # From here the workers read, this process does not: the faults counted are theirs.
    gcs_faulty.proxy.injected.clear()
    gcs_faulty.proxy.requests = 0
    orders = []
    for epoch in range(2):
        got: list[int] = []
        for batch in loader:
            assert torch.equal(batch["v"], batch["x"][:, None].expand(-1, 32)), epoch
            got += batch["x"].tolist()
        assert sorted(got) == list(range(n)), epoch
        orders.append(got)
    assert orders[0] != orders[1]  # two epochs, two orders
    snap.close()
    _faults_met(gcs_faulty, "gcs DataLoader workers")


# -- partitioned writes -------------------------------------------------------------------------

COMPUTED: list[int] = []  # one entry per item computed
_LOCK = threading.Lock()


def parted(items: list[int]) -> Iterator[dict[str, Any]]:
    for item in items:
        with _LOCK:
            COMPUTED.append(item)
        yield from rows(40, item * 100)


def test_a_partitioned_stage_commits_once_through_faults(gcs_faulty: FaultyRoot) -> None:
    COMPUTED.clear()
    items = list(range(8))
    store = _through_faults(gcs_faulty, seed=16)
    stage = snapstore.snapshot(parted, root=store, partition_by="items", partition_size=2,
                               engine="thread", workers=4, options=SMALL,
                               ignore_globals=["COMPUTED", "_LOCK"])  # fmt: skip
    snap = stage(items).materialize()
    assert sorted(COMPUTED) == items  # each partition computed once
    expected = [(i, [i] * 32) for item in items for i in range(item * 100, item * 100 + 40)]
    assert _values(snap.fingerprint, store) == expected
    store.close()
    _faults_met(gcs_faulty, "gcs partitioned stage")
    direct = _direct(gcs_faulty)
    manifest = load_manifest(direct, snap.fingerprint)
    assert len(manifest["shared_partitions"]) > 1
    for ref in manifest["shared_partitions"]:  # each partition committed once
        assert len(direct.list_dir(f"parts/{ref}/runs")) == 1, ref
    assert direct.list_dir(f"{snap.fingerprint}/runs") == [manifest["run"]]  # committed once
    assert verify_snapshot(direct, snap.fingerprint).ok
    assert _values(snap.fingerprint, direct) == expected
    again = stage(items).materialize()  # found, not computed again
    assert again.fingerprint == snap.fingerprint and sorted(COMPUTED) == items
    direct.close()
