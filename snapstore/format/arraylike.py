"""Tensors and other array-likes as sample values: each is stored as the numpy array it holds.

A torch tensor becomes ``tensor.numpy()``: the same memory, for a CPU tensor; one that requires
grad is detached (still the same memory), and a CUDA tensor is copied to the host
(``tensor.numpy(force=True)``). Any other object with ``__array__``
(JAX arrays, TensorFlow eager tensors, pandas objects) becomes ``np.asarray(value)``, which JAX
and TensorFlow answer without a copy for data on the CPU, and with a copy to the host otherwise.
An object with only ``__dlpack__`` becomes ``np.from_dlpack(value)`` (shared CPU memory).
``__array__`` goes first because it is the older, more widely correct protocol: TensorFlow
2.21's DLPack export aborts the process on a bool tensor. A 0-d tensor becomes a rank-0 array:
a scalar of its dtype, like ``np.int64(3)``.

The writer converts a sample once, when its values are not plain (numpy arrays and scalars,
``int``, ``float``, ``bool``, ``str``, ``bytes``): the conversion replaces the value, and the
schema checks and the encoder see only numpy. No framework is imported here: a torch tensor is
recognized through ``sys.modules["torch"]``, which holds torch whenever a tensor exists.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import SchemaError

__all__ = ["as_numpy", "convert_sample", "convert_values"]

PLAIN_TYPES = frozenset({np.ndarray, int, float, bool, str, bytes, list, tuple, type(None)})
"""Value types stored as they are (numpy scalars and ndarray subclasses are too); a list holds
numbers, str or bytes, never tensors (the schema checks refuse a list of tensors)."""

# DLPack refuses, depending on the producer: another device (BufferError), a dtype it cannot
# describe (RuntimeError, TypeError), an unsupported version or layout (ValueError).
_DLPACK_ERRORS = (BufferError, RuntimeError, TypeError, ValueError)


def as_numpy(
    value: Any, name: str, index: int | None = None, row: int | None = None
) -> np.ndarray[Any, Any] | None:
    """The numpy array a tensor or array-like holds; None for any other value.

    Parameters
    ----------
    value : object
        A sample value that is not plain (see :data:`PLAIN_TYPES`).
    name, index, row : str, int, int
        Name the value in errors: field ``name`` of sample ``index``, or row ``row`` of the
        batch column ``name``, or the whole column when both are None.

    Returns
    -------
    numpy.ndarray or None
        The array, sharing the value's memory where its library allows; None when ``value`` is
        a numpy array or scalar, or not an array-like at all (the schema checks refuse it).

    Raises
    ------
    SchemaError
        If the value is a tensor or array-like that numpy cannot hold, such as a bfloat16 tensor.

    Examples
    --------
    >>> import torch                                                    # doctest: +SKIP
    >>> as_numpy(torch.tensor(3), "label", index=0)                     # doctest: +SKIP
    array(3)
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):  # first: the common case
        return _from_torch(torch, value, name, index, row)
    if isinstance(value, (np.ndarray, np.generic)):
        return None
    if hasattr(value, "__array__"):
        return _from_array(value, _where(name, index, row))
    if hasattr(value, "__dlpack__") and hasattr(value, "__dlpack_device__"):
        try:
            return np.from_dlpack(value)
        except _DLPACK_ERRORS as exc:
            where = _where(name, index, row)
            raise SchemaError(
                f"{where}: numpy cannot take this {_type_name(value)} through DLPack "
                f"({exc}); expected an array-like on the CPU with a numpy dtype. Convert it "
                "to a numpy array (on the host, as float32 for bfloat16) before yielding it."
            ) from exc
    return None


def _where(name: str, index: int | None, row: int | None) -> str:
    if index is not None:
        return f"sample {index}, field {name!r}"
    return f"batch column {name!r}" + ("" if row is None else f", row {row}")


def _from_torch(
    torch: Any, tensor: Any, name: str, index: int | None, row: int | None
) -> np.ndarray[Any, Any]:
    try:
        try:
            array: np.ndarray[Any, Any] = tensor.numpy()  # a CPU tensor: shares its memory
        except (RuntimeError, TypeError):  # requires grad, not on the CPU, a conjugate view...
            # detach().cpu().resolve_conj().resolve_neg().numpy(): a copy only off the CPU; it
            # raises again for what no step fixes (a dtype numpy lacks, a sparse layout)
            array = tensor.numpy(force=True)
    except TypeError as exc:  # a dtype numpy lacks (bfloat16, float8, complex32), or sparse
        where = _where(name, index, row)
        if tensor.layout != torch.strided:
            raise SchemaError(
                f"{where}: torch tensor of layout {tensor.layout} cannot be stored; expected a "
                "dense (strided) tensor. Convert it with tensor.to_dense() before yielding it."
            ) from exc
        wider = "tensor.float()" if tensor.is_floating_point() else "tensor.to(torch.complex64)"
        raise SchemaError(
            f"{where}: torch tensor of dtype {tensor.dtype} has no numpy dtype, so it cannot be "
            f"stored; expected a dtype numpy has (float16, float32, ...). Convert it with "
            f"{wider} before yielding it."
        ) from exc
    except (RuntimeError, NotImplementedError) as exc:  # no data (meta device) and the like
        where = _where(name, index, row)
        raise SchemaError(
            f"{where}: torch tensor on {tensor.device} cannot be copied to a numpy array "
            f"({exc}); expected a tensor with data on the CPU or a GPU. Yield a tensor that "
            "holds its values."
        ) from exc
    return array


def _from_array(value: Any, where: str) -> np.ndarray[Any, Any]:
    try:
        return np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise SchemaError(
            f"{where}: {_type_name(value)}.__array__ failed ({exc}); expected an array-like "
            "that numpy can read. Convert it to a numpy array (on the host) before yielding it."
        ) from exc


def _type_name(value: Any) -> str:
    kind = type(value)
    return f"{kind.__module__.split('.')[0]}.{kind.__qualname__}"  # cupy.ndarray, not ndarray


def convert_sample(sample: Any, index: int) -> Any:
    """``sample`` with its tensors and array-likes replaced by numpy arrays (a new dict); the
    same object when it holds none, or is not a mapping (which the schema checks refuse)."""
    if type(sample) is not dict and not isinstance(sample, Mapping):
        return sample
    torch = sys.modules.get("torch")
    tensor = torch.Tensor if torch is not None else None
    converted: dict[Any, Any] | None = None
    for name, value in sample.items():
        kind = type(value)
        if kind in PLAIN_TYPES:
            continue
        if kind is dict:  # a nested dict: its tensors are converted too
            array: Any = convert_sample(value, index)
            if array is value:
                continue
        elif kind is tensor:  # inlined for the common case: a plain CPU tensor, shared memory
            try:
                array = value.numpy()
            except (RuntimeError, TypeError):  # grad, device, dtype...: see _from_torch
                array = as_numpy(value, name, index)
        else:
            array = as_numpy(value, name, index)
        if array is not None:
            if converted is None:
                converted = dict(sample)
            converted[name] = array
    return sample if converted is None else converted


def convert_values(values: list[Any], name: str) -> list[Any]:
    """A column's list of per-row values with tensors and array-likes as numpy arrays (the same
    list when it holds none)."""
    if set(map(type, values)) <= PLAIN_TYPES:  # one C-level pass: str, bytes and arrays
        return values
    out = list(values)
    for row, value in enumerate(values):
        if type(value) not in PLAIN_TYPES:
            array = as_numpy(value, name, row=row)
            if array is not None:
                out[row] = array
    return out
