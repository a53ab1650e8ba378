"""tf.data datasets over a snapshot or a mixture, read by snapstore's own prefetching reader.

Import this module only where TensorFlow is installed (``pip install 'snapstore[tensorflow]'``).

>>> import tensorflow as tf                                            # doctest: +SKIP
>>> from snapstore.tensorflow import to_dataset                       # doctest: +SKIP
>>> for epoch in range(3):                                            # doctest: +SKIP
...     ds = to_dataset(snap, batch_size=256, seed=0, epoch=epoch).prefetch(tf.data.AUTOTUNE)
...     for batch in ds: ...

Each dataset is one consumer's share of one epoch (:meth:`snapstore.Snapshot.batches`, or
:meth:`snapstore.Mixture.batches` for a :func:`snapstore.mix` mixture), built with
``tf.data.Dataset.from_generator``: snapstore's reader fetches, decodes and shuffles in its own
threads, and the generator hands its batches to TensorFlow. The element spec comes from the
schema (:func:`element_spec`), so it is known before any read.

``tf.data`` cannot checkpoint a generator's iterator; resume with :meth:`TFReader.state_after`
(the reader state after ``k`` elements, a dict of integers) and ``to_dataset(..., state=...)``.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np

try:
    import tensorflow as tf  # type: ignore[import-untyped,unused-ignore]
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"snapstore.tensorflow needs TensorFlow ({exc}); pip install 'snapstore[tensorflow]'"
    ) from exc

from .errors import ResumeError, SchemaError
from .format.schema import Field, Schema
from .mix import Mixture
from .read.consumer import ConsumerReader, consumer_samples, every_batch
from .read.options import ReaderOptions, reader_options
from .snapshot import Snapshot

__all__ = ["TFReader", "element_spec", "to_dataset"]

RaggedForm = Literal["ragged", "pad"]

# Every dtype a Schema can hold (snapstore.format.schema.SUPPORTED_DTYPES) and its TensorFlow dtype.
_DTYPES: dict[str, Any] = {
    "bool": tf.bool,
    "int8": tf.int8,
    "int16": tf.int16,
    "int32": tf.int32,
    "int64": tf.int64,
    "uint8": tf.uint8,
    "uint16": tf.uint16,
    "uint32": tf.uint32,
    "uint64": tf.uint64,
    "float16": tf.float16,
    "float32": tf.float32,
    "float64": tf.float64,
    "complex64": tf.complex64,
    "complex128": tf.complex128,
}
# Python scalar fields are stored as int64 / float64 / bool; str and bytes become tf.string.
_SCALARS: dict[str, Any] = {
    "int": tf.int64,
    "float": tf.float64,
    "bool": tf.bool,
    "str": tf.string,
    "bytes": tf.string,
}
# Samples per internal read in per-sample mode: batches are split in Python, one element each.
_SAMPLE_CHUNK = 256


# What tf.data cannot carry from the kinds of format version 2, and what to do instead.
_UNSUPPORTED = {
    "struct": "is a nested dict, which this tf.data reader does not carry; yield its keys as "
    "top-level fields",
    "list": "is a list of str or bytes, which this tf.data reader does not carry; join the "
    "strings into one",
}


def _tf_dtype(field: Field) -> Any:
    why = _UNSUPPORTED.get(field.kind)
    if why is None and field.nullable:
        why = "may be None, which a tf.data tensor cannot hold; fill missing values in the stage"
    if why is not None:
        raise SchemaError(
            f"field {field.name!r} ({field.describe()}) {why}, or read this snapshot with "
            "snap.batches() (nested dicts as dicts of columns, None with <name>_valid masks)."
        )
    if field.kind != "array":
        if field.kind not in _SCALARS:
            raise SchemaError(
                f"field {field.name!r}: kind {field.kind!r} has no tf.data equivalent; expected "
                f"one of {sorted(_SCALARS)} or 'array'. Read this snapshot with snap.batches(), "
                "or upgrade snapstore if it was written by a newer version."
            )
        return _SCALARS[field.kind]
    if field.dtype not in _DTYPES:
        raise SchemaError(
            f"field {field.name!r}: dtype {field.dtype!r} has no TensorFlow equivalent; expected "
            f"one of {', '.join(sorted(_DTYPES))}. Convert the field in the stage, or read this "
            "snapshot with snap.batches()."
        )
    return _DTYPES[field.dtype]


def _ragged_rank(field: Field) -> int:
    """Row partitions of a batched varying-shape field: up to its last varying dimension."""
    shape = field.shape or ()
    return max(i for i, d in enumerate(shape) if d is None) + 1


def element_spec(
    schema: Schema,
    *,
    batch_size: int | None = None,
    drop_last: bool = False,
    ragged: RaggedForm = "ragged",
) -> dict[str, Any]:
    """The ``tf.data`` element spec of a snapshot's samples or batches.

    Parameters
    ----------
    schema : Schema
        The snapshot's schema (``snap.schema``).
    batch_size : int, optional
        None: one element per sample. Otherwise batches, with a leading batch dimension of
        ``batch_size`` when ``drop_last`` (every batch is full), else of unknown size.
    drop_last : bool
        Whether short batches are dropped.
    ragged : {"ragged", "pad"}
        Batched varying-shape fields as ``tf.RaggedTensor`` or zero-padded dense tensors plus
        ``<name>_lengths`` (int64, ``(batch,)`` for 1-D fields, ``(batch, ndim)`` otherwise).

    Returns
    -------
    dict
        Field name to ``tf.TensorSpec`` or ``tf.RaggedTensorSpec``: fixed-shape arrays
        ``(batch, *shape)`` of their dtype; ``int``/``float``/``bool`` fields ``(batch,)`` of
        int64/float64/bool; ``str`` and ``bytes`` ``(batch,)`` tf.string (str as UTF-8);
        varying-shape arrays with ``None`` for their varying dimensions. Per sample the batch
        dimension is left out and varying-shape arrays are dense tensors of unknown size.

    Raises
    ------
    SchemaError
        If a field has a kind or dtype TensorFlow cannot hold.
    ValueError
        If ``ragged`` is unknown, or is ``"pad"`` without a ``batch_size``.
    """
    if ragged not in ("ragged", "pad"):
        raise ValueError(f"ragged: expected 'ragged' or 'pad', found {ragged!r}")
    if batch_size is None and ragged == "pad":
        raise ValueError(
            "ragged='pad' pads the fields of a batch, but batch_size=None yields single "
            "samples; pass a batch_size, or pad later with dataset.padded_batch()"
        )
    batch: tuple[int | None, ...] = ()
    if batch_size is not None:
        batch = (operator.index(batch_size) if drop_last else None,)
    spec: dict[str, Any] = {}
    for field in schema.fields:
        dtype = _tf_dtype(field)
        shape = tuple(field.shape or ()) if field.kind == "array" else ()
        if field.kind != "array" or field.fixed or not batch:
            spec[field.name] = tf.TensorSpec((*batch, *shape), dtype)
        elif ragged == "pad":
            # Padded to the batch's largest shape: fixed dimensions keep their size.
            spec[field.name] = tf.TensorSpec((*batch, *shape), dtype)
            lengths = batch if len(shape) == 1 else (*batch, len(shape))
            spec[f"{field.name}_lengths"] = tf.TensorSpec(lengths, tf.int64)
        else:
            spec[field.name] = tf.RaggedTensorSpec(
                (*batch, *shape), dtype, ragged_rank=_ragged_rank(field), row_splits_dtype=tf.int64
            )
    return spec


# Varying-shape fields cross from Python to TensorFlow as plain tensors: flat values, the row
# lengths of each varying dimension and the row count of each dimension. A map in the graph
# then builds the RaggedTensor; built eagerly in the generator it costs several op dispatches
# per field and batch, which halved the throughput.
def _wire_ragged(field: Field, batch: int | None) -> dict[str, Any]:
    """The spec of a varying-shape field's parts (see :func:`_encode_ragged`)."""
    shape = field.shape or ()
    rank = _ragged_rank(field)
    lengths = {
        str(j): tf.TensorSpec((batch,) if j == 0 else (None,), tf.int64)
        for j in range(rank)
        if shape[j] is None
    }
    return {
        "values": tf.TensorSpec((None, *shape[rank:]), _tf_dtype(field)),
        "nrows": tf.TensorSpec((rank,), tf.int64),
        "lengths": lengths,
    }


