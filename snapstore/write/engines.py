"""Engines that compute the partitions of a partitioned stage: local processes, threads, Ray, Dask.

An engine only runs :func:`run_partition` tasks and hands back their results; everything that
makes a snapshot whole stays in the job that called the stage (claims, waiting for other jobs,
assembling the partitions, the commit). A task writes one partition into a run of its own and
commits it with create-if-absent, so an engine that retries a task, or runs it twice, can never
duplicate data: the first commit wins and a loser's run is garbage for ``snapstore gc``.

Engines are :class:`Engine` objects; :func:`make_engine` turns the names ``snapshot(...,
engine=...)`` accepts into one.

=============  ===========================================================================
``process``    A pool of ``workers`` spawned processes on this machine (default: the usable
               cores). The stage is sent by reference (module and name), so it must be
               importable: defined at the top level of a module, or of a script run with an
               ``if __name__ == "__main__":`` guard. No retries: a failed partition fails the
               job (finished partitions are kept). Each worker's numeric thread pools (OpenMP,
               BLAS, torch) are sized to its share of the cores: see :func:`thread_pool_env`.
``thread``     ``workers`` threads in this process: for stages that cannot be sent (lambdas,
               closures) or that release the GIL.
``ray``        One Ray task per partition on the cluster ``ray.init()`` joined (a local one if
               none), retried ``retries`` times on failure (extra ``ray``).
``dask``       One task per partition on a ``dask.distributed`` client: the given one, the
               current one, or a local cluster started for the job (extra ``dask``).
=============  ===========================================================================
"""

from __future__ import annotations

import ast
import concurrent.futures as cf
import importlib
import logging
import multiprocessing
import os
import pickle
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.context import SpawnContext, SpawnProcess
from pathlib import Path
from typing import Any, Protocol

from .. import tracing
from ..errors import StageError
from ..format.schema import Schema
from ..oldpaths import historic_name
from ..storage.store import Store
from ..storage.travel import portable, reopen
from .partitions import PartitionLayout, write_partition
from .times import WriteTimes
from .writer import WriteOptions

__all__ = [
    "DaskEngine",
    "Engine",
    "KNOWN_EXECUTORS",
    "load_executor",
    "CannotTravelError",
    "PartitionResult",
    "PartitionTask",
    "ProcessEngine",
    "RayEngine",
    "THREAD_VARIABLES",
    "ThreadEngine",
    "make_engine",
    "run_partition",
    "thread_pool_env",
    "usable_cores",
]

log = logging.getLogger(historic_name(__name__))

ENGINE_NAMES = ("process", "thread", "ray", "dask")


def usable_cores() -> int:
    """CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@dataclass(frozen=True)
class FunctionRef:
    """A module-level function (or stage) by name, for processes that import it themselves."""

    module: str
    qualname: str

    @classmethod
    def of(cls, fn: Any) -> FunctionRef | None:
        """A reference that finds ``fn`` again, or None if ``fn`` cannot be found by name."""
        ref = cls(getattr(fn, "__module__", None) or "", getattr(fn, "__qualname__", "") or "")
        if not ref.module or "<" in ref.qualname:  # <lambda>, <locals>
            return None
        if ref.module == "__main__" and not _main_is_guarded():
            return None
        try:
            found = ref.lookup()
        except (ImportError, AttributeError):
            return None
        return ref if found is fn or getattr(found, "fn", None) is fn else None

    def lookup(self) -> Any:
        found: Any = importlib.import_module(self.module)
        for part in self.qualname.split("."):
            found = getattr(found, part)
        return found

    def resolve(self) -> Callable[..., Any]:
        """The function (a :class:`~snapstore.snapshot.Stage` found by name gives its ``fn``)."""
        found = self.lookup()
        fn = getattr(found, "fn", found)
        if not callable(fn):
            raise StageError(f"{self.module}.{self.qualname} is not a function: found {found!r}")
        return fn  # type: ignore[no-any-return]


def _main_is_guarded() -> bool:
    """Whether the main script can be imported by a spawned process without running the job
    again: it is a file with a top-level ``if __name__ == "__main__":`` block."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path:
        return False  # an interpreter prompt, a notebook, python -c: nothing to import
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return False
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            names = [node.test.left, *node.test.comparators]
            if any(isinstance(n, ast.Name) and n.id == "__name__" for n in names) and any(
                isinstance(n, ast.Constant) and n.value == "__main__" for n in names
            ):
                return True
    return False


