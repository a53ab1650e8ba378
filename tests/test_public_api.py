"""The public surface, pinned (as httpx pins its ``__all__``).

A name added to or removed from ``snapstore.__all__`` or from one of its main modules is a
change to the API: make it here on purpose, with a CHANGELOG entry. Names that moved to another
module stay importable from where users import them, as the same objects."""

from __future__ import annotations

import importlib

import pytest

import snapstore

SNAPSTORE_ALL = [
    "AmbiguousFingerprintError",
    "BatchReader",
    "BusyError",
    "Columns",
    "CorruptBlockError",
    "FORMAT_VERSION",
    "Field",
    "Fingerprint",
    "FingerprintError",
    "FormatError",
    "FsspecStore",
    "InputError",
    "Inputs",
    "LocalStore",
    "ReadStats",
    "ReaderOptions",
    "ResumeError",
    "RetryPolicy",
    "Schema",
    "SchemaError",
    "Snapshot",
    "SnapshotNotFoundError",
    "SnapshotRemovedError",
    "SnapstoreError",
    "Stage",
    "StageError",
    "Store",
    "StoreError",
    "WriteOptions",
    "default_root",
    "files",
    "nullable",
    "open",
    "open_store",
    "snapshot",
]

# Modules of an optional extra, skipped where it is not installed.
OPTIONAL = {"torch", "grain", "tensorflow", "ray"}

MODULE_ALL = {
    "errors": [
        "AmbiguousFingerprintError",
        "BusyError",
        "CorruptBlockError",
        "FingerprintError",
        "FormatError",
        "ResumeError",
        "SchemaError",
        "SnapshotExistsError",
        "SnapshotNotFoundError",
        "SnapshotRemovedError",
        "SnapstoreError",
        "StageError",
        "StoreError",
    ],
    "store": [
        "ATOMIC_CREATE_PROTOCOLS",
        "FsspecStore",
        "KNOWN_OPENERS",
        "LocalStore",
        "RetryPolicy",
        "Store",
        "default_root",
        "open_store",
    ],
    "schema": ["Field", "FieldKind", "SUPPORTED_DTYPES", "Schema", "check_names"],
    "fields": [
        "DECLARE_HINT",
        "Field",
        "FieldKind",
        "SCALAR_KINDS",
        "SUPPORTED_DTYPES",
        "check_dtype",
    ],
    "declare": ["Nullable", "declaration_of", "field_from_declaration", "nullable"],
    "retry": [
        "KIND_ERRNOS",
        "KIND_HINTS",
        "RetryPolicy",
        "classify_failure",
        "http_status",
        "no_such_bucket",
        "vanished_error",
    ],
    "cache": [
        "BlockCache",
        "CacheScan",
        "CachedStore",
        "block_key",
        "cached_store",
        "default_cache_dir",
        "user_cache_base",
    ],
    "webhdfs": ["WebHDFSStore", "open_webhdfs"],
    "simulate": ["LIST_PAGE", "LatencyFileSystem", "Request", "round_trips", "simulated_store"],
    "travel": ["portable", "reopen"],
    "pins": ["Pin", "PinInfo", "ReadGuard", "last_read", "list_pins", "live_pins", "pin"],
    "fingerprint": [
        "FINGERPRINT_SCHEME",
        "Fingerprint",
        "Hasher",
        "diff_parts",
        "fingerprint_key",
        "fingerprint_stage",
        "hash_code",
        "hash_value",
    ],
    "inputs": ["InputError", "Inputs", "files"],
    "reader": [
        "SnapshotMetadata",
        "SnapshotReader",
        "load_manifest",
        "read_metadata",
        "read_record",
        "removed_message",
    ],
    "prefetch": ["Concurrency", "Prefetcher", "PrefetcherClosedError", "ReadStats"],
    "batches": ["BatchReader"],
    "writer": ["Columns", "ProgressCallback", "SnapshotWriter", "WriteOptions"],
    "engines": [
        "CannotTravelError",
        "DaskEngine",
        "Engine",
        "KNOWN_EXECUTORS",
        "PartitionResult",
        "PartitionTask",
        "ProcessEngine",
        "RayEngine",
        "THREAD_VARIABLES",
        "ThreadEngine",
        "load_executor",
        "make_engine",
        "run_partition",
        "thread_pool_env",
        "usable_cores",
    ],
    "catalog": [
        "describe",
        "diff_snapshots",
        "list_fingerprints",
        "list_snapshots",
        "previous_of_stage",
        "remove_snapshot",
        "resolve_fingerprint",
        "stored_fingerprint",
    ],
    "gc": ["Garbage", "Policy", "collect_garbage", "find_garbage", "select_snapshots"],
    "verify": [
        "ProgressCallback",
        "VerifyReport",
        "WARNING_KINDS",
        "plan_ranges",
        "verify_snapshot",
    ],
    "copy": ["CopyProgress", "CopyResult", "copy_run_name", "copy_snapshot"],
    "handle": ["SnapshotHandle", "portable", "reopen"],
    "torch": ["RaggedList", "SnapshotDataset", "SnapshotIterableDataset", "to_tensors"],
    "grain": ["SnapshotSource"],
    "tensorflow": ["TFReader", "element_spec", "to_dataset"],
    "ray": [
        "PartitionWritten",
        "RayExecutor",
        "SnapshotDatasink",
        "SnapshotDatasource",
        "SnapshotExistsError",
        "block_columns",
        "block_samples",
        "read_snapshot",
        "write_snapshot",
    ],
}


def test_snapstore_all_is_pinned() -> None:
    assert sorted(snapstore.__all__) == SNAPSTORE_ALL
    assert len(set(snapstore.__all__)) == len(snapstore.__all__)
    for name in snapstore.__all__:
        assert getattr(snapstore, name) is not None, name


@pytest.mark.parametrize("module", sorted(MODULE_ALL))
def test_module_all_is_pinned(module: str) -> None:
    if module in OPTIONAL:
        pytest.importorskip(module)
    found = importlib.import_module(f"snapstore.{module}")
    assert sorted(found.__all__) == MODULE_ALL[module]
    for name in found.__all__:
        assert hasattr(found, name), f"snapstore.{module}.{name}"


@pytest.mark.parametrize(
    ("old", "new", "names"),
    [
        ("schema", "fields", ["Field", "FieldKind", "SUPPORTED_DTYPES"]),
        ("handle", "travel", ["portable", "reopen"]),
        ("store", "roots", ["default_root"]),
    ],
)
def test_moved_names_stay_importable(old: str, new: str, names: list[str]) -> None:
    for name in names:
        moved = getattr(importlib.import_module(f"snapstore.{new}"), name)
        assert getattr(importlib.import_module(f"snapstore.{old}"), name) is moved, name
