"""A DataLoader worker's batches in a pool of shared-memory segments, recycled across batches.

Sending a tensor from a worker, torch makes a new shared-memory segment for it (or uses the one
it is in) and the main process fetches the segment's file descriptor from the worker over a
socket, with a handshake, then maps it: per batch, one new segment whose pages are faulted in
and zeroed twice (once in each process) and one round trip between the processes. Measured on
2 cores, that halved what 2 workers deliver (img, batch 256: 17-19k samples/s, against 39-43k
with no workers). Here instead:

- each worker keeps a few segments (``memfd_create``: no name in ``/dev/shm``, nothing to leave
  behind) and :func:`allocate_pooled` assembles each batch straight into a free one (a
  *lease*);
- :class:`PooledBatch` sends the batch as the segment's token, the lease's generation and the
  tensors' places in it. The file descriptor goes with the first batch of each segment only;
  the main process maps the segment once and keeps the mapping;
- in the main process the batch's tensors are views of one storage made for the batch, whose
  lifetime is one ndarray's. When the last of them is gone (the batch, a slice of it, a view,
  a ``RaggedList`` item), a finalizer writes the generation into the segment's header, and only
  then may the worker lease the segment again. A batch the user still holds is never
  overwritten. Small tensors (up to 64 KiB a batch: labels, ids, offsets) travel inline in the
  message instead, so that keeping them (labels for a metric) does not hold a segment;
- a worker leases a segment only when the main process released it *and* nothing in the
  worker still refers to it; when every segment is busy, the batch goes into a one-off segment
  (:func:`allocate_shared`, the way every batch travelled before).

Memory: at most ``SNAPSTORE_POOL_SEGMENTS`` (default 8) segments per worker, each the largest
batch seen so far plus an eighth; they are shared, so the main process's mappings add nothing.
A worker that exits normally truncates the segments the main process released; the main process
unmaps a dead worker's segments as their last batches die (or, for a worker killed without
exiting, when another worker's new segment arrives).

Each segment is mapped once in the main process for its whole life, so pinning it for the GPU
(``cudaHostRegister`` of the mapping) is done once per segment, not per batch: :func:`on_map`
registers a hook that runs on every mapping (:func:`snapstore.torch_device.to_device` pins with
it) and whose undo runs before the segment is unmapped.
"""

from __future__ import annotations

import io
import itertools
import math
import mmap
import multiprocessing.util
import os
import pickle
import secrets
import threading
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.reduction import DupFd, ForkingPickler
from typing import Any

import numpy as np
import torch

from .errors import SnapstoreError
from .read.assemble import Spec

__all__ = [
    "ALIGN",
    "POOL_SEGMENTS_ENV",
    "PoolError",
    "PooledBatch",
    "SegmentPool",
    "active_pool",
    "allocate_pooled",
    "allocate_shared",
    "forget_exited",
    "layout",
    "on_map",
    "received_segments",
    "shared_bytes",
]

ALIGN = 64  # every array's bytes start on a cache line of the buffer
POOL_SEGMENTS_ENV = "SNAPSTORE_POOL_SEGMENTS"
# In use at once per worker: the reader's assembler runs up to 3 batches ahead (one being built,
# two finished), DataLoader holds prefetch_factor (2) per worker in flight, and the training loop
# holds the current batch while the next arrives. 8 covers that; beyond, one-off segments.
DEFAULT_SEGMENTS = 8
_HEADER = 64  # a segment's first cache line: int64 [0] = the generation the receiver released
# A batch's small tensors (labels, ids, offsets), up to this many bytes in all, travel inline,
# copied in the message: one kept by the training loop (labels for a metric) then holds a few
# bytes, not the batch's segment.
_INLINE_BYTES = 64 << 10
_PAGE = mmap.PAGESIZE


class PoolError(SnapstoreError, RuntimeError):
    """A pooled batch arrived in a process that never received its segment."""


