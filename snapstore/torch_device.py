"""Batches onto the GPU ahead of the training step, copied from where the workers put them.

``DataLoader(pin_memory=True)`` copies every batch once more on the host, into pinned memory, in
a thread of the main process, before the copy to the device: for 256 uint8 images of 224 x 224
x 3 (38.5 MB) at 10 ms a step, 3.9 GB/s of memcpy. :func:`to_device` copies instead from the
shared-memory segments snapstore's DataLoader workers assemble batches into
(:mod:`snapstore.torch_pool`), which the main process maps once for their whole life and which
are pinned once each here (``cudaHostRegister`` through :func:`snapstore.torch_pool.on_map`):

- the copies of batch ``i + 1 .. i + prefetch`` run on a side CUDA stream while the step uses
  batch ``i``; an event per batch, which the consumer's current stream waits on before the batch
  is handed over, orders the step after its copies without blocking the host;
- each device tensor is ``record_stream``-ed on the consumer stream, so the caching allocator
  does not reuse its memory while the step may still read it;
- the host batch is kept until its copy's event has completed: only then can its segment go
  back to its worker (the pool recycles a segment when the last tensor over it dies).

Tensors not in a pooled segment (small ones that travel inline, batches of a loader without
workers) are copied from pageable memory: the CUDA driver stages those through its own pinned
buffers, which costs the same host copy a staging buffer of ours would, without holding one;
they are small (offsets, labels) or come from a loader that copies on the host anyway.

Pinned memory: every segment of every worker, while it is mapped (at most
``SNAPSTORE_POOL_SEGMENTS`` per worker, each the largest batch plus an eighth), is page-locked.

The loop is :class:`DeviceLoader` over a :class:`Transfer`: :class:`CudaTransfer` on a GPU, and
in the tests a stand-in that records its calls and completes copies when told.
"""

from __future__ import annotations

import logging
import operator
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import torch

from .torch_pool import on_map
from .torch_ragged import RaggedList

__all__ = [
    "Copied",
    "CudaTransfer",
    "DeviceLoader",
    "Transfer",
    "move_batch",
    "pin_pool_segments",
    "to_device",
]

log = logging.getLogger(__name__)


class Copied(Protocol):
    """One batch's copies, enqueued."""

    def wait(self) -> None:
        """Order the consumer's work after the copies (before the batch is handed over)."""

    def done(self) -> bool:
        """Whether the copies have completed, so that the host batch may go."""

    def synchronize(self) -> None:
        """Block until the copies have completed."""


class Transfer(Protocol):
    """Starts the copies of one batch to the device."""

    def copy(self, batch: Any) -> tuple[Any, Copied]:
        """The batch on the device (its copies enqueued, maybe not done) and their completion."""


def move_batch(batch: Any, copy: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``batch`` with every tensor replaced by ``copy(tensor)``.

    Dicts, lists and tuples are recursed into; a :class:`~snapstore.torch.RaggedList` is copied
    as its one values tensor and comes back as views of the copy (its offsets and shapes stay
    on the host, as :meth:`RaggedList.to` keeps them: the views are made from them without
    reading the device); anything else, and a container with no tensor in it, is returned as
    it is.
    """
    if isinstance(batch, RaggedList):
        packed = batch if batch._intact() else RaggedList.from_tensors(batch)
        return RaggedList(copy(packed.values), packed.offsets, packed.shapes)
    if isinstance(batch, torch.Tensor):
        return copy(batch)
    if isinstance(batch, dict):
        moved = {key: move_batch(value, copy) for key, value in batch.items()}
        return batch if all(moved[k] is v for k, v in batch.items()) else moved
    if isinstance(batch, list | tuple) and not hasattr(batch, "_fields"):
        items = [move_batch(value, copy) for value in batch]
        return batch if all(map(operator.is_, items, batch)) else type(batch)(items)
    return batch


class _CudaCopied:
    def __init__(self, event: Any, tensors: list[torch.Tensor], device: torch.device) -> None:
        self.event, self.tensors, self.device = event, tensors, device

    def wait(self) -> None:
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(self.event)
        for tensor in self.tensors:
            for part in _parts(tensor):
                part.record_stream(consumer)
        self.tensors = []

    def done(self) -> bool:
        return bool(self.event.query())

    def synchronize(self) -> None:
        self.event.synchronize()


def _parts(tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors whose memory ``tensor`` uses: a jagged nested tensor's values and offsets."""
    if tensor.is_nested and tensor.layout == torch.jagged:
        return (tensor.values(), tensor.offsets())  # type: ignore[attr-defined]
    return (tensor,)


class CudaTransfer:
    """Copies batches to a CUDA device on a side stream, an event recorded after each batch.

    Parameters
    ----------
    device : torch.device
        A CUDA device.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]

    def copy(self, batch: Any) -> tuple[Any, Copied]:
        """Enqueue ``batch``'s copies on the side stream (``non_blocking``: from pinned memory,
        the host does not wait)."""
        tensors: list[torch.Tensor] = []

        def one(tensor: torch.Tensor) -> torch.Tensor:
            moved = tensor.to(self.device, non_blocking=True)
            tensors.append(moved)
            return moved

        with torch.cuda.stream(self.stream):
            moved = move_batch(batch, one)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(self.stream)
        return moved, _CudaCopied(event, tensors, self.device)


class DeviceLoader:
    """The batches of ``loader`` on a device, ``prefetch`` batches copied ahead (see
    :func:`to_device`, which makes it). With ``transfer`` None, the batches pass through."""

    def __init__(self, loader: Iterable[Any], transfer: Transfer | None, prefetch: int) -> None:
        self.loader, self.transfer, self.prefetch = loader, transfer, prefetch

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]  # TypeError where it has none

    def __iter__(self) -> Iterator[Any]:
        if self.transfer is None:
            return iter(self.loader)
        return self._prefetched(self.transfer)

    def _prefetched(self, transfer: Transfer) -> Iterator[Any]:
        batches = iter(self.loader)
        ahead: deque[tuple[Any, Any, Copied]] = deque()  # (host, device, copies) started
        held: list[tuple[Any, Copied]] = []  # handed over; host kept until its copies are done
        end = object()
        try:
            while True:
                while len(ahead) <= self.prefetch:
                    host = next(batches, end)
                    if host is end:
                        break
                    ahead.append((host, *transfer.copy(host)))
                if not ahead:
                    return
                host, moved, copied = ahead.popleft()
                copied.wait()
                held.append((host, copied))
                del host  # the frame must not hold it while the step runs
                held = [(h, c) for h, c in held if not c.done()]
                yield moved
                del moved
        finally:
            # Dropped early (a break, an exception): the host batches go only after their copies.
            for _, _, copied in ahead:
                copied.synchronize()
            for _, copied in held:
                copied.synchronize()


_PIN_LOCK = threading.Lock()
_PINNING = False


def _pin(address: int, size: int) -> Callable[[], Any] | None:
    """Page-lock one pool segment's mapping for the GPU; its undo unpins it."""
    cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
    status = int(cudart.cudaHostRegister(address, size, 0))
    if status != 0:
        log.warning(
            "cudaHostRegister of a %d-byte DataLoader pool segment failed (CUDA error %d): "
            "batches in it are copied from pageable memory, more slowly; check the limit on "
            "locked memory (ulimit -l)",
            size,
            status,
        )
        return None
    return lambda: cudart.cudaHostUnregister(address)


