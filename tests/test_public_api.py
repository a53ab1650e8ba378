"""The public surface, pinned (as httpx pins its ``__all__``).

A name added to or removed from ``snapstore.__all__`` or from one of its main modules is a
change to the API: make it here on purpose, with a CHANGELOG entry. Names that moved to another
module stay importable from where users import them, as the same objects."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import snapstore
from snapstore.oldpaths import MOVED

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
    "Mixture",
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
    "StageOptions",
    "Store",
    "StoreError",
    "StoreTimeoutError",
    "WriteOptions",
    "default_root",
    "files",
    "mix",
    "nullable",
    "open",
    "open_store",
    "snapshot",
    "trace",
]

# Modules of an optional extra, skipped where it is not installed.
OPTIONAL = {"torch", "grain", "tensorflow", "ray"}

MODULE_ALL = {
    # the layer subpackages: what each re-exports
    "format": [
        "CommitRecord",
        "EpochPlan",
        "FORMAT_VERSION",
        "Field",
        "PlanOptions",
        "READABLE_VERSIONS",
        "RaggedRows",
        "Schema",
        "nullable",
    ],
    "storage": [
        "CachedStore",
        "FsspecStore",
        "LocalStore",
        "ReadGuard",
        "RetryPolicy",
        "Store",
        "cached_store",
        "default_root",
        "list_pins",
        "live_pins",
        "open_store",
        "simulated_store",
    ],
    "fingerprint": [
        "FINGERPRINT_SCHEME",
        "Fingerprint",
        "InputError",
        "Inputs",
        "diff_parts",
        "files",
        "fingerprint_key",
        "fingerprint_stage",
        "hash_code",
        "hash_value",
    ],
    "read": [
        "BatchReader",
        "Prefetcher",
        "ReadStats",
        "ReaderOptions",
        "SnapshotMetadata",
        "SnapshotReader",
    ],
    "write": [
        "Columns",
        "Engine",
        "PartitionStatus",
        "SnapshotWriter",
        "StageOptions",
        "WriteOptions",
        "make_engine",
        "partition_status",
    ],
    "manage": [
        "CopyResult",
        "Policy",
        "VerifyReport",
        "collect_garbage",
        "copy_snapshot",
        "describe",
        "diff_snapshots",
        "find_garbage",
        "list_snapshots",
        "remove_snapshot",
        "resolve_fingerprint",
        "verify_snapshot",
    ],
    # modules
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
        "StoreTimeoutError",
    ],
    "storage.store": [
        "ATOMIC_CREATE_PROTOCOLS",
        "FsspecStore",
        "KNOWN_OPENERS",
        "LocalStore",
        "RetryPolicy",
        "Store",
        "StoreLike",
        "as_store",
        "default_root",
        "open_store",
    ],
    "storage.base": ["Store", "VANISHED_RETRIES"],
    "storage.local": ["LocalStore", "OS_ERROR_HINTS", "translated"],
    "storage.fsspec_store": ["ATOMIC_CREATE_PROTOCOLS", "FsspecStore"],
    "format.schema": ["Field", "FieldKind", "SUPPORTED_DTYPES", "Schema", "check_names"],
    "format.fields": [
        "DECLARE_HINT",
        "Field",
        "FieldKind",
        "SCALAR_KINDS",
        "SUPPORTED_DTYPES",
        "check_dtype",
    ],
    "format.declare": ["Nullable", "declaration_of", "field_from_declaration", "nullable"],
    "storage.retry": [
        "DEFAULT_STORE_TIMEOUT",
        "KIND_ERRNOS",
        "KIND_HINTS",
        "RetryBudget",
        "RetryPolicy",
        "STORE_TIMEOUT_ENV",
        "classify_failure",
        "http_status",
        "is_throttled",
        "is_timeout",
        "no_such_bucket",
        "retry_after",
        "vanished_error",
    ],
    "storage.deadline": [
        "Deadline",
        "SLOWEST_RATE",
        "Silence",
        "TryAbandoned",
        "await_with_deadline",
        "call_with_deadline",
        "client_options",
        "client_timeouts",
        "endpoint_of",
    ],
    "storage.cache": [
        "BlockCache",
        "CacheScan",
        "CachedStore",
        "block_key",
        "cached_store",
        "default_cache_dir",
        "user_cache_base",
    ],
    "storage.webhdfs": ["WebHDFSStore", "open_webhdfs"],
    "storage.simulate": [
        "FaultFileSystem",
        "Faults",
        "InjectedHTTPError",
        "LIST_PAGE",
        "LatencyFileSystem",
        "Request",
        "ShortBodyError",
        "faulty_store",
        "round_trips",
        "simulated_store",
    ],
    "storage.faults": [
        "FaultFileSystem",
        "Faults",
        "InjectedHTTPError",
        "ShortBodyError",
        "faulty_store",
    ],
    "storage.travel": ["portable", "reopen"],
    "storage.pins": ["Pin", "PinInfo", "ReadGuard", "last_read", "list_pins", "live_pins", "pin"],
    "fingerprint.digest": [
        "FINGERPRINT_SCHEME",
        "Fingerprint",
        "Hasher",
        "combine_parts",
        "declared_digest",
        "diff_parts",
        "fingerprint_key",
        "fingerprint_stage",
        "hash_code",
        "hash_value",
        "upstream_digest",
    ],
    "fingerprint.earlier": [
        "EARLIER_SCHEMES",
        "Naming",
        "SCHEME_FIRST_FORMAT",
        "SCRIPTS_AS_MAIN",
        "earlier_namings",
        "names_script_code",
        "renamed",
    ],
    "fingerprint.inputs": ["InputError", "Inputs", "files"],
    "fingerprint.partition": ["PARTITION_SCHEME", "members", "partition_fingerprint", "stage_key"],
    "read.reader": [
        "SnapshotMetadata",
        "SnapshotReader",
        "load_manifest",
        "read_metadata",
        "read_record",
        "removed_message",
    ],
    "read.prefetch": [
        "Concurrency",
        "PrefetchLimits",
        "Prefetcher",
        "PrefetcherClosedError",
        "ReadStats",
        "SharedDecoders",
    ],
    "read.requests": [
        "Concurrency",
        "MAX_GROWN_BYTES",
        "MAX_LEVEL",
        "RangeRequest",
        "RequestShape",
        "admits",
        "form_requests",
        "reform_requests",
    ],
    "read.crowd": [
        "CROWD_LEVEL",
        "CROWD_READERS",
        "HOST_REQUESTS",
        "MAX_START_DELAY",
        "START_RATE",
        "crowd_start",
        "host_requests",
        "place",
        "read_ahead_delay",
        "start_delay",
    ],
    "read.fleet": ["FleetOptions", "FleetResult", "simulate_fleet", "synthetic_index"],
    "storage.bucket": ["BucketLimits", "TokenBucket"],
    "read.batches": ["BatchReader"],
    "read.consumer": ["ConsumerReader", "consumer_samples", "every_batch"],
    "read.mixture": ["MixSchedule", "apportion", "units_before"],
    "read.mixed": ["MixedBatchReader", "SourceSlice", "source_chunks"],
    "mix": ["Mixture", "mix"],
    "tracing": [
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
    ],
    "verdict": [
        "ADVICE",
        "BUSY",
        "Bottleneck",
        "Consumer",
        "FIRST_WINDOW",
        "INPUT_BOUND",
        "NEAR_CEILING",
        "READ_STAGES",
        "SATURATED",
        "STAGE_CODE",
        "STORE_BUSY",
        "StageTime",
        "Verdict",
        "WRITE_HINTS",
        "WRITE_WORK",
        "WriteTime",
        "analyze",
        "check_events",
        "read_bottleneck",
        "render",
    ],
    "watch": ["Watch", "watch"],
    "write.boundaries": ["BOUNDARY_SCHEME", "content_boundaries", "ends_partition"],
    "write.writer": ["Columns", "ProgressCallback", "SnapshotWriter", "WriteOptions"],
    "write.stageoptions": ["ON_BUSY", "OnBusy", "StageOptions", "StageSettings", "stage_options"],
    "write.upgrade": ["first_committed", "log_earlier", "rewrite"],
    "write.times": ["WriteTimes", "conclusion", "report_times", "summary"],
    "write.jobs": [
        "StageJob",
        "Target",
        "compute",
        "log_found",
        "partition_calls",
        "partition_layout",
        "remove_owned",
        "run_job",
    ],
    "write.engines": [
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
    "manage.catalog": [
        "describe",
        "diff_snapshots",
        "list_fingerprints",
        "list_snapshots",
        "list_snapshots_sharing",
        "previous_of_stage",
        "remove_snapshot",
        "resolve_fingerprint",
        "stored_fingerprint",
    ],
    "manage.gc": [
        "Garbage",
        "Policy",
        "collect_garbage",
        "find_garbage",
        "last_used",
        "select_snapshots",
    ],
    "manage.verify": [
        "ProgressCallback",
        "SharedChecks",
        "VerifyReport",
        "WARNING_KINDS",
        "plan_ranges",
        "verify_snapshot",
    ],
    "manage.release": [
        "PartitionRelease",
        "REMOVER_LEASE",
        "References",
        "Removal",
        "partitions_of",
        "read_references",
        "release_partitions",
        "remove_listed",
        "remove_partitions",
    ],
    "manage.copy": ["CopyProgress", "CopyResult", "copy_run_name", "copy_snapshot"],
    "manage.sharing": [
        "Sharing",
        "diff_partitions",
        "list_partitions",
        "partition_refs",
        "partition_sizes",
        "read_references",
    ],
    "handle": ["SnapshotHandle", "portable", "reopen"],
    "torch": [
        "RaggedList",
        "SnapshotDataset",
        "SnapshotIterableDataset",
        "to_device",
        "to_tensors",
    ],
    "grain": ["SnapshotSource", "mixture_dataset"],
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
        ("format.schema", "format.fields", ["Field", "FieldKind", "SUPPORTED_DTYPES"]),
        ("handle", "storage.travel", ["portable", "reopen"]),
        ("storage.store", "storage.roots", ["default_root"]),
        ("storage.store", "storage.base", ["Store"]),
        ("storage.store", "storage.local", ["LocalStore"]),
        ("storage.store", "storage.fsspec_store", ["ATOMIC_CREATE_PROTOCOLS", "FsspecStore"]),
    ],
)
def test_moved_names_stay_importable(old: str, new: str, names: list[str]) -> None:
    for name in names:
        moved = getattr(importlib.import_module(f"snapstore.{new}"), name)
        assert getattr(importlib.import_module(f"snapstore.{old}"), name) is moved, name


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_module_paths_give_the_moved_module(old: str) -> None:
    """``import snapstore.store`` (a module before the layer subpackages) still works: the same
    module object as its new path, with a DeprecationWarning naming that path."""
    new = importlib.import_module(f"snapstore.{MOVED[old]}")
    sys.modules.pop(f"snapstore.{old}", None)
    with pytest.warns(DeprecationWarning, match=f"snapstore.{MOVED[old]}"):
        found = importlib.import_module(f"snapstore.{old}")
    assert found is new
    assert found.__name__ == found.__spec__.name == f"snapstore.{MOVED[old]}"
    vars(snapstore).pop(old)  # set by that import; `snapstore.store` without one:
    with pytest.warns(DeprecationWarning, match=f"snapstore.{MOVED[old]}"):
        assert getattr(snapstore, old) is new


@pytest.mark.parametrize(
    ("package", "name", "home"),
    [("format", "COMMIT_NAME", "format.layout"), ("fingerprint", "Hasher", "fingerprint.digest")],
)
def test_old_module_names_of_the_two_that_became_packages(
    package: str, name: str, home: str
) -> None:
    module = importlib.import_module(f"snapstore.{package}")
    with pytest.warns(DeprecationWarning, match=f"snapstore.{home}.{name}"):
        found = getattr(module, name)
    assert found is getattr(importlib.import_module(f"snapstore.{home}"), name)
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = module.no_such_name


def test_unknown_module_paths_still_fail() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("snapstore.no_such_module")
    with pytest.raises(AttributeError, match="no_such_module"):
        _ = snapstore.no_such_module


def test_old_paths_warn_at_the_users_line_and_once(tmp_path: Path) -> None:
    """The warning names the user's file and line, so Python's default filters show it (a
    warning attributed to importlib's frames would be hidden), and each old name warns once."""
    script = tmp_path / "uses_old_paths.py"
    script.write_text(
        "import snapstore.store\n"
        "from snapstore.gc import collect_garbage\n"
        "from snapstore import catalog\n"
        "import snapstore\n"
        "snapstore.format.COMMIT_NAME\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
    lines = [line for line in done.stderr.splitlines() if "DeprecationWarning" in line]
    assert [line.split(": DeprecationWarning")[0] for line in lines] == [
        f"{script}:{n}" for n in (1, 2, 3, 5)
    ], done.stderr