def layout(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Where each of ``sizes`` bytes starts in one buffer (:data:`ALIGN`-aligned), and its
    total size."""
    starts, total = [], 0
    for size in sizes:
        total += -total % ALIGN
        starts.append(total)
        total += size
    return starts, total


def _views(
    base: np.ndarray[Any, Any], specs: Sequence[Spec], starts: Sequence[int]
) -> list[np.ndarray[Any, Any]]:
    return [
        base[start : start + math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)
        for (shape, dtype), start in zip(specs, starts)
    ]


def allocate_shared(specs: Sequence[Spec]) -> list[Any]:
    """A batch's arrays as views of one new shared-memory buffer (a one-off segment).

    The buffer is made in shared memory from the start (``UntypedStorage._new_shared``: no copy
    into it later), and :func:`snapstore.torch_ragged.shared_tensor` turns each array back into
    a view of it, so the batch travels as one segment. Nothing is kept here: the arrays hold the
    buffer alive. :func:`allocate_pooled` falls back to it when every pooled segment is busy.
    """
    starts, total = layout([math.prod(shape) * dtype.itemsize for shape, dtype in specs])
    return _views(shared_bytes(total).numpy(), specs, starts)


def shared_bytes(size: int) -> torch.Tensor:
    """A new uint8 tensor of ``size`` bytes in shared memory, made there (``share_memory_()``
    on a new tensor would copy its bytes once more); zero-filled."""
    storage = torch.UntypedStorage._new_shared(max(size, 1))  # type: ignore[no-untyped-call]
    return torch.empty(0, dtype=torch.uint8).set_(storage)[:size]


# -- the worker's side -------------------------------------------------------------------------


class _Lease:
    """One batch's use of a segment: its generation and size; ``sent`` once pickled."""

    __slots__ = ("gen", "nbytes", "segment", "sent")

    def __init__(self, segment: _Segment, gen: int, nbytes: int) -> None:
        self.segment, self.gen, self.nbytes, self.sent = segment, gen, nbytes, False


class _Segment:
    """A memfd segment: a header cache line, then ``capacity`` bytes for leases."""

    def __init__(self, pool_id: int, number: int, capacity: int) -> None:
        self.fd = os.memfd_create("snapstore-pool", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, _HEADER + capacity)
        self.map = mmap.mmap(self.fd, _HEADER + capacity)
        self.header = np.frombuffer(self.map, np.int64, count=_HEADER // 8)
        self.start = self.header.ctypes.data + _HEADER
        self.token, self.capacity = (pool_id, number), capacity
        self.gen = self.sent_gen = 0
        self.announced = False  # the receiver has the file descriptor
        self.lease: _Lease | None = None
        self.alive: weakref.ref[np.ndarray[Any, Any]] | None = None  # the lease's ndarray

    def free(self) -> bool:
        """No array of this process uses it, and the receiver released what it was sent."""
        in_use = self.alive is not None and self.alive() is not None
        return not in_use and int(self.header[0]) >= self.sent_gen

    def close(self) -> None:
        """Give the memory back (the receiver's mapping of a free segment goes empty)."""
        os.ftruncate(self.fd, 0)
        os.close(self.fd)


class SegmentPool:
    """A worker's shared-memory segments, leased to one batch at a time (module docstring).

    Parameters
    ----------
    segments : int
        How many segments at most; 0 sends every batch in a one-off segment (no pool).
    """

    def __init__(self, segments: int = DEFAULT_SEGMENTS) -> None:
        self.limit = segments
        self.segments: list[_Segment] = []
        self.largest = 0
        self.retired: list[tuple[int, int]] = []  # tokens the receiver may forget
        self.stats = {"created": 0, "reused": 0, "regrown": 0, "one_off": 0}
        self._id = secrets.randbits(63)  # tokens stay unique when a pid is reused
        self._numbers = itertools.count()
        self._lock = threading.RLock()  # the assembler thread and the worker's main thread

    def allocate(self, specs: Sequence[Spec]) -> list[Any]:
        """The arrays of ``specs`` in a free segment (a new lease), or in a one-off segment
        when every pooled one is busy."""
        starts, total = layout([math.prod(shape) * dtype.itemsize for shape, dtype in specs])
        with self._lock:
            segment = self._lease_segment(total)
            if segment is None:
                self.stats["one_off"] += 1
                return allocate_shared(specs)
            segment.gen += 1
            base = np.frombuffer(segment.map, np.uint8, count=total, offset=_HEADER)
            segment.lease = _Lease(segment, segment.gen, total)
            segment.alive = weakref.ref(base)
        return _views(base, specs, starts)

    def _lease_segment(self, size: int) -> _Segment | None:
        self.largest = max(self.largest, size)
        free = [s for s in self.segments if s.free()]
        fits = [s for s in free if s.capacity >= size]
        if fits:
            self.stats["reused"] += 1
            return min(fits, key=lambda s: s.capacity)
        if len(self.segments) >= self.limit:
            if not free:
                return None
            smallest = min(free, key=lambda s: s.capacity)  # too small: make it bigger
            self.segments.remove(smallest)
            self.retired.append(smallest.token)
            smallest.close()
            self.stats["regrown"] += 1
        # Headroom for batches that vary in size (varying-shape fields), whole pages.
        capacity = -(-(self.largest + self.largest // 8) // _PAGE) * _PAGE
        segment = _Segment(self._id, next(self._numbers), capacity)
        self.segments.append(segment)
        self.stats["created"] += 1
        return segment

    def lease_of(self, tensors: Sequence[torch.Tensor]) -> _Lease | None:
        """The lease every one of ``tensors`` lies in, or None."""
        found = None
        with self._lock:
            for tensor in tensors:
                lease = self._lease_at(tensor)
                if lease is None or (found is not None and lease is not found):
                    return None
                found = lease
        return found

    def _lease_at(self, tensor: torch.Tensor) -> _Lease | None:
        storage = tensor.untyped_storage()
        at, size = storage.data_ptr(), storage.nbytes()
        for segment in self.segments:
            lease, alive = segment.lease, segment.alive
            if lease is None or alive is None or alive() is None:
                continue
            if segment.start <= at and at + size <= segment.start + lease.nbytes:
                return lease
        return None

    def close(self) -> None:
        """Truncate the segments the receiver released (at the worker's exit)."""
        with self._lock:
            for segment in self.segments:
                if segment.free():
                    segment.close()
            self.segments = []


_POOL: tuple[int, SegmentPool] | None = None


def _segments_setting() -> int:
    value = os.environ.get(POOL_SEGMENTS_ENV, str(DEFAULT_SEGMENTS))
    try:
        segments = int(value)
    except ValueError:
        segments = -1
    if segments < 0:
        raise ValueError(
            f"{POOL_SEGMENTS_ENV}: expected a whole number >= 0 of shared-memory segments per "
            f"DataLoader worker, found {value!r}; unset it for the default ({DEFAULT_SEGMENTS})"
        )
    return segments if hasattr(os, "memfd_create") else 0


def active_pool() -> SegmentPool | None:
    """This process's pool, if :func:`allocate_pooled` made one here (in a worker)."""
    return _POOL[1] if _POOL is not None and _POOL[0] == os.getpid() else None


def allocate_pooled(specs: Sequence[Spec]) -> list[Any]:
    """A :class:`~snapstore.BatchReader` ``allocate`` hook for DataLoader workers: the batch's
    arrays in a lease of this process's :class:`SegmentPool` (made on first use, with
    ``SNAPSTORE_POOL_SEGMENTS`` segments at most)."""
    global _POOL
    pool = active_pool()
    if pool is None:
        pool = SegmentPool(_segments_setting())
        _POOL = (os.getpid(), pool)  # a forked child makes its own, never uses its parent's
        multiprocessing.util.Finalize(pool, pool.close, exitpriority=0)
    return pool.allocate(specs)


class PooledBatch(dict[str, Any]):
    """A batch whose tensors lie in one lease: it pickles as the lease (module docstring) and
    arrives as a plain dict. Pickled a second time, it travels as a plain dict (a copy)."""

    def __init__(self, batch: dict[str, Any], lease: _Lease) -> None:
        super().__init__(batch)
        self.lease = lease

    def __copy__(self) -> PooledBatch:  # DataLoader's default_convert copies the batch
        return PooledBatch(self, self.lease)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        from copy import deepcopy

        return deepcopy(dict(self), memo)

    def __reduce_ex__(self, protocol: Any) -> Any:
        lease, segment = self.lease, self.lease.segment
        pool = active_pool()
        if lease.sent or pool is None or segment.lease is not lease:
            return (dict, (dict(self),))
        lease.sent = True
        buffer = io.BytesIO()
        _LeasePickler(buffer, lease).dump(dict(self))
        with pool._lock:
            segment.sent_gen = lease.gen
            retired, pool.retired = pool.retired, []
            fd = None if segment.announced else DupFd(segment.fd)
            segment.announced = True
        where = (segment.token, os.getpid(), segment.capacity, fd, retired)
        return (_rebuild_batch, (where, lease.gen, lease.nbytes, buffer.getvalue()))


class _LeasePickler(ForkingPickler):
    """Small tensors inline (up to ``_INLINE_BYTES`` in all), tensors in the lease as their
    place in it, the rest as torch sends them (a segment each)."""

    def __init__(self, file: io.BytesIO, lease: _Lease) -> None:
        super().__init__(file, 4)
        self.lease = lease
        self.inline = 0  # bytes sent inline so far

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is not torch.Tensor or not _plain(obj):
            return None
        size = obj.element_size()
        if self.inline + obj.numel() * size <= _INLINE_BYTES:
            try:
                array = obj.numpy()
            except TypeError:  # a dtype numpy lacks (bfloat16...)
                pass
            else:
                self.inline += array.nbytes
                return ("inline", array)
        storage = obj.untyped_storage()
        start = storage.data_ptr() - self.lease.segment.start
        if start >= 0 and start + storage.nbytes() <= self.lease.nbytes and start % size == 0:
            where = (start // size + obj.storage_offset(), tuple(obj.shape), obj.stride())
            return ("lease", obj.dtype, where)
        return None


def _plain(tensor: torch.Tensor) -> bool:
    return (
        tensor.device.type == "cpu"
        and tensor.layout == torch.strided
        and not tensor.is_nested
        and not tensor.requires_grad
        and not tensor.is_conj()
        and not tensor.is_neg()
        and not tensor.is_quantized
    )


# -- the receiving side ------------------------------------------------------------------------


class _Mapped:
    """A segment as the receiving process maps it, once."""

    def __init__(self, fd: int, capacity: int, pid: int) -> None:
        self.map = mmap.mmap(fd, _HEADER + capacity)
        self.header = np.frombuffer(self.map, np.int64, count=_HEADER // 8)
        self.pid = pid
        for hook in _MAP_HOOKS:
            self.run(hook)

    def run(self, hook: MapHook) -> None:
        undo = hook(self.header.ctypes.data, len(self.map))
        if undo is not None:
            # Runs as this object dies, while its map (which only it holds by then: each
            # batch's finalizer keeps it alive) is still mapped; not at exit.
            weakref.finalize(self, undo).atexit = False


MapHook = Callable[[int, int], Callable[[], Any] | None]
_MAP_HOOKS: list[MapHook] = []
_RECEIVED: dict[tuple[int, int], _Mapped] = {}
# Reentrant: a batch can die, and its finalizer run, inside a section that holds the lock.
_RECEIVED_LOCK = threading.RLock()


def on_map(hook: MapHook) -> None:
    """Call ``hook(address, size)`` for each segment this process maps (and those it has mapped
    already), once; what it returns, if not None, is called before the segment is unmapped.
    A hook added twice runs once."""
    with _RECEIVED_LOCK:
        if hook in _MAP_HOOKS:
            return
        _MAP_HOOKS.append(hook)
        for mapped in list(_RECEIVED.values()):
            mapped.run(hook)


def received_segments() -> int:
    """How many segments this process keeps mapped (for tests and diagnostics)."""
    return len(_RECEIVED)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def forget_exited() -> None:
    """Drop the mappings of segments whose worker has exited (each goes when its last batch
    does)."""
    with _RECEIVED_LOCK:
        for pid in {m.pid for m in _RECEIVED.values() if not _alive(m.pid)}:
            for token in [t for t, m in _RECEIVED.items() if m.pid == pid]:
                del _RECEIVED[token]


def _segment(where: tuple[Any, ...]) -> _Mapped:
    token, pid, capacity, fd, retired = where
    with _RECEIVED_LOCK:
        for old in retired:
            _RECEIVED.pop(old, None)
        if fd is not None:
            handle = fd.detach()
            try:
                _RECEIVED[token] = _Mapped(handle, capacity, pid)
            finally:
                os.close(handle)
        mapped = _RECEIVED.get(token)
    if fd is not None:
        forget_exited()  # a new worker or segment: a good time to sweep dead workers' ones
    if mapped is None:
        raise PoolError(
            f"a DataLoader worker's batch refers to shared-memory segment {token} that this "
            f"process (pid {os.getpid()}) never received; pooled batches must be unpickled, in "
            "order, by the process their worker sends them to (the DataLoader's)"
        )
    return mapped


def _release(mapped: _Mapped, gen: int) -> None:
    mapped.header[0] = gen  # the worker may lease the segment again
    if not _alive(mapped.pid):
        forget_exited()


class _LeaseUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, storage: torch.UntypedStorage) -> None:
        super().__init__(file)
        self.storage = storage

    def persistent_load(self, pid: Any) -> Any:
        kind, *rest = pid
        if kind == "inline":
            return torch.from_numpy(rest[0])
        dtype, (offset, shape, stride) = rest
        return torch.empty(0, dtype=dtype).set_(self.storage, offset, shape, stride)


def _rebuild_batch(where: tuple[Any, ...], gen: int, nbytes: int, payload: bytes) -> Any:
    """A pooled batch, arrived: its tensors are views of one storage over the lease, which
    is released when the last of them goes."""
    mapped = _segment(where)
    lease = np.frombuffer(mapped.map, np.uint8, count=nbytes, offset=_HEADER)
    weakref.finalize(lease, _release, mapped, gen).atexit = False
    storage = torch.from_numpy(lease).untyped_storage()
    return _LeaseUnpickler(io.BytesIO(payload), storage).load()