def _encode_ragged(arrays: list[np.ndarray[Any, Any]], field: Field) -> dict[str, Any]:
    """A batch of varying-shape arrays as the numpy parts of one RaggedTensor."""
    shape = field.shape or ()
    rank = _ragged_rank(field)
    inner = tuple(int(d) for d in shape[rank:] if d is not None)
    shapes = np.array([a.shape for a in arrays], dtype=np.int64).reshape(len(arrays), len(shape))
    # rows[:, j]: how many rows of dimension j each sample has (the product of the dims before)
    rows = np.cumprod(np.concatenate([np.ones((len(arrays), 1), np.int64), shapes], axis=1), axis=1)
    flat = [
        np.ascontiguousarray(a).reshape((int(n), *inner)) for a, n in zip(arrays, rows[:, rank])
    ]
    lengths = {str(j): np.repeat(shapes[:, j], rows[:, j]) for j in range(rank) if shape[j] is None}
    return {
        "values": np.concatenate(flat) if flat else np.empty((0, *inner), field.np_dtype),
        "nrows": rows[:, :rank].sum(axis=0),
        "lengths": lengths,
    }


def _decode_ragged(parts: dict[str, Any], field: Field, batch: int | None) -> Any:
    """The RaggedTensor of :func:`_encode_ragged`'s parts, inside a tf.data map."""
    shape = field.shape or ()
    values = parts["values"]
    for j in range(_ragged_rank(field) - 1, -1, -1):  # innermost partition first
        size = shape[j]
        if size is None:
            values = tf.RaggedTensor.from_row_lengths(
                values, parts["lengths"][str(j)], validate=False
            )
        else:
            # A static row count keeps the batch dimension static when drop_last fixes it.
            nrows = batch if j == 0 and batch is not None else parts["nrows"][j]
            values = tf.RaggedTensor.from_uniform_row_length(
                values, size, nrows=nrows, validate=False
            )
    return values