@dataclass(frozen=True)
class PartitionTask:
    """Everything a worker needs to compute one partition; pickles to names, data and a URL."""

    function: Callable[..., Any] | FunctionRef
    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    root: Store | tuple[Any, ...]
    fingerprint: str
    partition: int
    schema: Schema | None = None
    options: WriteOptions | None = None
    # A shared partition's place (a layout of this one partition); None: <fingerprint>/parts/<p>.
    layout: PartitionLayout | None = None
    # The job's process: a task run in another one labels that process in a trace.
    job_pid: int = field(default_factory=os.getpid)


@dataclass(frozen=True)
class PartitionResult:
    """What a task reports back: the partition, its size, whether its commit won, where it ran,
    and where its time went (added up by the job: see :mod:`snapstore.write.times`)."""

    partition: int
    samples: int
    stored_bytes: int
    seconds: float
    committed: bool
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    times: WriteTimes | None = None


def run_partition(task: PartitionTask) -> PartitionResult:
    """Compute and commit one partition (in whichever process the engine chose).

    Raises
    ------
    StageError
        If the stage does not return an iterable of samples; any error of the stage itself
        propagates unchanged (nothing of the partition is committed).
    """
    fn = task.function.resolve() if isinstance(task.function, FunctionRef) else task.function
    store = task.root if isinstance(task.root, Store) else reopen(task.root)
    written = [0, 0]

    def progress(samples: int, stored: int) -> None:
        written[:] = [samples, stored]

    def samples() -> Iterable[Mapping[str, Any]]:
        out = fn(*task.args, **task.kwargs)
        if not isinstance(out, Iterable):
            raise StageError(
                f"stage {task.name} returned {type(out).__name__}; expected an iterable of "
                "sample dicts (write it as a generator that yields dicts)."
            )
        return out

    worker = os.getpid() != task.job_pid
    if worker:
        tracing.label_process(_worker_label())
    began = time.perf_counter()
    where, index = (task.layout, 0) if task.layout else (task.fingerprint, task.partition)
    times = WriteTimes(partitions=1)
    try:
        committed = write_partition(
            store,
            where,
            index,
            samples,
            schema=task.schema,
            options=task.options,
            progress=progress,
            times=times,
        )
    finally:
        if worker:  # its part of the trace now: a pool's worker may live on, or be killed
            tracing.flush()
    seconds = time.perf_counter() - began
    return PartitionResult(task.partition, written[0], written[1], seconds, committed, times=times)


def _worker_label() -> str:
    """What a trace calls this engine worker: its number in a process pool, else its pid;
    the rank first under torchrun."""
    identity = getattr(multiprocessing.current_process(), "_identity", ())
    rank = os.environ.get("RANK")
    number = identity[0] if identity else os.getpid()
    return f"{f'rank {rank} ' if rank is not None else ''}engine worker {number}"


