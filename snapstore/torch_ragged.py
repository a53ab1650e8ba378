"""Varying-shape fields of a batch as torch objects that cross DataLoader workers as one buffer.

A DataLoader worker sends each tensor of a batch to the main process through a shared-memory
segment and file descriptor of its own, so a list of 256 separate tensors costs 256 of them
(measured on 2 cores: 4,300 samples/s, where one values tensor plus offsets reaches 336,000).
Every form here sends a field's batch as one values tensor plus offsets:

- ``"list"``: a :class:`RaggedList`, a list of tensors that are views into one values tensor;
  it pickles as that tensor, the offsets and the shapes, and is rebuilt as views on arrival;
- ``"nested"``: a ``torch.nested`` jagged tensor (torch pickles it as its values and offsets);
- ``"packed"`` and ``"pad"``: the batch's values and offsets, or a padded tensor and the
  lengths, as plain tensors (see :meth:`snapstore.Snapshot.batches`).

Import this module only where torch is installed; :mod:`snapstore.torch` re-exports its names.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np
import torch

from .format.ragged import inner_size
from .format.schema import Field, Schema
from .torch_pool import PooledBatch, active_pool, allocate_shared, layout, shared_bytes

__all__ = [
    "TORCH_FORMS",
    "RaggedList",
    "TorchRaggedForm",
    "allocate_shared",
    "from_packed",
    "reader_form",
    "share_batch",
    "shared_tensor",
]

TorchRaggedForm = Literal["list", "nested", "packed", "pad"]
TORCH_FORMS: tuple[str, ...] = ("list", "nested", "packed", "pad")


class RaggedList(list[torch.Tensor]):
    """The batch of a varying-shape field: a list of tensors that are views into one buffer.

    Item ``i`` is ``values[offsets[i]:offsets[i + 1]]``, viewed with shape ``shapes[i]`` when
    the field has more than one dimension. It is a ``list`` in every respect; what differs is
    how it pickles: as ``values``, ``offsets`` and ``shapes``, so that a DataLoader worker sends
    the whole field through one shared-memory segment instead of one per sample, and the views
    are rebuilt where it is unpickled. ``DataLoader(pin_memory=True)`` pins ``values`` once.

    A list changed after it was made (an item replaced, added or removed) is packed again into
    a new buffer when it is pickled (one copy); one whose items are not tensors of one dtype
    pickles as a plain list.

    It moves as one buffer too: :meth:`to` (which PyTorch Lightning's and Hugging Face
    Accelerate's batch transfer call on anything that has it) copies ``values`` once and
    rebuilds the views on the device.

    Parameters
    ----------
    values : torch.Tensor or iterable of torch.Tensor
        The items' elements one after another, 1-D. Or, with ``offsets`` left out, the items
        themselves (tensors of one dtype and rank), copied into one buffer as
        :meth:`from_tensors` does: ``RaggedList(tensors)``, as code that rebuilds a list by
        its type (``type(batch)(items)``) calls it.
    offsets : torch.Tensor
        int64, shape ``(n + 1,)``, non-decreasing: where each item starts and ends in
        ``values``.
    shapes : torch.Tensor, optional
        int64, shape ``(n, ndim)``: each item's shape; None for 1-D items.

    Attributes
    ----------
    values, offsets, shapes : torch.Tensor
        As passed. They describe the list as it was made; read them only while it is unchanged
        (``nn.EmbeddingBag(...)(batch["tokens"].values, batch["tokens"].offsets)`` with
        ``include_last_offset=True``).

    Raises
    ------
    ValueError
        If ``values`` or ``offsets`` is not 1-D, the offsets do not fit ``values``, or
        ``shapes`` does not match the offsets.

    Examples
    --------
    >>> tokens = RaggedList(torch.arange(5), torch.tensor([0, 2, 2, 5]))
    >>> [t.tolist() for t in tokens]
    [[0, 1], [], [2, 3, 4]]
    """

    values: torch.Tensor
    offsets: torch.Tensor
    shapes: torch.Tensor | None

    def __init__(
        self,
        values: torch.Tensor | Iterable[torch.Tensor],
        offsets: torch.Tensor | None = None,
        shapes: torch.Tensor | None = None,
    ) -> None:
        if offsets is None:
            if isinstance(values, torch.Tensor):
                raise TypeError(
                    "RaggedList: expected values with offsets, or an iterable of tensors, "
                    "found one tensor without offsets"
                )
            values, offsets, shapes = _packed(list(values))
        elif not isinstance(values, torch.Tensor):
            raise TypeError(f"RaggedList: expected values as a tensor, found {type(values)}")
        first, last, sizes = _check(values, offsets, shapes)
        items: list[torch.Tensor] = []
        if sizes:
            items = list(torch.split(values[first:last], sizes))
        if shapes is not None:
            items = [item.view(shape) for item, shape in zip(items, shapes.tolist())]
        super().__init__(items)
        self.values, self.offsets, self.shapes = values, offsets, shapes
        self._items: tuple[torch.Tensor, ...] | None = tuple(items)

    @classmethod
    def from_tensors(cls, tensors: Sequence[torch.Tensor]) -> RaggedList:
        """Tensors of one dtype and rank copied into one buffer (one ``torch.cat``).

        Use it in a transform that runs in DataLoader workers and makes new items, so that
        they travel as one buffer: ``RaggedList.from_tensors([t[:512] for t in tokens])``.

        Raises
        ------
        ValueError
            If ``tensors`` is empty or mixes dtypes or ranks.
        """
        items = list(tensors)
        if not items:
            raise ValueError("RaggedList.from_tensors: expected a non-empty sequence of tensors")
        return cls(*_packed(items))

    def to(self, *args: Any, **kwargs: Any) -> RaggedList:
        """The list with ``values`` moved or converted by ``Tensor.to(*args, **kwargs)``: one
        copy of the buffer, the views rebuilt over it (the list itself if nothing moved).

        A list changed after it was made is packed again first (one copy).
        """
        packed = self if self._intact() else RaggedList.from_tensors(self)
        values = packed.values.to(*args, **kwargs)
        if values is packed.values:
            return packed
        # The views are made where the values are: offsets and shapes stay on the CPU.
        return RaggedList(values, packed.offsets, packed.shapes)

    def _intact(self) -> bool:
        """Whether the list still holds exactly the views it was made with."""
        made = self._items
        return made is not None and len(self) == len(made) and all(map(operator.is_, self, made))

    def __copy__(self) -> RaggedList:
        # DataLoader's default_convert and pin_memory copy lists: keep the buffer (cheaply).
        clone = RaggedList.__new__(RaggedList)
        list.extend(clone, self)
        clone.values, clone.offsets, clone.shapes = self.values, self.offsets, self.shapes
        clone._items = self._items if self._intact() else None
        return clone

    def __reduce_ex__(self, protocol: Any) -> Any:
        if not self._intact():
            try:
                repacked = RaggedList.from_tensors(self)
            except ValueError:
                return (list, (list(self),))
            return repacked.__reduce_ex__(protocol)
        # Offsets and shapes are small: inline numpy bytes, not shared-memory segments of their
        # own. Only the values tensor goes through torch's shared memory.
        shapes = None if self.shapes is None else self.shapes.numpy()
        return (_rebuild, (self.values, self.offsets.numpy(), shapes))

    def pin_memory(self) -> list[Any]:
        """The same list over a pinned copy of ``values`` (what ``pin_memory=True`` calls)."""
        try:
            packed = self if self._intact() else RaggedList.from_tensors(self)
        except ValueError:  # not tensors of one kind: pin what can be pinned, item by item
            return [t.pin_memory() if isinstance(t, torch.Tensor) else t for t in self]
        return RaggedList(packed.values.pin_memory(), packed.offsets, packed.shapes)


def _packed(
    items: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Tensors of one dtype and rank as (values, offsets, shapes) over one new buffer."""
    if not all(isinstance(t, torch.Tensor) for t in items):
        raise ValueError(
            "RaggedList: expected tensors, found "
            f"{sorted({type(t).__name__ for t in items})}; convert them first"
        )
    kinds = {(t.dtype, t.dim()) for t in items}
    if len(kinds) > 1:
        raise ValueError(
            f"RaggedList: expected tensors of one dtype and rank, found "
            f"{sorted(str(k) for k in kinds)}; convert them first"
        )
    sizes = torch.tensor([t.numel() for t in items], dtype=torch.int64)
    offsets = torch.zeros(len(items) + 1, dtype=torch.int64)
    torch.cumsum(sizes, 0, out=offsets[1:])
    if not items:
        return torch.zeros(0), offsets, None
    shapes = None
    if items[0].dim() != 1:
        shapes = torch.tensor([list(t.shape) for t in items], dtype=torch.int64)
        shapes = shapes.reshape(len(items), items[0].dim())
    return torch.cat([t.reshape(-1) for t in items]), offsets, shapes


def _rebuild(
    values: torch.Tensor, offsets: np.ndarray[Any, Any], shapes: np.ndarray[Any, Any] | None
) -> RaggedList:
    return RaggedList(
        values, torch.from_numpy(offsets), None if shapes is None else torch.from_numpy(shapes)
    )


def _check(
    values: torch.Tensor, offsets: torch.Tensor, shapes: torch.Tensor | None
) -> tuple[int, int, list[int]]:
    """The first and last offsets and the items' sizes, after checking that the offsets and the
    shapes fit ``values`` (in numpy: a batch's RaggedList is made in every worker and again in
    the main process)."""
    if values.dim() != 1 or offsets.dim() != 1 or len(offsets) < 1:
        raise ValueError(
            f"RaggedList: expected 1-D values and 1-D offsets of length n + 1, found shapes "
            f"{tuple(values.shape)} and {tuple(offsets.shape)}; flatten the values"
        )
    bounds = offsets.detach().cpu().numpy()
    sizes = np.diff(bounds)
    first, last = int(bounds[0]), int(bounds[-1])
    if first < 0 or (sizes < 0).any():
        raise ValueError(
            f"RaggedList: offsets must be non-decreasing from >= 0, found {bounds.tolist()}"
        )
    if last > len(values):
        raise ValueError(f"RaggedList: the last offset ({last}) is past the {len(values)} values")
    if shapes is not None and (shapes.dim() != 2 or len(shapes) != len(sizes)):
        raise ValueError(
            f"RaggedList: expected shapes of shape ({len(sizes)}, ndim), found "
            f"{tuple(shapes.shape)}"
        )
    return first, last, sizes.tolist()


def reader_form(form: str) -> str:
    """The ``ragged=`` form to read a torch form from: the two made from one buffer read it
    packed."""
    if form not in TORCH_FORMS:
        raise ValueError(f"ragged: expected one of {TORCH_FORMS}, found {form!r}")
    return "packed" if form in ("list", "nested") else form


def _nested(field: Field, ragged: RaggedList) -> torch.Tensor:
    """A field's batch as a ``torch.nested`` tensor: jagged where only the first dimension
    varies, else (several varying dimensions) strided, which torch also sends as one buffer."""
    inner = inner_size(field)
    if inner is None:
        return torch.nested.as_nested_tensor(list(ragged), layout=torch.strided)
    rows = ragged.values.view(-1, *(int(d or 0) for d in (field.shape or ())[1:]))
    return torch.nested.nested_tensor_from_jagged(rows, ragged.offsets // inner)


def from_packed(batch: dict[str, Any], schema: Schema, form: str) -> dict[str, Any]:
    """Turn a batch read with ``ragged="packed"`` (its arrays already tensors) into ``form``:
    each varying-shape field and its ``_offsets`` and ``_shapes`` become one entry."""
    if form not in ("list", "nested"):
        return batch
    for field in schema.fields:
        if field.kind == "struct":  # a nested dict's columns: its varying fields too
            from_packed(batch[field.name], Schema(field.fields), form)
            continue
        if field.kind != "array" or field.fixed:
            continue
        name = field.name
        offsets = batch.pop(f"{name}_offsets")
        ragged = RaggedList(batch[name], offsets, batch.pop(f"{name}_shapes", None))
        batch[name] = ragged if form == "list" else _nested(field, ragged)
    return batch


def arrays_to_list(arrays: list[np.ndarray[Any, Any]]) -> list[torch.Tensor]:
    """A list of ndarrays as a :class:`RaggedList` over one copy of them, when they share a
    dtype and rank; otherwise as separate tensors (each a copy if read-only)."""
    first = arrays[0]
    if all(isinstance(a, np.ndarray) and a.dtype == first.dtype for a in arrays) and all(
        a.ndim == first.ndim for a in arrays
    ):
        sizes = np.fromiter((a.size for a in arrays), np.int64, count=len(arrays))
        offsets = np.zeros(len(arrays) + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        values = np.concatenate([a.reshape(-1) for a in arrays])
        shapes = None
        if first.ndim != 1:
            shapes = torch.tensor([a.shape for a in arrays], dtype=torch.int64)
            shapes = shapes.reshape(len(arrays), first.ndim)
        return RaggedList(torch.from_numpy(values), torch.from_numpy(offsets), shapes)
    return [torch.from_numpy(a if a.flags.writeable else a.copy()) for a in arrays]


def shared_tensor(array: np.ndarray[Any, Any]) -> torch.Tensor | None:
    """``array`` as a view of the shared-memory tensor it lies in (made by
    :func:`allocate_shared`), or None when it does not lie in one."""
    owner: Any = array
    while isinstance(owner, np.ndarray):
        owner = owner.base
    if not isinstance(owner, torch.Tensor) or not owner.is_shared():  # type: ignore[no-untyped-call]
        return None
    if not array.flags.c_contiguous or owner.dtype != torch.uint8 or owner.dim() != 1:
        return None
    start = array.ctypes.data - owner.data_ptr()
    if start < 0 or start + array.nbytes > owner.numel():
        return None
    flat = owner[start : start + array.nbytes]
    return flat.view(torch.from_numpy(np.empty(0, array.dtype)).dtype).view(array.shape)


def share_batch(batch: dict[str, Any]) -> dict[str, Any]:
    """``batch`` with its CPU tensors (and the values of its :class:`RaggedList`\\ s, in nested
    dicts too) copied into one shared-memory buffer, as views of it.

    A DataLoader worker sends every tensor through a shared-memory segment of its own, and the
    main process fetches each segment's file descriptor from the worker in a round trip of its
    own, which is most of what the transfer costs for batches of a few tensors (measured here:
    one buffer for a batch of three tensors moved 1.5-1.7x the batches per second of three
    separate tensors). Torch would copy each tensor into shared memory when sending it anyway;
    this makes that one copy, into one buffer. A batch whose tensors are all views of one
    shared buffer already (gathered into :func:`allocate_shared`'s, as
    :class:`~snapstore.torch.SnapshotIterableDataset` does in workers) is returned as it is: no
    copy at all. Tensors that are not on the CPU, nested tensors and anything that is not a
    tensor are left as they are.

    In a DataLoader worker whose reader allocates from the pool
    (:func:`snapstore.torch_pool.allocate_pooled`, as the dataset's do), the buffer is a lease
    of the worker's pool instead, and the batch comes back as a
    :class:`~snapstore.torch_pool.PooledBatch`, which travels as its place in the pool: a batch
    already in one lease is wrapped, not copied; any other is copied into a new lease once.
    """
    found: list[tuple[Any, Any, torch.Tensor]] = []  # (container, key, tensor)
    _collect(batch, found)
    tensors = [tensor for _, _, tensor in found]
    pool = active_pool()
    lease = None if pool is None or not tensors else pool.lease_of(tensors)
    if lease is not None:
        return PooledBatch(batch, lease)
    if not tensors or _one_shared_buffer(tensors) or (pool is None and len(tensors) < 2):
        return batch
    starts, total = layout([t.numel() * t.element_size() for t in tensors])
    if pool is None:
        buffer = shared_bytes(total)
    else:  # a lease, or a one-off shared segment when the pool is busy
        array = pool.allocate([((total,), np.dtype(np.uint8))])[0]
        shared = shared_tensor(array)
        buffer = torch.from_numpy(array) if shared is None else shared
    for (container, key, tensor), start in zip(found, starts):
        size = tensor.numel() * tensor.element_size()
        view = buffer[start : start + size].view(tensor.dtype).view(tensor.shape)
        view.copy_(tensor)
        old = container[key]
        container[key] = RaggedList(view, old.offsets, old.shapes) if _packed_list(old) else view
    lease = None if pool is None else pool.lease_of([buffer])
    return batch if lease is None else PooledBatch(batch, lease)


def _one_shared_buffer(tensors: list[torch.Tensor]) -> bool:
    """Whether the tensors are views of one shared-memory storage already (a batch gathered
    into :func:`allocate_shared`'s buffer): nothing left to copy."""
    pointers = {t.untyped_storage().data_ptr() for t in tensors}
    return len(pointers) == 1 and tensors[0].is_shared()  # type: ignore[no-untyped-call]


def _collect(batch: dict[str, Any], found: list[tuple[Any, Any, torch.Tensor]]) -> None:
    for key, value in batch.items():
        if _packed_list(value) and _plain(value.values):
            found.append((batch, key, value.values))
        elif isinstance(value, torch.Tensor) and _plain(value):
            found.append((batch, key, value))
        elif isinstance(value, dict):
            _collect(value, found)


def _packed_list(value: Any) -> bool:
    """Whether ``value`` is a :class:`RaggedList` still made of its one buffer."""
    return isinstance(value, RaggedList) and value._intact()


def _plain(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "cpu" and tensor.layout == torch.strided and not tensor.is_nested
