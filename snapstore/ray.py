"""Ray integration: write a Ray Dataset as a snapshot, run partitions as Ray tasks, read back.

- :class:`SnapshotDatasink` (for ``Dataset.write_datasink``) writes each write task's blocks as
  one partition of the snapshot and, when every task has finished, assembles and commits them
  (:mod:`snapstore.write.partitions`); :func:`write_snapshot` wraps it and skips the pipeline when
  the snapshot is already committed.
- :class:`RayExecutor` is a :class:`concurrent.futures.Executor` whose calls run as Ray tasks.
- :func:`read_snapshot` reads a committed snapshot as a Ray Dataset, a range of blocks per
  read task.

Ray is started only if it is not running (``ray.init(include_dashboard=False)``, a local
instance); to use a cluster, call ``ray.init(address=...)`` yourself first. Ray's usage-stats
prompt is Ray's business: set ``RAY_USAGE_STATS_ENABLED=0`` before starting it to silence it.

How a write survives retries. Ray retries a write task (a worker or node dies; with
``ray_remote_args={"retry_exceptions": True}`` also an exception) with the same blocks and the
same task index. Every attempt writes into a run directory of its own
(:func:`snapstore.write.writer.new_run_id`) and commits the partition create-if-absent, so an
attempt either becomes the partition or is discarded: no row is ever written twice. Partition ids
are ``job * 10**6 + task index`` with ``job`` a random number per datasink, so partitions left by
another job (a concurrent one, or one that failed) are never mixed into this job's snapshot, however
differently that job split the rows into tasks.

How a running write is kept from gc. The driver claims the fingerprint in
:meth:`SnapshotDatasink.on_write_start` and renews the claim on a heartbeat thread until the
write completes or fails (then it releases the claim, and removes the fingerprint's claims once
the snapshot is committed). :func:`snapstore.manage.gc.find_garbage` leaves everything of an
uncommitted fingerprint with a live claim alone, and takes a datasink job's partitions only
when they are older than its ``min_age`` and no live claim is held. If another live job holds
the claim (two jobs writing the same data), this job writes anyway, without a claim: its
partitions are its own and the commit is create-if-absent, so the worst case is computing
twice. The other job's claim protects both while it lives. Should that job end first without
committing, this job's partitions older than gc's ``min_age`` (an hour by default) are exposed
until this job assembles them, and a gc run then makes the assembly fail cleanly (a partition
is missing: nothing is committed). Before assembling, a job without the claim takes it (or
finds it live with another job), so gc cannot remove partitions while they are assembled.
"""

from __future__ import annotations

import functools
import itertools
import logging
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

try:
    import ray
    import ray.data
    from ray.data import Datasink, Datasource, ReadTask
    from ray.data.block import BlockAccessor, BlockMetadata
    from ray.data.datasource.datasink import WriteResult
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"snapstore.ray needs Ray Data ({exc}); install it with: pip install 'snapstore[ray]'"
    ) from exc

from .errors import SchemaError, SnapshotExistsError
from .fingerprint.digest import Fingerprint, fingerprint_key
from .format import layout as fmt
from .format.columns import BlockColumns, column_rows
from .format.schema import Schema
from .handle import portable, reopen
from .read.reader import SnapshotReader, load_manifest
from .snapshot import Snapshot, resolve_fingerprint
from .storage import claims
from .storage.store import Store, open_store
from .write.partitions import PARTS_DIR, commit_partitions, partition_dir, write_partition
from .write.writer import Columns, WriteOptions