class Executor(Protocol):
    """What an engine hands out: ``submit`` returning a future, ``shutdown``."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]: ...

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None: ...


class Engine:
    """Runs partition tasks. Subclasses say how tasks travel and where they run.

    Attributes
    ----------
    name : str
        What logs and errors call it.
    workers : int
        Tasks kept in flight at once.
    """

    name = "engine"
    workers = 1
    fallback = False  # run on threads when a task cannot be sent (see ProcessEngine)

    def prepare(self, task: PartitionTask, stage: Callable[..., Any]) -> PartitionTask:
        """``task`` (holding the stage's function and the Store) in the form this engine sends.

        By default the function as it is (Ray and Dask pickle it with cloudpickle) and the
        store as something another process reopens.

        Raises
        ------
        StageError
            If the store lives only in this process.
        """
        return _replace(task, root=_portable_root(task.root, self.name))

    def executor(self) -> Executor:
        """A fresh executor for one job; the caller shuts it down."""
        raise NotImplementedError


class ThreadEngine(Engine):
    """Partitions on ``workers`` threads of this process."""

    name = "thread"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = _workers(workers)

    def prepare(self, task: PartitionTask, stage: Callable[..., Any]) -> PartitionTask:
        return task  # shared as they are

    def executor(self) -> Executor:
        return cf.ThreadPoolExecutor(self.workers, thread_name_prefix="snapstore-partition")


class ProcessEngine(Engine):
    """Partitions on a pool of ``workers`` processes started with ``spawn``.

    ``spawn`` rather than ``fork``: the job holds threads (heartbeats, fsspec event loops,
    prefetchers) that a forked child would inherit mid-operation. The stage and its arguments
    are pickled; the stage travels by module and name.
    """

    name = "process"

    def __init__(self, workers: int | None = None, *, fallback: bool = False) -> None:
        self.workers = _workers(workers)
        self.fallback = fallback

    def prepare(self, task: PartitionTask, stage: Callable[..., Any]) -> PartitionTask:
        task = super().prepare(task, stage)
        main = getattr(sys.modules.get("__main__"), "__file__", None)
        if main and not Path(main).is_file():  # `python -`: spawn would run "<stdin>" again
            raise CannotTravelError(
                f"the main program ({main}) is not a file that a spawned process can start "
                f"from (a program read from standard input), so engine='process' cannot run "
                f"stage {task.name}. Run the program from a file, or pass engine='thread'."
            )
        ref = FunctionRef.of(stage)
        if ref is None:
            raise CannotTravelError(
                f"stage {task.name} cannot be found by name in another process (it is a "
                "lambda, a closure, defined inside a function, or in a main script without an "
                "`if __name__ == '__main__':` block, which a spawned process would run "
                "again), so engine='process' cannot run it. Define it at the top level of a "
                "module, or of a script whose job runs under `if __name__ == '__main__':`, or "
                "pass engine='thread'."
            )
        task = _replace(task, function=ref)
        try:
            pickle.dumps(task)
        except Exception as exc:
            raise CannotTravelError(
                f"the arguments of stage {task.name} do not pickle ({exc}), so engine='process' "
                "cannot send them to a worker process; pass picklable arguments (paths, "
                "numbers, lists) or engine='thread'."
            ) from exc
        return task

    def executor(self) -> Executor:
        return cf.ProcessPoolExecutor(self.workers, mp_context=_PoolSizedContext(self.workers))


#: The variables that size numeric libraries' thread pools. Each library reads its own once, when
#: it loads, and starts that many threads (one per core when unset): OpenMP (torch's intra-op
#: pool, and BLAS builds that use OpenMP), OpenBLAS, MKL, BLIS, Apple Accelerate, numexpr.
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
# These libraries read OMP_NUM_THREADS when their own variable is unset, so a user's
# OMP_NUM_THREADS already sizes them: setting theirs would override what the user asked for.
_READ_OMP = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def thread_pool_env(workers: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables the process engine sets for each of ``workers`` worker processes.

    A worker that loads numpy's BLAS or torch starts a pool of one thread per core, so ``W``
    workers would run ``W`` times as many busy threads as there are cores and spend their time
    waiting for each other (a numpy stage ran 15-100x slower than a plain loop on 2 cores).
    Each worker gets ``max(1, usable_cores() // workers)`` threads instead, in every variable of
    :data:`THREAD_VARIABLES` the user has not set: a variable set (non-empty) in ``environ`` is
    the user's choice and stays as it is, and a user's ``OMP_NUM_THREADS`` also leaves
    OpenBLAS, MKL, BLIS and numexpr to it, since they read it when their own is unset.

    Parameters
    ----------
    workers : int
        Worker processes sharing this machine's cores.
    environ : mapping, optional
        The environment the workers inherit; default ``os.environ``.

    Returns
    -------
    dict
        Variable name to value, only for the variables to set.

    Examples
    --------
    >>> thread_pool_env(2, {"MKL_NUM_THREADS": "4"})  # doctest: +SKIP
    {'OMP_NUM_THREADS': '1', 'OPENBLAS_NUM_THREADS': '1', 'BLIS_NUM_THREADS': '1', ...}
    """
    environ = os.environ if environ is None else environ
    users = {name for name in THREAD_VARIABLES if environ.get(name, "").strip()}
    if "OMP_NUM_THREADS" in users:
        users.update(_READ_OMP)
    share = str(max(1, usable_cores() // workers))
    return {name: share for name in THREAD_VARIABLES if name not in users}


# os.environ is process-wide: one worker start at a time changes it.
_environ_lock = threading.Lock()


@contextmanager
def _environ_set(changes: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``changes`` while the block runs, as it was afterwards."""
    saved = {name: os.environ.get(name) for name in changes}
    try:
        os.environ.update(changes)
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class _PoolSizedProcess(SpawnProcess):
    """A spawned process that starts with its share of the cores in the thread-pool variables.

    The variables must be in the new interpreter's environment from its first instruction: a
    spawned worker imports the parent's main module (and with it numpy or torch, whose pools
    are sized on load) before any initializer could run. The spawned interpreter copies the
    parent's environment when it is started, so the parent's environment carries the
    variables for exactly that moment, under a lock; other threads of the job may see them
    for those few milliseconds.
    """

    workers = 1

    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        with _environ_lock, _environ_set(thread_pool_env(process_obj.workers)):
            return SpawnProcess._Popen(process_obj)


class _PoolSizedContext(SpawnContext):
    """The ``spawn`` context, whose processes are :class:`_PoolSizedProcess` of a pool."""

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def Process(self, *args: Any, **kwargs: Any) -> SpawnProcess:  # type: ignore[override]
        process = _PoolSizedProcess(*args, **kwargs)
        process.workers = self.workers
        return process


class CannotTravelError(StageError):
    """The stage, its arguments or its store cannot be sent to a worker process."""


def _replace(task: PartitionTask, **changes: Any) -> PartitionTask:
    return PartitionTask(**{**task.__dict__, **changes})


def _portable_root(store: Any, engine: str) -> Any:
    if getattr(getattr(store, "fs", None), "protocol", None) in ("memory", ("memory",)):
        raise CannotTravelError(
            f"a memory:// store lives in this process only, so engine={engine!r} cannot write "
            "to it from workers; use engine='thread' or a local path or bucket URL as the root"
        )
    try:
        return portable(store, f"{engine} workers")
    except TypeError as exc:
        raise CannotTravelError(f"{exc}; or pass engine='thread'") from exc


class RayEngine(Engine):
    """One Ray task per partition (see :class:`snapstore.ray.RayExecutor`).

    Parameters
    ----------
    workers : int, optional
        Partitions in flight at once; default the cluster's CPUs.
    retries : int
        Times Ray reruns a task that failed, whether its process died or it raised.
    """

    name = "ray"

    def __init__(self, workers: int | None = None, *, retries: int = 1) -> None:
        self._workers = workers
        self.retries = retries
        self.workers = _workers(workers)

    def executor(self) -> Executor:
        executor_class = load_executor("ray")
        pool: Executor = executor_class(max_retries=self.retries, retry_exceptions=self.retries > 0)
        if self._workers is None:
            import ray

            cpus = ray.cluster_resources().get("CPU", 1)  # type: ignore[no-untyped-call]
            self.workers = max(1, int(cpus))
        return pool


class DaskEngine(Engine):
    """One task per partition on a ``dask.distributed`` cluster.

    Parameters
    ----------
    client : distributed.Client, optional
        The cluster to use; default the current client, else a ``LocalCluster`` of
        ``workers`` single-threaded worker processes started for the job and closed after it.
    workers : int, optional
        Partitions in flight at once; default the cluster's threads.
    retries : int
        Times Dask reruns a task that raised or whose worker died.
    """

    name = "dask"

    def __init__(self, client: Any = None, *, workers: int | None = None, retries: int = 1) -> None:
        self.client = client
        self._workers = workers
        self.retries = retries
        self.workers = _workers(workers)

    def executor(self) -> Executor:
        try:
            import distributed
        except ImportError as exc:
            raise ImportError(
                f"engine='dask' needs dask.distributed ({exc}); pip install 'snapstore[dask]'"
            ) from exc
        client, owned = self.client, None
        if client is None:
            try:
                client = distributed.get_client()
            except ValueError:
                log.info("snapstore: no Dask client; starting a local cluster for this job")
                cluster = distributed.LocalCluster(  # type: ignore[no-untyped-call]
                    n_workers=self.workers, threads_per_worker=1, dashboard_address=None
                )
                client = distributed.Client(cluster)  # type: ignore[no-untyped-call]
                owned = (client, cluster)
        if self._workers is None:
            self.workers = max(1, sum(client.nthreads().values()))
        return _DaskExecutor(client, self.retries, owned)


class _DaskExecutor:
    """``client.submit`` behind the executor interface, with concurrent futures."""

    def __init__(self, client: Any, retries: int, owned: tuple[Any, Any] | None) -> None:
        self.client, self.retries, self.owned = client, retries, owned

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        remote = self.client.submit(fn, *args, retries=self.retries, pure=False, **kwargs)
        future: cf.Future[Any] = cf.Future()

        def done(finished: Any) -> None:
            try:
                future.set_result(finished.result())
            except BaseException as exc:  # the task's own error, passed on unchanged
                future.set_exception(exc)

        remote.add_done_callback(done)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if self.owned is not None:
            for part in self.owned:
                part.close()


# Executors that live in an integration above this module, by engine name, as "module:attribute"
# imported on first use (as fsspec's ``known_implementations``): the write layer does not
# depend on the integrations, and ``import snapstore`` imports no Ray.
KNOWN_EXECUTORS = {"ray": "snapstore.ray:RayExecutor"}


def load_executor(engine: str) -> Any:
    """The executor class :data:`KNOWN_EXECUTORS` names for ``engine``, imported now."""
    module, _, attribute = KNOWN_EXECUTORS[engine].partition(":")
    return getattr(importlib.import_module(module), attribute)


def _workers(workers: int | None) -> int:
    if workers is None:
        return usable_cores()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers: expected an int >= 1, found {workers!r}")
    return workers


def make_engine(engine: str | Engine | None, workers: int | None = None) -> Engine:
    """The engine ``snapshot(..., engine=..., workers=...)`` names.

    ``None`` is ``"process"`` that falls back to threads (with a warning) for a stage that
    cannot be sent to another process; a ``dask.distributed.Client`` means ``DaskEngine(client)``.
    """
    if isinstance(engine, Engine):
        if workers is not None:
            raise ValueError("pass workers to the engine object, not to snapshot()")
        return engine
    if engine is None:
        return ProcessEngine(workers, fallback=True)
    if hasattr(engine, "submit") and hasattr(engine, "nthreads"):
        return DaskEngine(engine, workers=workers)
    if engine == "process":
        return ProcessEngine(workers)
    if engine == "thread":
        return ThreadEngine(workers)
    if engine == "ray":
        return RayEngine(workers)
    if engine == "dask":
        return DaskEngine(workers=workers)
    raise ValueError(
        f"engine: expected one of {ENGINE_NAMES}, an Engine or a dask.distributed.Client, "
        f"found {engine!r}"
    )
