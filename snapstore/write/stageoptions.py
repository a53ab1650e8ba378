"""How a stage is snapshotted: :class:`StageOptions`, the settings of ``snapshot()``/``Stage``.

The settings say where snapshots live, what goes into the fingerprint besides code and
arguments, how samples are written, what a job does when another job computes the same
snapshot, and how a large stage is split into partitions. ``snapshot(fn, root=..., lease=...)``
builds one from its keywords; ``snapshot(fn, config=StageOptions(...))`` takes one made ahead
(one object shared by several stages), and keywords given with it override its fields.

Layer: write (the engines and :class:`~snapstore.write.writer.WriteOptions` are its fields).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict, get_args

from ..format.schema import Schema
from ..storage.roots import check_root
from ..storage.store import Store
from .engines import Engine, make_engine
from .writer import WriteOptions

__all__ = ["ON_BUSY", "OnBusy", "StageOptions", "StageSettings", "stage_options"]

OnBusy = Literal["wait", "pass", "error"]
ON_BUSY: tuple[str, ...] = get_args(OnBusy)

Root = str | os.PathLike[str] | Store | None


class StageSettings(TypedDict, total=False):
    """The fields of :class:`StageOptions` as keyword arguments (for ``**settings``), with the
    forms each accepts (a schema as a mapping, names as any collection, None for defaults)."""

    root: Root
    version: str | None
    key: Callable[..., Any] | None
    ignore: Collection[str]
    ignore_globals: Collection[str]
    schema: Schema | Mapping[str, Any] | None
    options: WriteOptions | None
    on_busy: OnBusy
    lease: float
    partition_by: str | None
    partition_size: int
    engine: str | Engine | Any | None
    workers: int | None
    upgrade: bool


@dataclass(frozen=True)
class StageOptions:
    """The settings of a stage wrapped by :func:`snapstore.snapshot`; none is required.

    Only ``version``, ``key``, ``ignore`` and ``ignore_globals`` change the fingerprint; the
    others say where and how the same snapshot is written.

    Parameters
    ----------
    root : str, path or Store, optional
        Where snapshots live: a local directory or fsspec URL. Default ``$SNAPSTORE_ROOT``, else
        the per-user cache directory (``~/.cache/snapstore`` on Linux). Its type is checked
        here (an empty string, a number or bytes is refused); it is opened, and checked as a
        store, when the stage is called.
    version : str, optional
        Folded into the fingerprint; bump it to force a new snapshot.
    key : callable, optional
        ``key(*args, **kwargs)`` returns what identifies the arguments, in place of hashing them.
    ignore : collection of str
        Argument names left out of the fingerprint (verbosity, thread counts...). Kept as a
        tuple.
    ignore_globals : collection of str
        Globals (``LOCK``, ``helpers.CACHE``), closure variables or ``Class.attr`` that the code
        reads but that do not change the data and cannot be hashed (locks, open files).
    schema : Schema, optional
        Declared schema. Inferred from the first block otherwise. A mapping is declared with
        :meth:`Schema.declare` (the field is typed as what it keeps, a Schema).
    options : WriteOptions
        Block size, shard size, compression, threads (not part of the fingerprint); None gives
        the defaults.
    on_busy : {"wait", "pass", "error"}
        What a job does when another job holds the claim on the same fingerprint (a sweep
        started together): ``"wait"`` (default) for its commit, then read it (taking the claim
        over if the holder stops renewing it); ``"pass"``: compute without storing, into a
        private temporary directory; ``"error"``: raise :class:`~snapstore.BusyError`.
        Waiting is the default because a sweep's jobs then compute each snapshot once.
    lease : float
        Seconds a claim lives without a heartbeat (the holder renews it every ``lease / 4``);
        after that a waiting job takes it over. Clocks of the jobs should agree to well within
        this; if they do not, the cost is a duplicate computation, never a wrong snapshot. 60 s
        outlasts a stalled write to a bucket, yet a crashed job's work is taken over within a
        minute.
    partition_by : str, optional
        The parameter holding the inputs to split the stage on: ``snapstore.files(...)`` or a
        sequence (files, URLs, ranges). Each partition (consecutive inputs, about
        ``partition_size`` of them, at boundaries the inputs choose:
        :mod:`snapstore.write.boundaries`) is computed by calling the function with just those
        inputs (an ``Inputs`` of its files, for ``files()``), committed on its own under its own
        fingerprint (:mod:`snapstore.fingerprint.partition`), and never recomputed: a rerun
        after a crash, and any later call of the stage whose inputs include the partition's,
        reuse it, and jobs of a sweep share the partitions between them (with
        ``on_busy="wait"``). The snapshot is the partitions' samples in order, so the function
        must produce for a list what it produces for its pieces one after another. Does not
        change the snapshot's fingerprint.
    partition_size : int
        The mean number of inputs per partition (default 1: one partition per input).
    engine : {"process", "thread", "ray", "dask"}, Engine or dask Client, optional
        Where the partitions of a partitioned stage run (see :mod:`snapstore.write.engines`).
        By default a pool of spawned processes, one per usable core, falling back to threads
        (with a warning) for a stage that cannot be sent to a process. The engine is not part
        of the fingerprint: any engine writes the same snapshot.
    workers : int, optional
        Partitions computed at once by the ``"process"`` or ``"thread"`` engine (default: the
        usable cores); for Ray and Dask, the partitions kept in flight.
    upgrade : bool
        What to do with a snapshot that a release with an earlier format version wrote for the
        call (found when the call's own fingerprint is not committed, see
        :mod:`snapstore.write.upgrade`): False (default) reads it as it is, computing nothing;
        True first rewrites it in the current format under the call's current fingerprint
        (its samples read and written again, not computed) and reads that. False by default
        because every reader reads every earlier version: a rewrite costs a pass over the data
        and the space of a second copy, for what the new format brings (faster checksums, for
        version 3). Does not change the fingerprint.

    Raises
    ------
    TypeError
        If a setting has the wrong type (``root=123`` or bytes, ``ignore="name"``, a ``key``
        that is not callable, ``options`` that are not a WriteOptions, a ``partition_size``
        that is not an int, an ``upgrade`` that is not a bool).
    ValueError
        If ``root`` is an empty string, ``on_busy`` is not a known mode, ``lease`` is not a
        positive number of seconds, ``partition_size`` is below 1, or the engine is unknown.

    Examples
    --------
    >>> from snapstore import StageOptions
    >>> shared = StageOptions(root="/tmp/snaps", on_busy="pass", lease=30)
    >>> shared.replace(version="2").version
    '2'
    >>> @snapshot(config=shared, version="2")                          # doctest: +SKIP
    ... def tokenized(paths): ...

    ``engine`` and ``workers`` need ``partition_by``, which is checked against the function
    when a stage is made (see :meth:`check_function`), so that one object can carry an
    engine for stages that each name their own ``partition_by``.
    """

    root: Root = None
    version: str | None = None
    key: Callable[..., Any] | None = None
    ignore: Collection[str] = ()
    ignore_globals: Collection[str] = ()
    schema: Schema | None = None
    options: WriteOptions = field(default_factory=WriteOptions)
    on_busy: OnBusy = "wait"
    lease: float = 60.0
    partition_by: str | None = None
    partition_size: int = 1
    engine: str | Engine | Any | None = None
    workers: int | None = None
    upgrade: bool = False

    def __post_init__(self) -> None:
        check_root(self.root)
        if self.key is not None and not callable(self.key):
            raise TypeError(
                f"key: expected a callable key(*args, **kwargs) or None, found "
                f"{type(self.key).__name__}"
            )
        for name in ("ignore", "ignore_globals"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not isinstance(value, Collection):
                raise TypeError(
                    f"{name}: expected a collection of names, found {value!r}; "
                    f"write {name}=({value!r},) for one name"
                )
            object.__setattr__(self, name, tuple(value))
        schema: Any = self.schema
        if schema is not None and not isinstance(schema, Schema):
            object.__setattr__(self, "schema", Schema.declare(schema))
        options: Any = self.options
        if options is None:
            object.__setattr__(self, "options", WriteOptions())
        elif not isinstance(options, WriteOptions):
            raise TypeError(
                f"options: expected a snapstore.WriteOptions, found {type(options).__name__}; "
                "pass WriteOptions(block_bytes=..., ...)"
            )
        if self.on_busy not in ON_BUSY:
            raise ValueError(f"on_busy: expected one of {ON_BUSY}, found {self.on_busy!r}")
        lease: Any = self.lease
        if not isinstance(lease, (int, float)) or not lease > 0:
            raise ValueError(f"lease: expected a positive number of seconds, found {lease!r}")
        object.__setattr__(self, "lease", float(lease))
        if not isinstance(self.upgrade, bool):
            raise TypeError(f"upgrade: expected True or False, found {self.upgrade!r}")
        self._check_partitions()

    def _check_partitions(self) -> None:
        if self.partition_by is not None and not isinstance(self.partition_by, str):
            raise TypeError(
                f"partition_by: expected the name of a parameter, found {self.partition_by!r}"
            )
        size: Any = self.partition_size
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"partition_size: expected an int, found {size!r}")
        if size < 1:
            raise ValueError(f"partition_size: expected an int >= 1, found {size}")
        make_engine(self.engine, self.workers)  # fails here on a bad name or count

    def check_function(self, fn: Callable[..., Any], name: str) -> None:
        """Check the settings that depend on the stage's function ``fn`` (named ``name``).

        Raises
        ------
        ValueError
            If ``partition_by`` is not a parameter of ``fn``, or ``engine``/``workers`` are set
            without ``partition_by``.
        """
        by = self.partition_by
        if by is not None and by not in inspect.signature(fn).parameters:
            raise ValueError(
                f"partition_by={by!r} is not a parameter of {name}; "
                "name the argument that holds the list of inputs to split"
            )
        if (self.engine is not None or self.workers is not None) and by is None:
            raise ValueError(
                f"engine and workers apply to partitioned stages; {name} has no "
                "partition_by. Add partition_by='<the argument holding the inputs>' to split "
                "the work into partitions the engine can run in parallel."
            )

    def replace(self, **changes: Any) -> StageOptions:
        """A copy with ``changes`` applied (and validated), e.g. ``options.replace(lease=30)``.

        Raises
        ------
        TypeError
            If a name in ``changes`` is not a setting.
        """
        check_names(changes, "StageOptions.replace()")
        return dataclasses.replace(self, **changes)


NAMES = tuple(f.name for f in dataclasses.fields(StageOptions))


def check_names(settings: Mapping[str, Any], caller: str) -> None:
    """Raise TypeError naming the keys of ``settings`` that are not settings of a stage."""
    unknown = sorted(set(settings) - set(NAMES))
    if unknown:
        raise TypeError(
            f"{caller} got unexpected settings {unknown}; expected some of {', '.join(NAMES)} "
            "(or all of them as config=StageOptions(...))"
        )


def stage_options(
    config: StageOptions | None, settings: Mapping[str, Any], caller: str = "snapshot()"
) -> StageOptions:
    """``config`` (default ``StageOptions()``) with the keyword ``settings`` overriding it.

    Raises
    ------
    TypeError
        If ``config`` is not a StageOptions or a setting's name is unknown (``caller`` names
        the call in the message).
    """
    check_names(settings, caller)
    if config is None:
        return StageOptions(**settings)
    if not isinstance(config, StageOptions):
        raise TypeError(
            f"config: expected a snapstore.StageOptions, found {type(config).__name__}; "
            "pass StageOptions(...) or the settings as keyword arguments"
        )
    return dataclasses.replace(config, **settings) if settings else config
