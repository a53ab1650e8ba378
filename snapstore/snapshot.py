"""The user's entry point: ``snapshot()`` wraps a stage; calling it gives a :class:`Snapshot`.

A stage is a function that returns (or yields) samples. Calling the wrapped stage computes the
fingerprint of (code, arguments, format version, ``version``) and returns a Snapshot handle;
nothing runs until :meth:`Snapshot.materialize` or the first read, which writes the snapshot
unless one with that fingerprint is already committed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import pickle
import socket
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar, Unpack, overload

from .errors import FormatError, SnapshotNotFoundError, SnapshotRemovedError
from .fingerprint.digest import Fingerprint, fingerprint_stage
from .fingerprint.earlier import (
    SCRIPTS_AS_MAIN,
    Naming,
    earlier_namings,
    names_script_code,
    renamed,
)
from .fingerprint.explain import diff_parts
from .fingerprint.importname import module_name, script_names_as_main
from .format import layout as fmt
from .format.schema import Schema
from .manage.catalog import previous_of_stage, resolve_fingerprint, stored_fingerprint
from .read.batches import BatchReader
from .read.options import ReaderOptions, ReaderSettings, reader_options
from .read.reader import (
    SnapshotMetadata,
    SnapshotReader,
    read_metadata,
    read_record,
    removed_message,
)
from .storage import claims, pins
from .storage.store import Store, open_store
from .storage.travel import portable, reopen
from .write import jobs, upgrade
from .write.jobs import StageJob, log_found, partition_calls, run_job
from .write.progress import ProgressArg, Reporter
from .write.stageoptions import NAMES as STAGE_SETTINGS
from .write.stageoptions import StageOptions, StageSettings, stage_options
from .write.times import WriteTimes
from .write.writer import ProgressCallback

__all__ = ["Snapshot", "Stage", "open", "resolve_fingerprint", "snapshot"]

log = logging.getLogger(__name__)

Root = str | os.PathLike[str] | Store | None
F = TypeVar("F", bound=Callable[..., Iterable[Mapping[str, Any]]])


def _stage_name(fn: Callable[..., Any]) -> str:
    """``module.qualname``, the module named as imported (a script's stage is not ``__main__``)."""
    module = module_name(getattr(fn, "__module__", None) or "?", getattr(fn, "__globals__", None))
    return f"{module}.{getattr(fn, '__qualname__', repr(fn))}"


def _renamed_note(old: str, new: str) -> str:
    return (
        f"the stage was found under its old script name {old}: since fingerprint scheme 3 "
        f"a function in a file run as a script is named as its import would name it ({new}), "
        "so a snapshot written by `python <script>.py` with an earlier snapstore is not reused"
    )


class Snapshot:
    """A handle on the snapshot of one stage call, committed or not yet.

    Reading (``len``, indexing, iteration, :meth:`batches`) materializes it first if needed.
    Use it as a context manager, or call :meth:`close`, to stop its reader threads. It pickles
    as its store's recipe and fingerprint, and opens again where it is unpickled (see
    :meth:`__reduce__`); a copy is another handle on the same snapshot (:meth:`__copy__`).
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
        self._call_fp = self._fp  # kept when the snapshot an earlier release wrote is read
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
        self.write_times: WriteTimes | None = None
        """Where the time of the materialization this handle ran went (set when it found no
        snapshot; None before, and when it found one committed): the stage's own code against
        snapstore's work, as the INFO line at its end says (see :mod:`snapstore.write.times`)."""

    def __repr__(self) -> str:
        state = "committed" if self.committed else "not materialized"
        return f"<Snapshot {self.fingerprint[:12]} {state} at {self.store.url}>"

    def __snapstore_upstream__(self) -> str:
        """Passed as an argument to another stage, a snapshot contributes its call's
        fingerprint (:attr:`call_fingerprint`)."""
        return self.call_fingerprint

    def __snapstore_key__(self) -> str:
        """Inside a container argument, a snapshot is identified by its call's fingerprint too."""
        return self.call_fingerprint

    @property
    def call_fingerprint(self) -> str:
        """The fingerprint this snapstore gives the stage call: :attr:`fingerprint` (the
        snapshot read), unless materializing found the snapshot that a release with an earlier
        format version wrote for the call, which ``fingerprint`` then names (see the
        ``upgrade`` setting of :class:`snapstore.StageOptions`). Another stage that takes this
        snapshot as an argument hashes this one, whichever snapshot is read."""
        return self.fingerprint if self._call_fp is None else self._call_fp.digest

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

        When it is not, but the snapshot that a release with an earlier format version (or a
        fingerprint scheme that only named things otherwise) wrote for the same call is, that
        one is read and nothing is computed: :attr:`fingerprint` then names it, and the INFO
        log says so (see :mod:`snapstore.write.upgrade` and the stage's ``upgrade`` setting).

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
                log_found(self.store, self.fingerprint)
            return self
        if self._stage is None:
            raise SnapshotNotFoundError(
                f"snapshot {self.fingerprint} is not committed under {self.store.url}"
            )
        if self._stage.read_earlier(self, progress):
            return self
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
                log_found(self.store, self.fingerprint, manifest=known.manifest)
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
        read = reader_options(options, dict(settings))  # a bad setting before the store
        batches = BatchReader(
            self._open(pin_later=True),
            batch_size,
            read,
            epoch=epoch,
            rank=rank,
            world_size=world_size,
            worker=worker,
            num_workers=num_workers,
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

    # Pickling and copying. A Snapshot holds threads, locks, memory maps and a pin that belong
    # to this process; what travels is what reopens it elsewhere (see snapstore.handle).

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its handle: the store's recipe and the fingerprint, opened by the
        receiving process on its first use (unpickling makes no request).

        What this process read and pins (commit record, manifest, index) travels along, so a
        receiver on this host reads no metadata while this process runs, and relies on its pin;
        elsewhere, or later, the receiver reads and pins for itself. A snapshot not yet
        materialized here also carries its stage (by name, as pickle sends a function) and
        the call's arguments, so the receiver can materialize it; one this process has
        materialized or read carries no code.

        Raises
        ------
        TypeError
            If the store lives in this process only (``memory://``) or has no recipe (a user
            store), or if a snapshot not yet materialized has a stage or arguments that do not
            pickle; the message names the snapshot and what to do.
        """
        what = f"snapshot {self.fingerprint[:12]} under {self.store.url}"
        try:
            where = portable(self.store, "another process", fresh_process=True)
        except TypeError as exc:
            raise TypeError(f"cannot pickle {what}: {exc}") from exc
        guard = self._guard  # the pin's holder sends; in a forked child, the parent
        sender = (socket.gethostname(), os.getpid() if guard is None else guard.pid)
        fingerprint = self._fp or self.fingerprint
        metadata = self._pinned_metadata()
        call = self._call(what)
        return (Snapshot._arrive, (where, fingerprint, metadata, sender, call, self._call_fp))

    def _call(self, what: str) -> tuple[Stage, tuple[Any, ...], dict[str, Any]] | None:
        """The stage call, for a receiver to materialize it (None once this handle has seen the
        snapshot committed: the receiver then needs no code, only the store)."""
        # _hit_logged: set once materialize() found or wrote it, or the metadata of a committed
        # snapshot arrived; close() keeps it.
        seen = self._hit_logged or self._reader is not None or self._record is not None
        if self._stage is None or seen or self._metadata is not None:
            return None
        parts = {
            f"its stage {self._stage.name} does not pickle": self._stage,
            "the arguments of its stage call do not pickle": (self._args, self._kwargs),
        }
        for problem, value in parts.items():
            try:
                pickle.dumps(value)
            except (pickle.PicklingError, TypeError, AttributeError) as exc:
                raise TypeError(
                    f"cannot pickle {what}, not materialized here: {problem} ({exc}). Call "
                    "materialize() before pickling it (a materialized snapshot travels as its "
                    "store and fingerprint alone), or define the stage at the top level of an "
                    "importable module and pass arguments that pickle"
                ) from exc
        return self._stage, self._args, self._kwargs

    def _pinned_metadata(self) -> SnapshotMetadata | None:
        """What this process read and pins, for a receiver to rely on (None when it holds no
        pin: a receiver then reads and pins for itself)."""
        guard = self._guard  # in a forked child: the parent's, started there or not at all
        if guard is None or not guard.started:
            return None
        return self.shareable_metadata()

    @classmethod
    def _arrive(
        cls,
        where: tuple[Any, ...],
        fingerprint: Fingerprint | str,
        metadata: SnapshotMetadata | None,
        sender: tuple[str, int],
        call: tuple[Stage, tuple[Any, ...], dict[str, Any]] | None = None,
        call_fp: Fingerprint | None = None,
    ) -> Snapshot:
        """A snapshot sent by another process (``sender``: host, pid), here: its store reopened
        from ``where``, nothing read. With ``metadata`` (what the sender read and pins) it reads
        no metadata, and relies on the sender's pin while the sender runs on this host.
        ``call_fp`` is the call's fingerprint where the sender read an earlier release's
        snapshot (``fingerprint``) for it."""
        stage, args, kwargs = call or (None, (), {})
        snap = cls(reopen(where), fingerprint, stage=stage, args=args, kwargs=kwargs)
        snap._call_fp = call_fp or snap._call_fp
        if metadata is not None:
            snap._metadata, snap._hit_logged = metadata, True
            host, pid = sender
            snap._pinned_elsewhere = host == socket.gethostname() and not claims.process_gone(
                host, pid
            )
        return snap

    def __copy__(self) -> Snapshot:
        """Another handle on the same snapshot (store, fingerprint, stage call), sharing none of
        this one's reader, threads or pin: it opens on its own first use, from the metadata
        this one has read, and pins for itself. Closing one leaves the other usable."""
        twin = Snapshot(
            self.store, self._fp or self.fingerprint,
            stage=self._stage, args=self._args, kwargs=self._kwargs,
        )  # fmt: skip
        twin._metadata = self.shareable_metadata() or self._metadata
        twin._record, twin._hit_logged = self._record, self._hit_logged
        twin._call_fp = self._call_fp
        return twin

    def __deepcopy__(self, memo: dict[int, Any]) -> Snapshot:
        """As :meth:`__copy__`: the data are immutable and the store is a connection, so a deep
        copy (of a model that holds a snapshot, say) shares them too."""
        return self.__copy__()


class Stage:
    """A function wrapped by :func:`snapshot`; calling it returns a :class:`Snapshot`.

    Parameters
    ----------
    fn : callable
        A function returning or yielding sample dicts.
    config : StageOptions, optional
        The stage's settings (see :class:`snapstore.StageOptions`), kept as ``stage.config``.
    **settings
        Any field of :class:`snapstore.StageOptions` as a keyword, overriding ``config``'s.

    Raises
    ------
    TypeError, ValueError
        On a bad setting, as :class:`snapstore.StageOptions` raises them, or if ``fn`` is not
        callable or ``partition_by`` is not one of its parameters.
    """

    def __init__(
        self,
        fn: Callable[..., Iterable[Mapping[str, Any]]],
        config: StageOptions | None = None,
        **settings: Unpack[StageSettings],
    ) -> None:
        if not callable(fn):
            raise TypeError(
                f"snapshot() wraps a function that yields samples; got {type(fn).__name__}"
            )
        self.fn = fn
        self.name = _stage_name(fn)
        self.config = stage_options(config, settings, "Stage()")
        self.config.check_function(fn, self.name)
        self.clock: claims.Clock = claims.SystemClock()
        functools.update_wrapper(self, fn)

    def __getattr__(self, name: str) -> Any:
        """The settings as attributes, as before they were one object: ``stage.lease`` is
        ``stage.config.lease``."""
        if name in STAGE_SETTINGS and "config" in vars(self):
            return getattr(self.config, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __reduce__(self) -> str | tuple[Any, ...]:
        """Pickled by name where the stage is found by name (a function decorated at the top
        level of a module: pickle's rule for functions), else as its function (by name) and
        settings, a Store as ``root`` travelling as its recipe. The receiving process imports
        the stage's module.

        Raises
        ------
        TypeError
            If the settings' ``root`` is a store that cannot travel (see
            :func:`snapstore.storage.travel.portable`).
        """
        found: Any = sys.modules.get(getattr(self.fn, "__module__", None) or "")
        for part in getattr(self.fn, "__qualname__", "<?>").split("."):
            found = getattr(found, part, None)
        if found is self:
            return str(self.__qualname__)
        config, where = self.config, None
        if isinstance(config.root, Store):
            destination = f"another process (stage {self.name})"
            where = portable(config.root, destination, fresh_process=True)
            config = dataclasses.replace(config, root=None)
        return (_rebuilt_stage, (self.fn, config, where, self.clock))

    def __copy__(self) -> Stage:
        """The stage itself: like a function, a stage does not change once made."""
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Stage:
        """The stage itself, as :meth:`__copy__`."""
        return self

    def partition_calls(self, snap: Snapshot) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        """The calls, ``(args, kwargs)`` per partition, that ``snap`` (a call of this
        partitioned stage) is split into (see :func:`snapstore.write.jobs.partition_calls`).

        Raises
        ------
        ValueError
            If the stage has no ``partition_by``.
        TypeError
            If the argument named by ``partition_by`` is not a sequence.
        """
        by = self.config.partition_by
        if by is None:
            raise ValueError(f"{self.name} has no partition_by: it is computed as one call")
        return partition_calls(self.fn, snap._args, snap._kwargs, by, self.config.partition_size)

    def fingerprint(self, *args: Any, **kwargs: Any) -> Fingerprint:
        """The fingerprint of a call, without running anything."""
        config = self.config
        return fingerprint_stage(
            self.fn,
            args,
            kwargs,
            format_version=fmt.FORMAT_VERSION,
            version=config.version,
            key=config.key,
            ignore=config.ignore,
            ignore_globals=config.ignore_globals,
        )

    def fingerprint_as(self, snap: Snapshot, naming: Naming) -> Fingerprint:
        """The fingerprint that a release of ``naming`` gave ``snap``'s call, with each upstream
        snapshot among its arguments named as that release named it (see
        :mod:`snapstore.fingerprint.earlier`); no I/O.

        Raises
        ------
        ValueError
            If ``snap`` is not a call of a stage (it was opened by its fingerprint).
        """
        call = snap._call_fp
        if call is None:
            raise ValueError(f"snapshot {snap.fingerprint} is no stage call: it has one name")
        if naming.scheme in SCRIPTS_AS_MAIN and names_script_code(call):
            with script_names_as_main():
                call = self.fingerprint(*snap._args, **snap._kwargs)
        calls = {
            value.call_fingerprint: value
            for value in (*snap._args, *snap._kwargs.values())
            if isinstance(value, Snapshot) and value._stage is not None
            and value._call_fp is not None
        }  # fmt: skip
        upstream = {
            arg: up._stage.fingerprint_as(up, naming).digest
            for arg, found in (call.details.get("upstream") or {}).items()
            if (up := calls.get(found)) is not None and up._stage is not None
        }
        return renamed(call, naming, upstream)

    def read_earlier(self, snap: Snapshot, progress: ProgressArg = None) -> bool:
        """Whether the snapshot that a release with an earlier format version wrote for
        ``snap``'s call (uncommitted under its own fingerprint) is committed; if so ``snap``
        reads it (after rewriting it under its own fingerprint, with ``upgrade=True``), and
        the INFO log says so. One existence request per earlier naming, all at once.

        Raises
        ------
        SnapstoreError
            With ``upgrade=True``, if the earlier snapshot cannot be read to be rewritten.
        """
        call = snap._call_fp
        if call is None or snap.fingerprint != call.digest:
            return False
        namings = earlier_namings(fmt.FORMAT_VERSION)
        candidates = [self.fingerprint_as(snap, naming) for naming in namings]
        found = upgrade.first_committed(snap.store, [c.digest for c in candidates])
        if found is None:
            return False
        naming, earlier = namings[found], candidates[found]
        rewritten = self.config.upgrade and upgrade.rewrite(
            self.job(snap), earlier.digest, naming, progress
        )
        read = call if rewritten else earlier
        try:
            snap._record = read_record(snap.store, read.digest)
        except SnapshotNotFoundError:  # removed since it was found: computed as if never found
            return False
        snap._fp, snap.fingerprint, snap._hit_logged = read, read.digest, True
        upgrade.log_earlier(snap.store, earlier.digest, naming, call.digest, rewritten)
        return True

    def __call__(self, *args: Any, **kwargs: Any) -> Snapshot:
        fp = self.fingerprint(*args, **kwargs)
        return Snapshot(open_store(self.config.root), fp, stage=self, args=args, kwargs=kwargs)

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

    def job(self, snap: Snapshot) -> StageJob:
        """What the write layer needs to materialize ``snap`` (see :mod:`snapstore.write.jobs`)."""
        fp = snap._fp
        manifest = {
            "stage": self.name,
            "fingerprint_parts": fp.parts if fp else {},
            "fingerprint_details": fp.details if fp else {},
            "version": self.config.version,
        }
        explain = functools.partial(self.explain_miss, snap)
        args, kwargs = snap._args, snap._kwargs
        return StageJob(
            snap, self.fn, self.name, args, kwargs, self.config, self.clock, manifest, explain
        )

    def write(self, snap: Snapshot, progress: ProgressArg | Reporter = None) -> None:
        """Materialize ``snap``: claim it and compute, or wait for the job that holds the claim
        (or pass through, or raise, per ``on_busy``); on any error nothing is visible.
        ``progress`` as for :meth:`Snapshot.materialize`; its display is closed on every path.
        Where the time went is kept as ``snap.write_times``."""
        snap.write_times = run_job(self.job(snap), progress)

    def _compute(self, snap: Snapshot, progress: ProgressCallback | None) -> None:
        """Run the stage for ``snap``'s arguments and commit, without claiming it (a test's
        stand-in for another job)."""
        jobs.compute(self.job(snap), progress)


def _rebuilt_stage(
    fn: Callable[..., Iterable[Mapping[str, Any]]],
    config: StageOptions,
    where: tuple[Any, ...] | None,
    clock: claims.Clock,
) -> Stage:
    """A pickled :class:`Stage` that travelled by value (see :meth:`Stage.__reduce__`)."""
    if where is not None:
        config = dataclasses.replace(config, root=reopen(where))
    stage = Stage(fn, config)
    stage.clock = clock
    return stage


@overload
def snapshot(
    fn: F, config: StageOptions | None = None, **settings: Unpack[StageSettings]
) -> Stage: ...
@overload
def snapshot(
    fn: None = None, config: StageOptions | None = None, **settings: Unpack[StageSettings]
) -> Callable[[F], Stage]: ...


def snapshot(
    fn: F | None = None, config: StageOptions | None = None, **settings: Unpack[StageSettings]
) -> Stage | Callable[[F], Stage]:
    """Wrap a stage so its output is materialized once and read back from then on.

    Use as ``@snapshot``, ``@snapshot(root=...)`` or ``snapshot(fn, root=...)``.

    Parameters
    ----------
    fn : callable
        A function returning or yielding sample dicts.
    config : StageOptions, optional
        All the settings as one object (shared by several stages, say).
    **settings
        Any field of :class:`snapstore.StageOptions` as a keyword, overriding ``config``'s:
        ``root`` (where snapshots live; default ``$SNAPSTORE_ROOT``, else the per-user cache
        directory), ``version``, ``key``, ``ignore`` and ``ignore_globals`` (what the fingerprint
        hashes besides the code and arguments), ``schema``, ``options`` (a
        :class:`~snapstore.WriteOptions`), ``on_busy`` and ``lease`` (what a job does while
        another computes the same snapshot), ``partition_by``, ``partition_size``, ``engine``
        and ``workers`` (splitting a large stage into partitions computed in parallel and
        never recomputed). See :class:`snapstore.StageOptions` for each and its default.

    Returns
    -------
    Stage
        Call it with the stage's arguments to get a :class:`Snapshot`.

    Raises
    ------
    TypeError, ValueError
        On an unknown or bad setting, as :class:`snapstore.StageOptions` raises them (checked
        here, before a decorator gets its function).

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
    checked = stage_options(config, settings)
    if fn is None:
        return lambda f: Stage(f, checked)
    return Stage(fn, checked)


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