__all__ = [
    "PartitionWritten",
    "RayExecutor",
    "SnapshotDatasink",
    "SnapshotDatasource",
    "SnapshotExistsError",
    "block_columns",
    "block_samples",
    "read_snapshot",
    "write_snapshot",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

# Write-task indices per job: a partition id is job * _TASKS_PER_JOB + task index. With jobs
# drawn from [10**11, 10**12) ids stay below 10**18, inside int64 for every tool that reads them.
_TASKS_PER_JOB = 10**6
_JOB_RANGE = (10**11, 10**12)


def _ensure_ray(init: Mapping[str, Any] | None = None) -> None:
    if not ray.is_initialized():
        log.info("starting a local Ray instance; call ray.init(address=...) first for a cluster")
        ray.init(**{"include_dashboard": False, **dict(init or {})})


@dataclass(frozen=True)
class PartitionWritten:
    """What one write task returns: the partition it committed and its size."""

    task: int
    partition: int
    samples: int
    stored_bytes: int
    run: str
    won: bool
    """False if an earlier attempt of the same task had committed the partition already."""


def block_columns(block: Any) -> dict[str, Any]:
    """The columns of a Ray block, for :meth:`SnapshotWriter.add_batch` (empty for no rows).

    ``int64``, ``float64`` and ``bool`` columns hold Python-kind values (int, float, bool);
    other numeric columns rank-0 arrays of their dtype; tensor and list columns numpy arrays;
    string and binary columns ``str`` and ``bytes``: the samples a Python stage would yield.

    Raises
    ------
    SchemaError
        If a column holds nulls (snapstore fields have no null).
    """
    table = BlockAccessor.for_block(block).to_arrow()
    for name, column in zip(table.column_names, table.columns):
        if column.null_count:
            raise SchemaError(
                f"column {name!r} holds {column.null_count} null values; snapstore samples have "
                "no nulls. Fill them (Dataset.map_batches) or drop the rows before writing."
            )
    if not table.num_rows:
        return {}
    return dict(BlockAccessor.for_block(table).to_numpy())


def block_samples(block: Any) -> Iterator[dict[str, Any]]:
    """The rows of a Ray block as snapstore samples (see :func:`block_columns`).

    Raises
    ------
    SchemaError
        If a column holds nulls (snapstore fields have no null).
    """
    columns = block_columns(block)
    names = list(columns)
    for row in zip(*(column_rows(columns[name]) for name in names)):
        yield dict(zip(names, row))


class SnapshotDatasink(Datasink[PartitionWritten]):
    """A Ray Data sink that writes a dataset as one snapshot, keyed by ``name`` and ``key``.

    Each write task writes its blocks as one partition; :meth:`on_write_complete` assembles
    the partitions, in write-task order, and commits the snapshot. Use one sink per write.

    Parameters
    ----------
    root : str, PathLike or None
        The store (a local path or an fsspec URL every Ray worker can reach); default
        :func:`snapstore.default_root`.
    name : str
        What the data is; recorded as the stage name.
    key : object
        Plain data identifying the contents (see
        :func:`snapstore.fingerprint.digest.fingerprint_key`). Writing the same rows under the same
        name and key gives the same fingerprint, through Ray or not.
    version : str, optional
        The user's version, part of the fingerprint.
    schema : Schema or mapping, optional
        Declared schema (as for :func:`snapstore.snapshot`); inferred per partition when None.
        Declare it when tasks could infer different types (a float column that is whole
        numbers in one task).
    options : WriteOptions, optional
        Block, shard and compression settings.
    lease : float
        Seconds the driver's claim on the fingerprint lives without a heartbeat (renewed every
        ``lease / 4`` while the write runs); as for :func:`snapstore.snapshot`.
    **storage_options
        For :func:`snapstore.open_store`.

    Attributes
    ----------
    fingerprint : str
        The snapshot's fingerprint: ``snapstore.open(sink.fingerprint, root)`` after the write.
    fingerprint_record : Fingerprint
        Its parts and details.
    won : bool or None
        After a completed write: True if this job committed the snapshot, False if another job
        with the same fingerprint committed it first (this job's partitions are then removed).

    Raises
    ------
    SnapshotExistsError
        From ``write_datasink`` (through :meth:`on_write_start`) if the snapshot is already
        committed: the pipeline would compute everything for nothing. Check :attr:`committed`
        first, or use :func:`write_snapshot`, which does.

    Examples
    --------
    >>> sink = SnapshotDatasink("/data/snaps", name="tokens", key={"src": src})  # doctest: +SKIP
    >>> ds.map_batches(tokenize).write_datasink(sink)                          # doctest: +SKIP
    >>> snap = snapstore.open(sink.fingerprint, "/data/snaps")                 # doctest: +SKIP
    """

    def __init__(
        self,
        root: Any = None,
        *,
        name: str,
        key: Any,
        version: str | None = None,
        schema: Schema | Mapping[str, Any] | None = None,
        options: WriteOptions | None = None,
        lease: float = 60.0,
        **storage_options: Any,
    ) -> None:
        if not isinstance(lease, (int, float)) or not lease > 0:
            raise ValueError(f"lease: expected a positive number of seconds, found {lease!r}")
        self.fingerprint_record: Fingerprint = fingerprint_key(name, key, version=version)
        self.fingerprint: str = self.fingerprint_record.digest
        self.name = name
        self.version = version
        self.schema = Schema.declare(schema) if isinstance(schema, Mapping) else schema
        self.options = options
        self._store: Store | None = open_store(root, **storage_options)
        self._where = portable(self._store, "Ray write tasks")
        # Drawn here, not in on_write_start: Ray may serialize the sink for its tasks before
        # calling on_write_start, and every task must agree on the job.
        self._job = secrets.randbelow(_JOB_RANGE[1] - _JOB_RANGE[0]) + _JOB_RANGE[0]
        self.lease = float(lease)
        self._claim: claims.Claim | None = None  # held by the driver while the write runs
        self.won: bool | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_store"] = None  # stores hold maps and locks; tasks reopen from _where
        state["_claim"] = None  # a heartbeat thread: the driver's alone
        return state

    @property
    def store(self) -> Store:
        """The store, opened in this process."""
        if self._store is None:
            self._store = reopen(self._where)
        return self._store

    @property
    def committed(self) -> bool:
        """Whether the snapshot is committed (by this job or any other)."""
        return self.store.exists(f"{self.fingerprint}/{fmt.COMMIT_NAME}")

    def get_name(self) -> str:
        return f"Snapshot({self.name})"

    def _partition(self, task: int) -> int:
        if not 0 <= task < _TASKS_PER_JOB:
            raise ValueError(
                f"write task index {task} is outside 0..{_TASKS_PER_JOB - 1}; write with fewer "
                "tasks (Dataset.repartition) or larger blocks"
            )
        return self._job * _TASKS_PER_JOB + task

    def _job_partitions(self) -> list[str]:
        names = self.store.list_dir(f"{self.fingerprint}/{PARTS_DIR}")
        return [n for n in names if n.isdigit() and int(n) // _TASKS_PER_JOB == self._job]

    def on_write_start(self, schema: Any = None) -> None:
        """Refuse to recompute a committed snapshot, or to reuse a sink; then claim the
        fingerprint (runs in the driver), so that gc leaves this job's partitions alone while
        it runs. If another live job holds the claim, write anyway (see the module docstring).
        """
        if self.committed:
            raise SnapshotExistsError(
                f"snapshot {self.fingerprint} ({self.name}) is already committed under "
                f"{self.store.url}; open it with snapstore.open({self.fingerprint!r}, root), "
                "or write with snapstore.ray.write_snapshot, which skips committed snapshots"
            )
        if self._job_partitions() or self.won is not None:
            raise RuntimeError(
                f"this SnapshotDatasink (job {self._job}) has been used for a write already; "
                "create a new one for each write_datasink call"
            )
        claim, state = claims.acquire(self.store, self.fingerprint, lease=self.lease)
        if claim is None:
            log.info(
                "snapstore: %s holds the claim on %s; writing it anyway (a Ray job's partitions "
                "are its own and the commit is create-if-absent: at worst both compute it)",
                state.describe(), self.fingerprint,
            )  # fmt: skip
        else:
            claim.start_heartbeat()
        self._claim = claim

    def write(self, blocks: Iterable[Any], ctx: Any) -> PartitionWritten:
        """Write this task's blocks as one partition and commit it (runs in a Ray task)."""
        task = int(ctx.task_idx)
        partition = self._partition(task)

        def columns() -> Iterator[Columns]:
            for block in blocks:
                data = block_columns(block)
                if data:
                    yield Columns(data)

        won = write_partition(
            self.store,
            self.fingerprint,
            partition,
            columns,
            schema=self.schema,
            options=self.options,
        )
        manifest = load_manifest(self.store, partition_dir(self.fingerprint, partition))
        return PartitionWritten(
            task=task,
            partition=partition,
            samples=int(manifest["num_samples"]),
            stored_bytes=int(manifest["stored_bytes"]),
            run=str(manifest["run"]),
            won=won,
        )

    def on_write_complete(self, write_result: WriteResult[PartitionWritten]) -> None:
        """Assemble the partitions the tasks wrote, in task order, and commit the snapshot;
        release the claim either way."""
        try:
            self._commit(write_result)
        finally:
            self._release_claim()
        claims.remove_claims(self.store, self.fingerprint)  # committed: nobody needs them

    def _commit(self, write_result: WriteResult[PartitionWritten]) -> None:
        if self._claim is None:
            # Started while another job held the claim: take it now if that job is gone, so
            # gc, which leaves an uncommitted fingerprint alone while a live claim is held,
            # cannot remove partitions while they are assembled. If the other job still holds
            # it, its claim protects them the same way.
            claim, _ = claims.acquire(self.store, self.fingerprint, lease=self.lease)
            if claim is not None:
                claim.start_heartbeat()
                self._claim = claim
        if self.committed:  # by another job, which may have taken unused partitions for garbage
            self.won = False
        else:
            self.won = self._assemble(write_result)
        if not self.won:
            log.info(
                "snapshot %s was committed by another job first; removing this job's partitions",
                self.fingerprint,
            )
            self._remove_partitions()

    def _assemble(self, write_result: WriteResult[PartitionWritten]) -> bool:
        written = {r.partition: r for r in write_result.write_returns}
        ids = sorted(written, key=lambda p: written[p].task)
        extra = {
            "stage": self.name,
            "fingerprint_parts": self.fingerprint_record.parts,
            "fingerprint_details": self.fingerprint_record.details,
            "version": self.version,
            "engine": "ray",
        }
        return commit_partitions(self.store, self.fingerprint, ids, extra, schema=self.schema)

    def on_write_failed(self, error: Exception) -> None:
        """Remove the partitions this job committed; nothing becomes visible.

        Best effort: a task still running may commit a partition afterwards; its files are
        left (a partition of an uncommitted snapshot that no later job uses), for
        :func:`snapstore.manage.gc.collect_garbage` to remove once the claim is released.
        """
        log.warning("writing snapshot %s through Ray failed: %s", self.fingerprint, error)
        try:
            self._remove_partitions()
        finally:
            self._release_claim()

    def _release_claim(self) -> None:
        if self._claim is not None:
            self._claim.release()
            self._claim = None

    def _remove_partitions(self) -> None:
        try:
            for name in self._job_partitions():
                self.store.remove_tree(f"{self.fingerprint}/{PARTS_DIR}/{name}")
        except OSError:
            log.warning(
                "could not remove the partitions of job %s under %s/%s",
                self._job,
                self.fingerprint,
                PARTS_DIR,
                exc_info=True,
            )


def write_snapshot(
    dataset: ray.data.Dataset,
    root: Any = None,
    *,
    name: str,
    key: Any,
    version: str | None = None,
    schema: Schema | Mapping[str, Any] | None = None,
    options: WriteOptions | None = None,
    lease: float = 60.0,
    ray_remote_args: Mapping[str, Any] | None = None,
    concurrency: int | None = None,
    **storage_options: Any,
) -> Snapshot:
    """Write ``dataset`` as the snapshot of ``(name, key, version)`` unless it is committed
    already, and return it.

    Parameters are those of :class:`SnapshotDatasink`, plus ``ray_remote_args`` and
    ``concurrency`` for ``Dataset.write_datasink``. Ray retries write tasks whose worker dies;
    pass ``ray_remote_args={"retry_exceptions": True, "max_retries": 3}`` to retry exceptions
    too (safe: attempts never duplicate rows).

    Returns
    -------
    Snapshot
        The committed snapshot, whichever job committed it.
    """
    sink = SnapshotDatasink(
        root,
        name=name,
        key=key,
        version=version,
        schema=schema,
        options=options,
        lease=lease,
        **storage_options,
    )
    if not sink.committed:
        dataset.write_datasink(
            sink,
            ray_remote_args=dict(ray_remote_args or {}),
            concurrency=concurrency,
        )
    return Snapshot(sink.store, sink.fingerprint_record)


def _call(fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    return fn(*args, **kwargs)


class RayExecutor(Executor):
    """A :class:`concurrent.futures.Executor` whose calls run as Ray tasks.

    Starts a local Ray instance if none is running (see the module docstring); never stops
    Ray, which is process-wide and slow to start.

    Parameters
    ----------
    num_cpus : float
        CPUs each task reserves.
    max_retries : int
        How often Ray reruns a task whose worker died (and, with ``retry_exceptions``, one
        that raised).
    retry_exceptions : bool or list of exception types
        Whether (or for which exceptions) a task that raised is retried. Off by default: a
        bug fails fast instead of running ``max_retries + 1`` times.
    init : mapping, optional
        Arguments for ``ray.init`` if Ray must be started here.
    **remote_options
        More task options (``memory=``, ``resources=``, ``runtime_env=``...).

    Examples
    --------
    >>> with RayExecutor() as pool:                        # doctest: +SKIP
    ...     futures = [pool.submit(pow, 2, n) for n in range(4)]
    ...     print([f.result() for f in futures])
    [1, 2, 4, 8]
    """

    def __init__(
        self,
        *,
        num_cpus: float = 1,
        max_retries: int = 3,
        retry_exceptions: bool | list[type[BaseException]] = False,
        init: Mapping[str, Any] | None = None,
        **remote_options: Any,
    ) -> None:
        _ensure_ray(init)
        self._remote: Any = ray.remote(_call).options(
            num_cpus=num_cpus,
            max_retries=max_retries,
            retry_exceptions=retry_exceptions,
            **remote_options,
        )
        self._refs: dict[Future[Any], Any] = {}
        self._closed = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` as a Ray task. ``fn`` and the arguments are pickled
        (cloudpickle); the future's exception is the task's, with the remote traceback in
        its message.

        Raises
        ------
        RuntimeError
            After :meth:`shutdown`.
        """
        if self._closed:
            raise RuntimeError("cannot submit to a RayExecutor after shutdown()")
        ref = self._remote.remote(fn, args, kwargs)
        future: Future[T] = ref.future()
        self._refs = {f: r for f, r in self._refs.items() if not f.done()}
        self._refs[future] = ref
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop accepting calls; with ``cancel_futures``, cancel the tasks not finished; with
        ``wait``, wait for the rest. Ray itself keeps running."""
        self._closed = True
        pending = {f: r for f, r in self._refs.items() if not f.done()}
        if cancel_futures:
            for future, ref in pending.items():
                future.cancel()
                ray.cancel(ref)
        if wait:
            for future in pending:
                if not future.cancelled():
                    future.exception()  # waits; the caller reads results from its futures
        self._refs.clear()


def _ray_batch(block: BlockColumns) -> dict[str, np.ndarray[Any, Any]]:
    """A decoded block as a Ray batch: fixed arrays as tensor columns, ragged ones as object
    arrays of row arrays (Ray's variable-shaped tensors), str, bytes, lists of them, nested
    dicts and nullable fields as object arrays of the values ``snap[i]`` gives."""
    batch: dict[str, np.ndarray[Any, Any]] = {}
    for field in block.schema.fields:
        if field.kind == "struct" or field.masked:  # nested dicts and None: per-row values
            values = np.empty(block.rows, dtype=object)
            for i, value in enumerate(block.field_values(field)):
                values[i] = value
            batch[field.name] = values
            continue
        column = block.column(field.name)
        if field.kind in ("str", "bytes", "list"):
            values = np.empty(block.rows, dtype=object)
            values[:] = column.to_pylist()
        elif field.kind == "array" and not field.fixed:
            values = np.empty(block.rows, dtype=object)
            for i in range(block.rows):
                values[i] = column.row(i)
        else:
            values = column
        batch[field.name] = values
    return batch


def _read_blocks(where: tuple[Any, ...], fingerprint: str, start: int, stop: int) -> Iterator[Any]:
    reader = SnapshotReader(reopen(where), fingerprint, decode_threads=1)
    for block in range(start, stop):
        yield BlockAccessor.batch_to_block(_ray_batch(reader.load_block(block)))


class SnapshotDatasource(Datasource):
    """A committed snapshot as a Ray Data source: each read task decodes a consecutive range
    of blocks, in written order, one Ray block per snapshot block.

    Parameters
    ----------
    store : Store
        Where the snapshot lives (reachable from every Ray worker).
    fingerprint : str
        Its full fingerprint.
    """

    def __init__(self, store: Store, fingerprint: str) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        reader = SnapshotReader(store, fingerprint, decode_threads=1)
        self._where = portable(store, "Ray read tasks")
        self._fingerprint = fingerprint
        self._rows = reader.index["rows"].astype(np.int64)
        self._raw = reader.index["raw_length"].astype(np.int64)

    def get_name(self) -> str:
        return f"Snapshot({self._fingerprint[:12]})"

    def estimate_inmemory_data_size(self) -> int | None:
        return int(self._raw.sum())

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: Any = None,
    ) -> list[ReadTask]:
        blocks = len(self._rows)
        tasks = max(1, min(parallelism, blocks))
        bounds = np.linspace(0, blocks, tasks + 1).astype(np.int64).tolist()
        out = []
        for start, stop in itertools.pairwise(bounds):
            if start == stop and blocks:
                continue
            meta = BlockMetadata(
                num_rows=int(self._rows[start:stop].sum()),
                size_bytes=int(self._raw[start:stop].sum()),
                exec_stats=None,
                input_files=None,
            )
            read = functools.partial(_read_blocks, self._where, self._fingerprint, start, stop)
            # per_task_row_limit only when Ray passed one: older Rays' ReadTask lacks it.
            limit = {} if per_task_row_limit is None else {"per_task_row_limit": per_task_row_limit}
            out.append(ReadTask(read, meta, **limit))
        return out


def read_snapshot(
    snapshot: Snapshot | str,
    root: Any = None,
    *,
    override_num_blocks: int | None = None,
    **storage_options: Any,
) -> ray.data.Dataset:
    """A committed snapshot as a Ray Dataset, in written order.

    Parameters
    ----------
    snapshot : Snapshot or str
        A snapshot handle (materialized first if it is not committed) or a fingerprint (or a
        unique prefix of one) under ``root``.
    root : str, PathLike or None
        The store, when ``snapshot`` is a fingerprint.
    override_num_blocks : int, optional
        Number of read tasks (at most one per snapshot block); Ray chooses by default.
    **storage_options
        For :func:`snapstore.open_store`.

    Returns
    -------
    ray.data.Dataset
        One row per sample: fixed-shape arrays as tensor columns, varying ones as
        variable-shaped tensors, scalars and strings as plain columns.

    Raises
    ------
    SnapshotNotFoundError
        If no committed snapshot matches.
    """
    if isinstance(snapshot, Snapshot):
        if not snapshot.committed:
            snapshot.materialize()
        store, fingerprint = snapshot.store, snapshot.fingerprint
    else:
        store = open_store(root, **storage_options)
        fingerprint = resolve_fingerprint(store, snapshot)
    _ensure_ray()
    source = SnapshotDatasource(store, fingerprint)
    dataset: ray.data.Dataset = ray.data.read_datasource(
        source, override_num_blocks=override_num_blocks
    )
    return dataset
