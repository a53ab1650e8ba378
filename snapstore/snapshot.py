"""The user's entry point: ``snapshot()`` wraps a stage; calling it gives a :class:`Snapshot`.

A stage is a function that returns (or yields) samples. Calling the wrapped stage computes the
fingerprint of (code, arguments, format version, ``version``) and returns a Snapshot handle;
nothing runs until :meth:`Snapshot.materialize` or the first read, which writes the snapshot
unless one with that fingerprint is already committed.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, Unpack, overload

from .errors import (
    BusyError,
    FormatError,
    SnapshotNotFoundError,
    SnapshotRemovedError,
    SnapstoreError,
    StageError,
)
from .fingerprint.digest import Fingerprint, fingerprint_stage
from .fingerprint.explain import diff_parts
from .fingerprint.importname import module_name
from .format import layout as fmt
from .format.plan import PlanOptions
from .format.schema import Schema
from .manage.catalog import previous_of_stage, resolve_fingerprint, stored_fingerprint
from .read.batches import BatchReader
from .read.options import ReaderOptions, ReaderSettings, reader_options
from .read.reader import (
    SnapshotMetadata,
    SnapshotReader,
    load_manifest,
    read_metadata,
    read_record,
    removed_message,
)
from .storage import claims, pins
from .storage.store import LocalStore, Store, open_store
from .write.engines import Engine, PartitionTask, make_engine
from .write.parallel import PartitionJob, compute_partitions
from .write.partitions import commit_partitions, remove_partition_claims
from .write.progress import ProgressArg, Reporter, holder_text, open_reporter, tee
from .write.writer import ProgressCallback, SnapshotWriter, WriteOptions

__all__ = ["Snapshot", "Stage", "open", "resolve_fingerprint", "snapshot"]

log = logging.getLogger(__name__)

Root = str | os.PathLike[str] | Store | None
F = TypeVar("F", bound=Callable[..., Iterable[Mapping[str, Any]]])


def _stage_name(fn: Callable[..., Any]) -> str:
    """``module.qualname``, the module named as imported (a script's stage is not ``__main__``)."""
    module = module_name(getattr(fn, "__module__", None) or "?", getattr(fn, "__globals__", None))
    return f"{module}.{getattr(fn, '__qualname__', repr(fn))}"


def _remove_owned(directory: str, owner: int) -> None:
    if os.getpid() == owner:
        shutil.rmtree(directory, ignore_errors=True)


def _renamed_note(old: str, new: str) -> str:
    return (
        f"the stage was found under its old script name {old}: since fingerprint scheme 3 "
        f"a function in a file run as a script is named as its import would name it ({new}), "
        "so a snapshot written by `python <script>.py` with an earlier snapstore is not reused"
    )


class Snapshot:
    """A handle on the snapshot of one stage call, committed or not yet.

    Reading (``len``, indexing, iteration, :meth:`batches`) materializes it first if needed.
    Use it as a context manager, or call :meth:`close`, to stop its reader threads.
    """

    def __init__(
        self,
        store: Store,
        fingerprint: Fingerprint | str,
        *,
        stage: Stage | None = None,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.store = store
        self._fp = fingerprint if isinstance(fingerprint, Fingerprint) else None
        self.fingerprint: str = (
            fingerprint.digest if isinstance(fingerprint, Fingerprint) else fingerprint
        )
        self._stage = stage
        self._args = args
        self._kwargs = dict(kwargs or {})
        self._reader: SnapshotReader | None = None
        self._batch_readers: weakref.WeakSet[BatchReader] = weakref.WeakSet()
        self._guard: pins.ReadGuard | None = None
        # What open() (or the process that sent this snapshot) read: commit record, manifest,
        # index. The first read uses it; its pin's confirm-read checks the record later.
        self._metadata: SnapshotMetadata | None = None
        self._record: bytes | None = None  # the commit record materialize() found
        self._pinned_elsewhere = False  # a process that sent us the metadata holds a pin
        self._hit_logged = False
        self.miss_explanation: dict[str, Any] | None = None
        """Set when materializing found no snapshot (and computed it, or waited for the job that
        did): the most recent committed snapshot of the same stage (``"previous"``) and why this
        fingerprint differs from it (``"differences"``)."""

    def __repr__(self) -> str:
        state = "committed" if self.committed else "not materialized"
        return f"<Snapshot {self.fingerprint[:12]} {state} at {self.store.url}>"

    def __snapstore_upstream__(self) -> str:
        """Passed as an argument to another stage, a snapshot contributes its fingerprint."""
        return self.fingerprint

    def __snapstore_key__(self) -> str:
        """Inside a container argument, a snapshot is identified by its fingerprint too."""
        return self.fingerprint

    @property
    def committed(self) -> bool:
        """Whether a commit record exists for this fingerprint."""
        return self.store.exists(f"{self.fingerprint}/{fmt.COMMIT_NAME}")

    @property
    def fingerprint_parts(self) -> dict[str, str]:
        """The named parts the fingerprint hashes (code, arguments, format, version...)."""
        if self._fp is not None:
            return dict(self._fp.parts)
        return dict(self.manifest.get("fingerprint_parts", {}))

    def materialize(self, progress: ProgressArg = None) -> Snapshot:
        """Run the stage and commit its output, unless this fingerprint is already committed.

        Parameters
        ----------
        progress : None, bool or callable
            None (default): a progress display (tqdm) on stderr when it is a terminal or in a
            Jupyter notebook, none otherwise; True: a display whatever stderr is; False: none.
            A callable is called as ``progress(samples, stored_bytes)`` after each block is
            written (after each partition, for a partitioned stage), and no display is drawn.
            See :mod:`snapstore.write.progress`.

        Returns
        -------
        Snapshot
            ``self``, committed.

        Raises
        ------
        SchemaError
            A sample did not fit the schema. Nothing was committed.
        Exception
            Whatever the stage raised, with a note that nothing was committed.
        TypeError
            If ``progress`` is none of the above.
        """
        with contextlib.suppress(SnapshotNotFoundError):
            self._record = read_record(self.store, self.fingerprint)  # kept for the first read
        if self._record is not None:
            if not self._hit_logged:  # once per handle: reading materializes again
                self._hit_logged = True
                _log_found(self)
            return self
        if self._stage is None:
            raise SnapshotNotFoundError(
                f"snapshot {self.fingerprint} is not committed under {self.store.url}"
            )
        self._stage.write(self, progress)  # explains the miss once it knows what it does
        self._hit_logged = True  # computed or waited for here: reading it is no cache hit
        return self

    def _open(self, *, pin_later: bool = False) -> SnapshotReader:
        """The reader, opened once; its pin starts now, or with ``pin_later`` once its first
        block requests are out (``reader.guard.start()``, which the prefetcher calls)."""
        if self._reader is None:
            known, self._metadata = self._metadata, None
            if known is None:
                if self._record is None:  # else materialize() just found it
                    self.materialize()
            elif not self._hit_logged:
                self._hit_logged = True
                _log_found(self, manifest=known.manifest)
            self._reader = self._new_reader(known)
            if self._guard is None and not self._pinned_elsewhere:
                # Pinned in the background, so that cleaning never removes the snapshot under
                # us, while the first blocks are already being read (see snapstore.storage.pins).
                record = self._reader.record
                self._guard = pins.ReadGuard(self.store, self.fingerprint, record, start=False)
            self._reader.guard = self._guard
        if not pin_later and self._guard is not None:
            self._guard.start()
        return self._reader

    def _new_reader(self, known: SnapshotMetadata | None) -> SnapshotReader:
        """A reader from ``known`` metadata (read long ago, or in another process) or, if none,
        from the record materialize() found; if a file is missing, the snapshot was removed or
        committed again since: the latter is read afresh."""
        try:
            if known is None:
                record, self._record = self._record, None
                known = read_metadata(self.store, self.fingerprint, record)
            return SnapshotReader(self.store, self.fingerprint, metadata=known)
        except (FormatError, FileNotFoundError) as exc:
            try:
                record = read_record(self.store, self.fingerprint)
            except SnapshotNotFoundError:
                why = "was removed (by `snapstore rm` or `gc`) as it was opened"
                raise SnapshotRemovedError(
                    removed_message(self.store, self.fingerprint, why)
                ) from exc
            if known is not None and record == known.record:
                raise
        known = read_metadata(self.store, self.fingerprint, record)
        return SnapshotReader(self.store, self.fingerprint, metadata=known)

    def shareable_metadata(self) -> SnapshotMetadata | None:
        """What another process needs to read this snapshot without reading its metadata again
        (None before the first read): see :class:`snapstore.handle.SnapshotHandle`."""
        return None if self._reader is None else self._reader.shareable

    @property
    def manifest(self) -> dict[str, Any]:
        """The committed manifest (schema, counts, sizes, fingerprint parts)."""
        return self._open().manifest

    @property
    def schema(self) -> Schema:
        """The schema of the samples."""
        return self._open().schema

    def __len__(self) -> int:
        return len(self._open())

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self._open().sample(index)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._open())

    def batches(
        self,
        batch_size: int,
        options: ReaderOptions | None = None,
        *,
        epoch: int = 0,
        rank: int = 0,
        world_size: int = 1,
        worker: int = 0,
        num_workers: int = 1,
        **settings: Unpack[ReaderSettings],
    ) -> BatchReader:
        """Batches of this consumer's share of one epoch, as dicts of numpy arrays.

        Parameters
        ----------
        batch_size : int
            Samples per batch.
        options : ReaderOptions, optional
            How to read: order, shuffle window, read-ahead, threads, batch form (see
            :class:`snapstore.ReaderOptions` for each setting and its default).
        epoch : int
            Selects the order with ``options.seed``; change it every epoch (or call
            ``set_epoch``).
        rank, world_size : int
            This process's place among the ranks of a distributed job.
        worker, num_workers : int
            This consumer's place among its rank's data-loading workers. Consumers are
            ``world_size * num_workers`` in all, and every one gets the same number of samples.
        **settings
            Any field of :class:`snapstore.ReaderOptions` as a keyword (``shuffle=True,
            seed=1``...), overriding ``options``'s: ``batches(256, shuffle=True)`` and
            ``batches(256, ReaderOptions(shuffle=True))`` are the same reader.

        Returns
        -------
        BatchReader
            Iterable of batch dicts, with ``get_state()``/``set_state()`` for resuming
            mid-epoch, ``set_epoch()`` and ``stats()``.

        Raises
        ------
        TypeError, ValueError
            On a bad setting, as :class:`snapstore.ReaderOptions` raises them.
        """
        read = reader_options(options, dict(settings))
        reader = self._open(pin_later=True)
        blocks = read.window_blocks or reader.window_blocks(read.window_bytes)
        plan = PlanOptions(bool(read.shuffle), read.seed, blocks, read.drop_last)
        prefetch_bytes = read.prefetch_bytes
        if prefetch_bytes is None:
            # Enough to read ahead across a window boundary; a remote store needs more in flight
            # (bandwidth x latency), so it gets twice as much.
            window = int(reader.manifest["raw_bytes"]) / max(1, reader.num_blocks) * blocks
            ahead = 2 if reader.store.local else 4
            prefetch_bytes = max(ahead * 32 << 20, int(ahead * window))
        batches = BatchReader(
            reader,
            batch_size,
            options=plan,
            epoch=epoch,
            rank=rank,
            world_size=world_size,
            worker=worker,
            num_workers=num_workers,
            prefetch_bytes=prefetch_bytes,
            max_requests=read.max_requests,
            decode_threads=read.decode_threads,
            ragged=read.ragged,
        )
        self._batch_readers.add(batches)
        return batches

    def close(self) -> None:
        """Stop the threads of every running ``batches()`` pass and release cached blocks and
        memory maps (reading again reopens them)."""
        for batches in list(self._batch_readers):
            batches.close()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._metadata = self._record = None  # if never used: reading again reads afresh
        if self._guard is not None:
            self._guard.release()
            self._guard = None
        self.store.close()

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _log_found(snap: Snapshot, how: str = "", manifest: dict[str, Any] | None = None) -> None:
    """One INFO line for a cache hit, ``how`` appended (the manifest is read, unless given,
    only when INFO is logged)."""
    if not log.isEnabledFor(logging.INFO):
        return
    try:
        manifest = manifest or load_manifest(snap.store, snap.fingerprint)
    except (SnapstoreError, OSError):  # reading it says what is wrong; a log line need not
        log.debug("snapstore: cannot read the manifest of %s", snap.fingerprint, exc_info=True)
        return
    log.info(
        "snapstore: found snapshot %s of %s under %s (%d samples, %s bytes stored)%s",
        snap.fingerprint, manifest.get("stage") or "?", snap.store.url,
        int(manifest["num_samples"]), f"{int(manifest['stored_bytes']):,}", how,
    )  # fmt: skip


class Stage:
    """A function wrapped by :func:`snapshot`; calling it returns a :class:`Snapshot`."""

    def __init__(
        self,
        fn: Callable[..., Iterable[Mapping[str, Any]]],
        *,
        root: Root = None,
        version: str | None = None,
        key: Callable[..., Any] | None = None,
        ignore: Collection[str] = (),
        ignore_globals: Collection[str] = (),
        schema: Schema | Mapping[str, Any] | None = None,
        options: WriteOptions | None = None,
        on_busy: str = "wait",
        lease: float = 60.0,
        partition_by: str | None = None,
        partition_size: int = 1,
        engine: str | Engine | None = None,
        workers: int | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(
                f"snapshot() wraps a function that yields samples; got {type(fn).__name__}"
            )
        self.fn = fn
        self.root = root
        self.version = version
        self.key = key
        self.ignore = tuple(ignore)
        self.ignore_globals = tuple(ignore_globals)
        self.schema = (
            schema if schema is None or isinstance(schema, Schema) else Schema.declare(schema)
        )
        self.options = options or WriteOptions()
        if on_busy not in ON_BUSY:
            raise ValueError(f"on_busy: expected one of {ON_BUSY}, found {on_busy!r}")
        if not isinstance(lease, (int, float)) or not lease > 0:
            raise ValueError(f"lease: expected a positive number of seconds, found {lease!r}")
        self.on_busy = on_busy
        self.lease = float(lease)
        if partition_by is not None and partition_by not in inspect.signature(fn).parameters:
            raise ValueError(
                f"partition_by={partition_by!r} is not a parameter of {_stage_name(fn)}; "
                "name the argument that holds the list of inputs to split"
            )
        if isinstance(partition_size, bool) or not isinstance(partition_size, int):
            raise TypeError(f"partition_size: expected an int, found {partition_size!r}")
        if partition_size < 1:
            raise ValueError(f"partition_size: expected an int >= 1, found {partition_size}")
        self.partition_by = partition_by
        self.partition_size = partition_size
        if (engine is not None or workers is not None) and partition_by is None:
            raise ValueError(
                f"engine and workers apply to partitioned stages; {_stage_name(fn)} has no "
                "partition_by. Add partition_by='<the argument holding the inputs>' to split "
                "the work into partitions the engine can run in parallel."
            )
        make_engine(engine, workers)  # fail here on a bad name
        self.engine = engine
        self.workers = workers
        self.clock: claims.Clock = claims.SystemClock()
        self.name = _stage_name(fn)
        functools.update_wrapper(self, fn)

    def fingerprint(self, *args: Any, **kwargs: Any) -> Fingerprint:
        """The fingerprint of a call, without running anything."""
        return fingerprint_stage(
            self.fn,
            args,
            kwargs,
            format_version=fmt.FORMAT_VERSION,
            version=self.version,
            key=self.key,
            ignore=self.ignore,
            ignore_globals=self.ignore_globals,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Snapshot:
        fp = self.fingerprint(*args, **kwargs)
        return Snapshot(open_store(self.root), fp, stage=self, args=args, kwargs=kwargs)

    def explain_miss(self, snap: Snapshot, doing: str = "computing it") -> dict[str, Any] | None:
        """Why no snapshot was found: the difference from this stage's most recent snapshot
        (logged, with ``doing``: what this job does about the miss)."""
        if snap._fp is None:
            return None
        previous = previous_of_stage(snap.store, self.name, exclude=snap.fingerprint)
        renamed = None
        if previous is None and not self.name.startswith("__main__."):
            renamed = f"__main__.{getattr(self.fn, '__qualname__', '')}"
            previous = previous_of_stage(snap.store, renamed, exclude=snap.fingerprint)
        if previous is None:
            return None
        differences = diff_parts(stored_fingerprint(snap.store, previous), snap._fp)
        if renamed is not None:
            differences.insert(0, _renamed_note(renamed, self.name))
        log.warning(
            "snapstore: no snapshot of %s with fingerprint %s under %s; %s. "
            "It differs from the most recent one (%s): %s",
            self.name, snap.fingerprint, snap.store.url, doing, previous,
            "; ".join(differences) or "no recorded part differs (written by another scheme?)",
        )  # fmt: skip
        return {"previous": previous, "differences": differences}

    def write(self, snap: Snapshot, progress: ProgressArg | Reporter = None) -> None:
        """Materialize ``snap``: claim it and compute, or wait for the job that holds the claim
        (or pass through, or raise, per ``on_busy``); on any error nothing is visible.
        ``progress`` as for :meth:`Snapshot.materialize`; its display is closed on every path."""
        reporter = open_reporter(progress, self.name, self.clock)
        ok = False
        try:
            if self.partition_by is not None:
                self._write_partitioned(snap, reporter)
            else:
                self._write_claimed(snap, reporter)
            ok = True
        finally:
            reporter.close(ok)

    def _write_claimed(self, snap: Snapshot, reporter: Reporter) -> None:
        watched: dict[str, Any] = {"lease": self.lease}
        announced = False
        while True:
            claim, state = claims.acquire(
                snap.store, snap.fingerprint, lease=self.lease, clock=self.clock, watched=watched
            )
            if claim is not None:
                break
            if snap.committed:
                _log_found(snap, ", committed meanwhile by another job")
                reporter.finish("committed meanwhile by another job")
                return
            if self.on_busy == "pass":
                doing = f"computing it without storing it, since {state.describe()} holds it"
                snap.miss_explanation = self.explain_miss(snap, doing)
            if self._busy(snap, reporter, f"snapshot {snap.fingerprint} of {self.name}", state):
                return
            if not announced:
                doing = f"waiting for {state.describe()}, which is computing it"
                snap.miss_explanation = self.explain_miss(snap, doing)
                log.info(
                    "snapstore: waiting for %s, which is computing %s of %s (lease %.0f s)",
                    state.describe(), snap.fingerprint, self.name, self.lease,
                )  # fmt: skip
                announced = True
            reporter.waiting(f"waiting for {holder_text(state)}")
            self.clock.sleep(min(self.lease / 4, 2.0))
            if snap.committed:
                _log_found(snap, f", committed by {state.describe()}, which this job waited for")
                reporter.finish(f"committed by {state.describe()}, which this job waited for")
                return
        reporter.waiting(None)
        report = tee(claim.report, reporter)  # the heartbeats carry it to jobs that wait
        try:
            with claim:
                if not snap.committed:  # else committed between our check and our claim
                    if not announced:  # a job that waited explained the miss then (and the
                        # takeover of the claim it waited for is logged by claims.acquire)
                        snap.miss_explanation = self.explain_miss(snap)
                    self._compute(snap, report)
        except BaseException:
            # The attempt failed (a Ctrl-C too): its claim files would show in ls and gc as a
            # leftover. Claim.abandon keeps them if another job has claimed since.
            claim.abandon((f"{snap.fingerprint}/runs", snap.fingerprint))
            raise
        claims.remove_claims(snap.store, snap.fingerprint)  # committed: nobody needs them

    def partition_calls(self, snap: Snapshot) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        """The stage call split on ``partition_by``: ``(args, kwargs)`` per partition."""
        bound = inspect.signature(self.fn).bind(*snap._args, **snap._kwargs)
        bound.apply_defaults()
        name = self.partition_by
        assert name is not None
        values = bound.arguments[name]
        if not isinstance(values, Sequence) or isinstance(values, (str, bytes)):
            raise TypeError(
                f"partition_by={name!r}: expected a sequence (list, tuple, range) of inputs, "
                f"found {type(values).__name__}"
            )
        size = self.partition_size
        calls = []
        for start in range(0, len(values), size):
            part = bound.arguments.copy()
            part[name] = values[start : start + size]
            piece = inspect.BoundArguments(bound.signature, part)
            calls.append((piece.args, piece.kwargs))
        return calls

    def _write_partitioned(self, snap: Snapshot, progress: Reporter) -> None:
        """Compute the partitions no other live job holds on the engine, wait for the others
        (taking over expired claims), then assemble and commit. Finished partitions are never
        recomputed."""
        store, fp = snap.store, snap.fingerprint
        calls = self.partition_calls(snap)
        tasks = [
            PartitionTask(self.fn, self.name, args, kwargs, store, fp, p, self.schema, self.options)
            for p, (args, kwargs) in enumerate(calls)
        ]

        def busy(partition: int, state: claims.ClaimState) -> bool:
            what = f"partition {partition} of {self.name} ({fp})"
            return self._busy(snap, progress, what, state)

        job = PartitionJob(
            store, fp, self.name, tasks, self.lease, self.clock, busy,
            committed=lambda: snap.committed, progress=progress,
        )  # fmt: skip
        # Which partitions this job computes is decided one by one, as it claims them.
        snap.miss_explanation = self.explain_miss(snap, "computing the partitions no job holds")
        if not compute_partitions(job, make_engine(self.engine, self.workers), self.fn):
            return
        if not snap.committed:
            commit_partitions(store, fp, len(calls), self._manifest_extra(snap), schema=self.schema)
            remove_partition_claims(store, fp, range(len(calls)))

    def _manifest_extra(self, snap: Snapshot) -> dict[str, Any]:
        fp = snap._fp
        return {
            "stage": self.name,
            "fingerprint_parts": fp.parts if fp else {},
            "fingerprint_details": fp.details if fp else {},
            "version": self.version,
        }

    def _busy(
        self,
        snap: Snapshot,
        progress: ProgressCallback | None,
        what: str,
        state: claims.ClaimState,
    ) -> bool:
        """Another job holds ``what``: raise, or compute privately (True), or wait (False)."""
        if self.on_busy == "error":
            raise BusyError(
                f"{what} is being computed by {state.describe()} under {snap.store.url}; wait "
                "for it or share the work (on_busy='wait'), compute without storing "
                "(on_busy='pass'), or try again later"
            )
        if self.on_busy == "pass":
            log.info("snapstore: %s is busy; computing without storing", snap.fingerprint)
            self._pass_through(snap, progress)
            return True
        return False

    def _pass_through(self, snap: Snapshot, progress: ProgressCallback | None) -> None:
        """Compute into a private temporary store that ``snap`` then reads (removed with it)."""
        directory = tempfile.mkdtemp(prefix="snapstore-pass-")
        # Removed by this process only: a forked DataLoader worker collects its copy of the
        # Snapshot when it opens its own, and must not remove what the parent reads.
        weakref.finalize(snap, _remove_owned, directory, os.getpid())
        snap.store = LocalStore(directory, fsync=False)
        self._compute(snap, progress)

    def _compute(self, snap: Snapshot, progress: ProgressCallback | None) -> None:
        """Run the stage for ``snap``'s arguments and commit; on any error nothing is visible."""
        writer = SnapshotWriter(
            snap.store,
            snap.fingerprint,
            self._manifest_extra(snap),
            schema=self.schema,
            options=self.options,
            progress=progress,
        )
        try:
            samples = self.fn(*snap._args, **snap._kwargs)
            if not isinstance(samples, Iterable):
                raise StageError(
                    f"stage {self.name} returned {type(samples).__name__}; expected an iterable of "
                    "sample dicts (write it as a generator that yields dicts)."
                )
            for sample in samples:
                writer.add(sample)
        except BaseException as exc:
            writer.abort()
            exc.add_note(
                f"snapstore: stage {self.name} failed after {writer.samples_written} "
                f"samples; nothing was committed for {snap.fingerprint}."
            )
            raise
        writer.commit()


@overload
def snapshot(fn: F, **settings: Any) -> Stage: ...
@overload
def snapshot(fn: None = None, **settings: Any) -> Callable[[F], Stage]: ...


def snapshot(fn: F | None = None, **settings: Any) -> Stage | Callable[[F], Stage]:
    """Wrap a stage so its output is materialized once and read back from then on.

    Use as ``@snapshot``, ``@snapshot(root=...)`` or ``snapshot(fn, root=...)``.

    Parameters
    ----------
    fn : callable
        A function returning or yielding sample dicts.
    root : str, path or Store, optional
        Where snapshots live: a local directory or fsspec URL. Default ``$SNAPSTORE_ROOT``, else
        the per-user cache directory (``~/.cache/snapstore`` on Linux).
    version : str, optional
        Folded into the fingerprint; bump it to force a new snapshot.
    key : callable, optional
        ``key(*args, **kwargs)`` returns what identifies the arguments, in place of hashing them.
    ignore : collection of str
        Argument names left out of the fingerprint (verbosity, thread counts...).
    ignore_globals : collection of str
        Globals (``LOCK``, ``helpers.CACHE``), closure variables or ``Class.attr`` that the code
        reads but that do not change the data and cannot be hashed (locks, open files).
    schema : Schema or mapping, optional
        Declared schema; see :meth:`Schema.declare`. Inferred from the first block otherwise.
    options : WriteOptions, optional
        Block size, shard size, compression, threads (not part of the fingerprint).
    on_busy : {"wait", "pass", "error"}
        What a job does when another job holds the claim on the same fingerprint (a sweep
        started together): ``"wait"`` (default) for its commit, then read it (taking the claim
        over if the holder stops renewing it); ``"pass"``: compute without storing, into a
        private temporary directory; ``"error"``: raise :class:`BusyError`.
    partition_by : str, optional
        The parameter holding a list of inputs (files, URLs, ranges) to split the stage on.
        Each partition (``partition_size`` consecutive inputs) is computed by calling the
        function with just those inputs, committed on its own, and never recomputed: a rerun
        after a crash computes only the missing partitions, and jobs of a sweep share the
        partitions between them (with ``on_busy="wait"``). The snapshot is the partitions'
        samples in order, so the function must produce for a list what it produces for its
        pieces one after another. Does not change the fingerprint.
    partition_size : int
        Inputs per partition (default 1).
    engine : {"process", "thread", "ray", "dask"}, Engine or dask Client, optional
        Where the partitions of a partitioned stage run (see :mod:`snapstore.write.engines`). By
        default a pool of spawned processes, one per usable core, falling back to threads
        (with a warning) for a stage that cannot be sent to a process. The engine is not part
        of the fingerprint: any engine writes the same snapshot.
    workers : int, optional
        Partitions computed at once by the ``"process"`` or ``"thread"`` engine (default: the
        usable cores); for Ray and Dask, the partitions kept in flight.
    lease : float
        Seconds a claim lives without a heartbeat (the holder renews it every ``lease / 4``);
        after that a waiting job takes it over. Clocks of the jobs should agree to well within
        this; if they do not, the cost is a duplicate computation, never a wrong snapshot.

    Returns
    -------
    Stage
        Call it with the stage's arguments to get a :class:`Snapshot`.

    Examples
    --------
    >>> @snapshot(root="/tmp/snaps")                               # doctest: +SKIP
    ... def squares(n):
    ...     for i in range(n):
    ...         yield {"x": i * i}
    >>> snap = squares(10).materialize()                           # doctest: +SKIP
    >>> snap[3]                                                    # doctest: +SKIP
    {'x': 9}
    """
    allowed = {
        "root",
        "version",
        "key",
        "ignore",
        "ignore_globals",
        "schema",
        "options",
        "on_busy",
        "lease",
        "partition_by",
        "partition_size",
        "engine",
        "workers",
    }
    unknown = set(settings) - allowed
    if unknown:
        raise TypeError(
            f"snapshot() got unexpected settings {sorted(unknown)}; expected root, "
            "version, key, ignore, ignore_globals, schema, options, on_busy, lease, "
            "partition_by, partition_size, engine or workers"
        )
    if fn is None:
        return lambda f: Stage(f, **settings)
    return Stage(fn, **settings)


ON_BUSY = ("wait", "pass", "error")


def open(fingerprint: str, root: Root = None, **storage_options: Any) -> Snapshot:
    """A committed snapshot by its fingerprint (or a unique prefix of it).

    ``storage_options`` go to :func:`snapstore.open_store` with ``root`` (e.g.
    ``endpoint_url=``, ``token=`` for ``gs://``).

    Raises
    ------
    SnapshotNotFoundError
        If no committed snapshot matches.
    """
    store = open_store(root, **storage_options)
    record = None
    if fmt.is_plain_name(fingerprint):  # a full fingerprint: its record, in one request
        with contextlib.suppress(SnapshotNotFoundError):
            record = read_record(store, fingerprint)
    full = fingerprint if record is not None else resolve_fingerprint(store, fingerprint)
    snap = Snapshot(store, full)
    # Validated now, so a broken snapshot fails here; the first read reuses it.
    snap._metadata = read_metadata(store, full, record)
    return snap