def pin_pool_segments() -> None:
    """Pin, once each, the pool segments this process maps (those mapped already too), so that
    copies from them to a CUDA device are asynchronous DMA. :func:`to_device` calls it."""
    global _PINNING
    with _PIN_LOCK:
        if not _PINNING:
            on_map(_pin)
            _PINNING = True


def _check_device(device: str | torch.device) -> torch.device:
    try:
        found = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"to_device: expected a device such as 'cpu', 'cuda' or 'cuda:1', found {device!r}"
        ) from exc
    if found.type not in ("cpu", "cuda"):
        raise ValueError(
            f"to_device: expected 'cpu' or a CUDA device, found {str(found)!r}; for another "
            "device move the batches yourself (batch tensors' .to(device))"
        )
    if found.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"to_device: expected a CUDA device to be available for {str(found)!r}, found "
                "none; pass device='cpu' to run the same loop without copies"
            )
        if found.index is not None and found.index >= torch.cuda.device_count():
            raise ValueError(
                f"to_device: expected a CUDA device index below {torch.cuda.device_count()}, "
                f"found {str(found)!r}"
            )
    return found


def to_device(loader: Iterable[Any], device: str | torch.device, prefetch: int = 2) -> DeviceLoader:
    """The batches of ``loader`` on ``device``, copied ``prefetch`` batches ahead of the step.

    On a CUDA device the copies run on a side stream, from the shared-memory segments
    snapstore's DataLoader workers fill (pinned once each, no host copy: do not also pass
    ``pin_memory=True``, which copies each batch once more on the host); the consumer's current
    stream waits on each batch's event, so using the batch needs no synchronization. Every
    tensor in a batch moves (dicts, lists and tuples recursed into; a ``RaggedList`` becomes
    views of one device tensor); other values pass through. With ``device="cpu"`` nothing is
    copied: the loader's batches come through as they are, so the same loop runs without CUDA.

    Parameters
    ----------
    loader : Iterable
        A DataLoader, or any iterable of batches; ``len()`` works where it has one.
    device : str or torch.device
        ``"cpu"`` or a CUDA device (``"cuda"``, ``"cuda:1"``).
    prefetch : int
        How many batches are copied ahead of the one the step uses (each holds its device
        memory and its host segment until used and copied).

    Returns
    -------
    DeviceLoader
        An iterable over the batches on ``device``, re-iterable as ``loader`` is.

    Raises
    ------
    ValueError
        If ``device`` is not ``"cpu"`` or an available CUDA device, or ``prefetch`` is not a
        whole number >= 1.

    Examples
    --------
    >>> loader = DataLoader(dataset, batch_size=None, num_workers=8)     # doctest: +SKIP
    >>> for batch in to_device(loader, "cuda"):                          # doctest: +SKIP
    ...     loss = model(batch["image"]).sum()
    """
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
        raise ValueError(
            f"to_device: expected prefetch as a whole number >= 1 of batches copied ahead, "
            f"found {prefetch!r}"
        )
    found = _check_device(device)
    if found.type == "cpu":
        return DeviceLoader(loader, None, prefetch)
    pin_pool_segments()
    return DeviceLoader(loader, CudaTransfer(found), prefetch)