def _schema_of(source: Snapshot | Mixture) -> Schema:
    """The fields a reader of ``source`` yields: its schema, and a mixture's ``source_field``
    (each sample's source index, int64)."""
    if isinstance(source, Mixture) and source.source_field is not None:
        index = Field(source.source_field, "array", "int64", ())
        return Schema((*source.schema.fields, index))
    return source.schema


class TFReader:
    """Makes ``tf.data`` datasets of one consumer's share of a snapshot or mixture, one per epoch.

    Parameters
    ----------
    snapshot : Snapshot or Mixture
        The snapshot to read (materialized here if it is not yet), or a :func:`snapstore.mix`
        mixture, read as :meth:`snapstore.Mixture.batches` reads it; its ``source_field``, if
        set, is an int64 field of every element.
    batch_size : int, optional
        Samples per batch; None yields one element per sample (not for a mixture of
        homogeneous batches, whose order depends on the batch size).
    options : ReaderOptions, optional
        How to read (:class:`snapstore.ReaderOptions`); ``shuffle`` defaults to True here.
    rank, world_size : int, optional
        This input pipeline's place among all of them, both or neither (default 0 of 1). Under
        ``tf.distribute`` pass ``input_context.input_pipeline_id`` and
        ``input_context.num_input_pipelines``.
    ragged : {"ragged", "pad"}
        Batched varying-shape fields as ``tf.RaggedTensor`` or padded (see :func:`element_spec`).
        Default: ``"pad"`` if ``options.ragged`` is ``"pad"``, else ``"ragged"``
        (``options.ragged="packed"`` is refused: tf.data gets ragged tensors instead).
    **settings
        Any field of :class:`snapstore.ReaderOptions` as a keyword (``shuffle``, ``seed``,
        ``drop_last``, ``window_bytes``, ``prefetch_bytes``, ``max_requests``...), overriding
        ``options``'s.

    Attributes
    ----------
    element_spec : dict
        The spec of every dataset it makes (:func:`element_spec`).

    Raises
    ------
    TypeError
        If ``snapshot`` is neither a Snapshot nor a Mixture.
    SchemaError
        If a field cannot be held by TensorFlow.
    ValueError
        On a bad argument (raised here, not while iterating).

    Notes
    -----
    **Epochs.** Make a dataset per epoch with :meth:`dataset`; iterating one dataset again (or
    ``ds.repeat()``) repeats its epoch in the same order.

    **Resuming.** ``tf.data`` cannot checkpoint a generator; :meth:`state_after` gives the
    reader state after ``k`` elements (count them in the training loop), and
    ``dataset(state=...)`` yields the elements after them, in any process.

    Examples
    --------
    >>> reader = TFReader(snap, batch_size=256, seed=0)                 # doctest: +SKIP
    >>> for step, batch in enumerate(reader.dataset(epoch=3)): ...     # doctest: +SKIP
    >>> state = reader.state_after(step + 1, epoch=3)  # a dict of ints  # doctest: +SKIP
    >>> rest = reader.dataset(state=state)  # the batches after step     # doctest: +SKIP
    """

    def __init__(
        self,
        snapshot: Snapshot | Mixture,
        *,
        batch_size: int | None = None,
        options: ReaderOptions | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        ragged: RaggedForm | None = None,
        **settings: Any,
    ) -> None:
        if not isinstance(snapshot, (Snapshot, Mixture)):
            raise TypeError(
                "TFReader: expected a snapstore.Snapshot or a snapstore.mix(...) Mixture, found "
                f"{type(snapshot).__name__}"
            )
        if batch_size is None and isinstance(snapshot, Mixture) and snapshot.homogeneous:
            raise ValueError(
                "batch_size=None reads single samples, but this mixture draws homogeneous "
                "batches, whose order depends on the batch size; pass a batch_size"
            )
        if (rank is None) != (world_size is None):
            raise ValueError(
                f"pass both rank and world_size or neither, found rank={rank}, "
                f"world_size={world_size}"
            )
        if batch_size is not None and (isinstance(batch_size, bool) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
        read = reader_options(options, settings)
        if ragged is None:
            if read.ragged == "packed":
                raise ValueError(
                    "ragged: TFReader gives varying-shape fields as tf.RaggedTensor or padded, "
                    "found options.ragged='packed'; pass ragged='ragged' or ragged='pad'"
                )
            ragged = "pad" if read.ragged == "pad" else "ragged"
        drop_last = read.drop_last
        self.snapshot = snapshot.materialize() if isinstance(snapshot, Snapshot) else snapshot
        self.batch_size = batch_size
        schema = _schema_of(self.snapshot)
        self.element_spec = element_spec(
            schema, batch_size=batch_size, drop_last=drop_last, ragged=ragged
        )
        batched = batch_size is not None
        # Per sample, batches of _SAMPLE_CHUNK are read and unbatched by tf.data.
        read_size = batch_size if batch_size is not None else _SAMPLE_CHUNK
        self._read_size = read_size
        shuffle = True if read.shuffle is None else read.shuffle
        self._options = read.replace(shuffle=shuffle, ragged="pad" if ragged == "pad" else "list")
        self._place = (rank or 0, world_size or 1)
        self._varying = (
            []
            if ragged == "pad"
            else [f for f in schema.fields if f.kind == "array" and not f.fixed]
        )
        self._batch = batch_size if batched and drop_last else None  # the static batch dim
        # What the generator yields: the read batches, varying-shape fields in parts.
        self._wire = element_spec(
            schema, batch_size=read_size, drop_last=drop_last and batched, ragged=ragged
        )
        for field in self._varying:
            self._wire[field.name] = _wire_ragged(field, self._batch)
        self._reader(0, None).close()  # fail here on a bad argument

    def _reader(
        self, epoch: int, state: dict[str, int] | None, batch_size: int | None = None
    ) -> ConsumerReader:
        size = self._read_size if batch_size is None else batch_size
        rank, world_size = self._place
        reader = self.snapshot.batches(
            size, self._options, epoch=epoch, rank=rank, world_size=world_size
        )
        if state is not None:
            reader.set_state(dict(state))
        return reader

    def _batches(self, epoch: int, state: dict[str, int] | None) -> Iterator[dict[str, Any]]:
        """The reader's batches, with the varying-shape fields encoded for the generator."""
        reader = self._reader(epoch, state)
        if self.batch_size is not None:
            with reader:
                yield from map(self._encode, reader)
            return
        # Per sample, the short read batch that drop_last leaves out belongs in.
        resized = functools.partial(self._reader, epoch, None)
        yield from map(self._encode, every_batch(reader, resized))

    def _encode(self, batch: dict[str, Any]) -> dict[str, Any]:
        for field in self._varying:
            batch[field.name] = _encode_ragged(batch[field.name], field)
        return batch

    def _decode(self, element: dict[str, Any]) -> dict[str, Any]:
        out = dict(element)
        for field in self._varying:
            out[field.name] = _decode_ragged(element[field.name], field, self._batch)
        return out

    def _densify(self, element: dict[str, Any]) -> dict[str, Any]:
        out = dict(element)
        for field in self._varying:
            value = element[field.name]  # rank-1 fields come out of unbatch() dense already
            if isinstance(value, tf.RaggedTensor):
                out[field.name] = value.to_tensor()
        return out

    def _start(self, epoch: int | None, state: dict[str, int] | None) -> tuple[int, int]:
        """(epoch, position) a dataset starts from; checks ``state`` against this reader."""
        if state is not None:
            if not isinstance(state, dict) or not isinstance(state.get("epoch"), int):
                raise ResumeError(
                    f"expected a state dict from TFReader.state_after() or "
                    f"BatchReader.get_state(), found {state!r:.200}"
                )
            if epoch is not None and epoch != state["epoch"]:
                raise ResumeError(
                    f"epoch={epoch} but the resume state is for epoch {state['epoch']}; "
                    "leave epoch out to take it from the state"
                )
            epoch = state["epoch"]
        epoch = 0 if epoch is None else operator.index(epoch)
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, found {epoch}")
        reader = self._reader(epoch, state)  # set_state raises ResumeError on a foreign state
        return epoch, reader.get_state()["position"]

    def _count(self, epoch: int, position: int) -> int:
        """Elements a dataset yields from ``position`` of epoch ``epoch``."""
        left = consumer_samples(self._reader(epoch, None)) - position
        if self.batch_size is None:
            return left
        if self._options.drop_last:
            return left // self.batch_size
        return math.ceil(left / self.batch_size)

    def dataset(self, *, epoch: int | None = None, state: dict[str, int] | None = None) -> Any:
        """A ``tf.data.Dataset`` of epoch ``epoch``, or of what is left after ``state``.

        Parameters
        ----------
        epoch : int, optional
            The epoch (it seeds the shuffle). Default: the state's epoch, else 0.
        state : dict, optional
            A reader state from :meth:`state_after` or the reader's ``get_state()``
            (:meth:`snapstore.BatchReader.get_state`, or a mixture reader's) for this snapshot
            or mixture, order and consumer.

        Returns
        -------
        tf.data.Dataset
            Elements of :attr:`element_spec`, with a known cardinality. Every pass over it
            yields the same elements in the same order. tf.data's auto-sharding is off, as
            snapstore has already sharded.

        Raises
        ------
        ResumeError
            If ``state`` belongs to another snapshot or mixture, epoch, order or consumer.
        """
        epoch, position = self._start(epoch, state)
        start = None if state is None else dict(state)

        def generate() -> Iterator[dict[str, Any]]:
            return self._batches(epoch, start)

        ds = tf.data.Dataset.from_generator(generate, output_signature=self._wire)
        if self._varying:
            ds = ds.map(self._decode)
        if self.batch_size is None:
            ds = ds.unbatch()
            if self._varying:
                ds = ds.map(self._densify)
        ds = ds.apply(tf.data.experimental.assert_cardinality(self._count(epoch, position)))
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return ds.with_options(options)

    def state_after(
        self, steps: int, *, epoch: int | None = None, state: dict[str, int] | None = None
    ) -> dict[str, int]:
        """The reader state after ``steps`` elements of :meth:`dataset` (same arguments).

        Parameters
        ----------
        steps : int
            Elements (batches, or samples when ``batch_size`` is None) consumed from the dataset.
        epoch, state
            What the dataset was made with.

        Returns
        -------
        dict of str to int
            The reader's ``get_state()`` dict (:meth:`snapstore.BatchReader.get_state`, or a
            mixture reader's); ``dataset(state=...)`` yields the elements after those
            ``steps``. Plain integers, for JSON or a checkpoint.

        Raises
        ------
        ValueError
            If ``steps`` is negative or more than the dataset holds.
        """
        steps = operator.index(steps)
        epoch, position = self._start(epoch, state)
        count = self._count(epoch, position)
        if not 0 <= steps <= count:
            raise ValueError(f"steps must be in [0, {count}] for this dataset, found {steps}")
        reader = self._reader(epoch, None)
        size = self.batch_size or 1
        moved = reader.get_state()
        moved["position"] = min(position + steps * size, consumer_samples(reader))
        return moved


def to_dataset(
    snapshot: Snapshot | Mixture,
    *,
    batch_size: int | None = None,
    epoch: int | None = None,
    state: dict[str, int] | None = None,
    **options: Any,
) -> Any:
    """A ``tf.data.Dataset`` of a snapshot or mixture: ``TFReader(snapshot, ...).dataset(...)``.

    Parameters
    ----------
    snapshot : Snapshot or Mixture
        The snapshot to read, or a :func:`snapstore.mix` mixture.
    batch_size : int, optional
        Samples per batch; None (the default) yields single samples.
    epoch : int, optional
        The epoch (default: the state's, else 0); make a new dataset for every epoch.
    state : dict, optional
        Resume after this reader state (see :meth:`TFReader.state_after`).
    **options
        ``options``, ``rank``, ``world_size``, ``ragged`` and any field of
        :class:`snapstore.ReaderOptions` as a keyword (``shuffle`` defaults to True), as for
        :class:`TFReader`.

    Returns
    -------
    tf.data.Dataset
        Dicts of tensors with the spec of :func:`element_spec`.

    Examples
    --------
    >>> ds = to_dataset(snap, batch_size=256, epoch=0)                # doctest: +SKIP
    >>> ds = ds.map(lambda b: (b["image"], b["label"])).prefetch(tf.data.AUTOTUNE)  # doctest: +SKIP
    >>> model.fit(ds, epochs=1)                                       # doctest: +SKIP
    >>> both = snapstore.mix({"web": web, "code": code}, [0.7, 0.3])  # doctest: +SKIP
    >>> ds = to_dataset(both, batch_size=256, seed=0, epoch=0)        # doctest: +SKIP
    """
    reader = TFReader(snapshot, batch_size=batch_size, **options)
    return reader.dataset(epoch=epoch, state=state)
