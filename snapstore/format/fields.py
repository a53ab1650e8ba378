"""A field of a sample's schema: its kind, dtype, shape and nullability, and its Arrow type.

The bottom of the schema modules: :mod:`snapstore.format.declare` builds fields from
declarations, :mod:`snapstore.format.schema` orders them into a
:class:`~snapstore.format.schema.Schema` (and re-exports :class:`Field`, :data:`FieldKind` and
:data:`SUPPORTED_DTYPES`, where users import them); see :mod:`snapstore.format.schema` for the
Arrow layout of each kind.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from ..errors import SchemaError

__all__ = ["DECLARE_HINT", "SCALAR_KINDS", "SUPPORTED_DTYPES", "Field", "FieldKind", "check_dtype"]

# "null" exists only while a schema is inferred: a field seen as None in every sample so far.
FieldKind = Literal["array", "int", "float", "bool", "str", "bytes", "list", "struct", "null"]

SCALAR_KINDS: dict[type, FieldKind] = {
    bool: "bool",
    int: "int",
    float: "float",
    str: "str",
    bytes: "bytes",
}
_SCALAR_ARROW: dict[str, pa.DataType] = {
    "int": pa.int64(),
    "float": pa.float64(),
    "bool": pa.bool_(),
    "str": pa.large_string(),
    "bytes": pa.large_binary(),
}
DECLARE_HINT = (
    "to declare the schema explicitly, pass schema= to snapshot(), e.g. "
    "schema={'tokens': ('int32', (None,)), 'label': int, 'text': str}."
)
_PYTHON_NAMES = {"int64": "int", "float64": "float", "bool": "bool"}


# Every dtype Arrow can store natively (complex as pairs of its float parts).
SUPPORTED_DTYPES = frozenset(
    [
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    ]
)


def check_dtype(dtype: np.dtype[Any], name: str) -> np.dtype[Any]:
    if dtype.kind not in "biufc" or dtype.name not in SUPPORTED_DTYPES:
        raise SchemaError(
            f"field {name!r}: numpy dtype {dtype} is not supported; expected one of "
            f"{', '.join(sorted(SUPPORTED_DTYPES))}. Convert strings to str/bytes, objects to "
            "arrays, extended precision (float128) to float64, and bfloat16 to float32."
        )
    return dtype.newbyteorder("=") if dtype.byteorder not in "=|" else dtype


@dataclass(frozen=True)
class Field:
    """One field of a sample.

    Parameters
    ----------
    name : str
        The key in the sample dict (in a nested dict, the key there).
    kind : {"array", "int", "float", "bool", "str", "bytes", "list", "struct"}
        What the field holds: ``"list"`` is a list of str or bytes, ``"struct"`` a nested dict.
    dtype : str, optional
        For arrays: the numpy dtype string in native byte order (``"int32"``, ``"uint8"``...).
        For lists: the item kind, ``"str"`` or ``"bytes"``.
    shape : tuple of (int or None), optional
        For arrays: the shape, with ``None`` for dimensions that vary between samples.
    nullable : bool
        Whether the value may be None.
    fields : tuple of Field
        For nested dicts: their fields, in order.
    from_list : bool
        While a schema is inferred: the field was seen as Python lists only, so ``int64[*]``
        may still widen to ``float64[*]`` and ``dtype`` is None after empty lists only. Not
        stored and not compared.
    """

    name: str
    kind: FieldKind
    dtype: str | None = None
    shape: tuple[int | None, ...] | None = None
    nullable: bool = False
    fields: tuple[Field, ...] = ()
    from_list: bool = dataclass_field(default=False, compare=False, repr=False)

    @property
    def fixed(self) -> bool:
        """True for an array whose shape is the same in every sample."""
        return self.kind == "array" and self.shape is not None and None not in self.shape

    @property
    def masked(self) -> bool:
        """True for a nullable field whose batches carry a ``<name>_valid`` mask: every kind but
        str, bytes and lists of them, whose batch lists hold None itself."""
        return self.nullable and self.kind not in ("str", "bytes", "list")

    @property
    def np_dtype(self) -> np.dtype[Any]:
        """The numpy dtype of an array field."""
        if self.dtype is None or self.kind != "array":
            raise SchemaError(f"field {self.name!r} of kind {self.kind!r} has no numpy dtype")
        return np.dtype(self.dtype)

    def storage_dtype(self) -> np.dtype[Any]:
        """The dtype stored in Arrow (complex becomes its real component type)."""
        dtype = self.np_dtype
        return np.dtype(f"f{dtype.itemsize // 2}") if dtype.kind == "c" else dtype

    def storage_shape(self) -> tuple[int | None, ...]:
        """The stored shape (complex fields get a trailing dimension of 2)."""
        shape = self.shape or ()
        return (*shape, 2) if self.np_dtype.kind == "c" else shape

    def arrow_type(self) -> pa.DataType:
        """The Arrow type this field is stored as."""
        if self.kind == "struct":
            return pa.struct([f.arrow_field() for f in self.fields])
        if self.kind == "list":
            return pa.large_list(_SCALAR_ARROW[str(self.dtype)])
        if self.kind != "array":
            return _SCALAR_ARROW[self.kind]
        value_type = pa.from_numpy_dtype(self.storage_dtype())
        shape = self.storage_shape()
        if None not in shape:
            return pa.list_(value_type, math.prod(shape)) if shape else value_type  # type: ignore[arg-type]
        values = pa.large_list(value_type)
        if len(shape) == 1:
            return values
        return pa.struct([("values", values), ("shape", pa.list_(pa.int64(), len(shape)))])

    def arrow_field(self) -> pa.Field:
        """The Arrow field: named, typed, and nullable only when the field is."""
        return pa.field(self.name, self.arrow_type(), nullable=self.nullable)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able description, as stored in the manifest."""
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.kind == "array":
            out["dtype"] = self.dtype
            out["shape"] = list(self.shape or ())
        elif self.kind == "list":
            out["items"] = self.dtype
        elif self.kind == "struct":
            out["fields"] = [f.to_json() for f in self.fields]
        if self.nullable:
            out["nullable"] = True
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Field:
        """Inverse of :meth:`to_json`; validates what it reads."""
        try:
            kind, name, nullable = data["kind"], data["name"], data.get("nullable", False)
            if not isinstance(name, str) or not isinstance(nullable, bool):
                raise TypeError("name must be a str and nullable a bool")
            if kind == "array":
                shape = tuple(None if d is None else int(d) for d in data["shape"])
                dtype = check_dtype(np.dtype(data["dtype"]), name)
                return cls(name, "array", dtype.name, shape, nullable)
            if kind == "list" and data["items"] in ("str", "bytes"):
                return cls(name, "list", data["items"], nullable=nullable)
            if kind == "struct" and data["fields"]:
                children = tuple(Field.from_json(f) for f in data["fields"])
                return cls(name, "struct", nullable=nullable, fields=children)
            if kind in _SCALAR_ARROW:
                return cls(name, kind, nullable=nullable)
        except (KeyError, TypeError, ValueError) as exc:
            raise SchemaError(f"malformed field description {dict(data)!r}: {exc}") from exc
        raise SchemaError(f"unknown field kind {kind!r} in {dict(data)!r}")

    def describe(self) -> str:
        """A short human form such as ``uint8[64,64,3]``, ``int32[*]`` or ``str | None``."""
        if self.kind == "null":
            return "None"
        if self.kind == "struct":
            base = "{" + ", ".join(f"{f.name}: {f.describe()}" for f in self.fields) + "}"
        elif self.kind == "list":
            base = f"list of {self.dtype}"
        elif self.kind == "array" and self.from_list:
            base = f"list of {_PYTHON_NAMES.get(str(self.dtype), self.dtype)}"
            base = base if self.dtype else "an empty list"
        elif self.kind == "array":
            dims = ",".join("*" if d is None else str(d) for d in self.shape or ())
            base = f"{self.dtype}[{dims}]"
        else:
            base = self.kind
        return f"{base} | None" if self.nullable else base
