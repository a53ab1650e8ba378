"""Sample schema: which fields a sample has, their kinds, and how they map to Arrow.

A sample is a ``dict`` of ``str`` to one of: a numpy array (any integer, unsigned, float,
complex or bool dtype, any rank, fixed or varying shape), a numpy scalar, a Python ``int``,
``float``, ``bool``, ``str`` or ``bytes``, a list of numbers (a varying 1-D array, see
:mod:`snapstore.lists`), a list of str or bytes, a nested dict of these, or ``None`` (which
makes the field nullable). A torch tensor or another array-like (``__array__``, ``__dlpack__``)
counts as the numpy array it converts to (see :mod:`snapstore.arraylike`). The schema is
inferred from the samples of the first block unless declared (:mod:`snapstore.declare`); a
later sample that does not fit raises :class:`SchemaError`.

Arrow layout per field kind (see docs/format.md):

- fixed-shape array ``(d1, ..., dk)``: ``fixed_size_list<T>[d1*...*dk]`` (rank 0: plain ``T``)
- varying-shape array of rank 1: ``large_list<T>``
- varying-shape array of rank k > 1:
  ``struct<values: large_list<T>, shape: fixed_size_list<int64>[k]>``
- ``int`` / ``float`` / ``bool``: ``int64`` / ``float64`` / ``bool``
- ``str`` / ``bytes``: ``large_string`` / ``large_binary``
- list of str / bytes: ``large_list<large_string>`` / ``large_list<large_binary>``
- nested dict: ``struct<...>`` of its fields (format version 2)
- a nullable field: the same type, with Arrow validity (format version 2)

Complex dtypes are stored as their real components with a trailing dimension of 2.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from .errors import SchemaError

__all__ = ["SUPPORTED_DTYPES", "Field", "FieldKind", "Schema", "check_names"]

# "null" exists only while a schema is inferred: a field seen as None in every sample so far.
FieldKind = Literal["array", "int", "float", "bool", "str", "bytes", "list", "struct", "null"]

_SCALAR_KINDS: dict[type, FieldKind] = {
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
_DECLARE_HINT = (
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


def _check_dtype(dtype: np.dtype[Any], name: str) -> np.dtype[Any]:
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
                dtype = _check_dtype(np.dtype(data["dtype"]), name)
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


@dataclass(frozen=True)
class Schema:
    """The ordered fields of a snapshot's samples."""

    fields: tuple[Field, ...]

    @property
    def names(self) -> list[str]:
        """Field names in order."""
        return [f.name for f in self.fields]

    def __getitem__(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema of every block."""
        return pa.schema([f.arrow_field() for f in self.fields])

    def flat(self) -> Schema:
        """The columns a batch is assembled from: nested fields named by their dotted path
        (``meta.w``), and after each field with a :attr:`Field.masked` validity mask a bool field
        ``<name>_valid``. The schema itself when it has neither (every format 1 schema)."""
        return self._flat

    @functools.cached_property
    def _flat(self) -> Schema:
        leaves: list[Field] = []
        _flatten(self.fields, "", leaves)
        return self if leaves == list(self.fields) else Schema(tuple(leaves))

    def to_json(self) -> list[dict[str, Any]]:
        """JSON-able form, as stored in the manifest."""
        return [f.to_json() for f in self.fields]

    @classmethod
    def from_json(cls, data: Sequence[Mapping[str, Any]]) -> Schema:
        """Inverse of :meth:`to_json`."""
        schema = cls(tuple(Field.from_json(d) for d in data))
        check_names(schema.fields)
        return schema

    @classmethod
    def declare(cls, spec: Mapping[str, Any]) -> Schema:
        """Build a schema from a compact declaration.

        Parameters
        ----------
        spec : mapping
            Field name to ``int``, ``float``, ``bool``, ``str``, ``bytes`` (the Python types);
            ``(dtype, shape)`` for arrays, with ``None`` for varying dimensions; ``list[int]``,
            ``list[float]``, ``list[bool]`` (the arrays ``int64[*]``, ``float64[*]``,
            ``bool[*]``), ``list[str]``, ``list[bytes]``; a dict of declarations for a nested
            dict; ``X | None`` or :func:`snapstore.nullable` for a field that may be None. See
            :mod:`snapstore.declare`.

        Raises
        ------
        SchemaError
            Naming a field whose declaration is none of these.

        Examples
        --------
        >>> Schema.declare({"tokens": ("int32", (None,)), "label": int}).fields[0].describe()
        'int32[*]'
        >>> Schema.declare({"meta": {"w": int, "tag": str | None}})["meta"].describe()
        '{w: int, tag: str | None}'
        """
        from .declare import field_from_declaration  # declare.py builds on this module

        schema = cls(tuple(field_from_declaration(name, decl) for name, decl in spec.items()))
        check_names(schema.fields)
        return schema


def _flatten(fields: Sequence[Field], prefix: str, out: list[Field]) -> None:
    for f in fields:
        name = prefix + f.name
        if f.kind == "struct":
            _flatten(f.fields, f"{name}.", out)
        else:
            out.append(replace(f, name=name) if prefix else f)
        if f.masked:
            out.append(Field(f"{name}_valid", "bool"))


def check_names(fields: Sequence[Field], prefix: str = "") -> None:
    """Raise SchemaError where batches could not tell fields apart: a ``<name>_valid`` mask
    beside a field of that name, or a name ``<key>.<rest>`` beside a nested dict ``<key>``."""
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        raise SchemaError(f"field names {names} repeat a name; every field needs its own")
    for f in fields:
        if f.masked and f"{f.name}_valid" in names:
            raise SchemaError(
                f"field {prefix + f.name!r} may be None, so batches carry its validity mask as "
                f"{prefix + f.name + '_valid'!r}, a name the samples already use; rename one "
                "of the two fields."
            )
        if f.kind != "struct":
            continue
        clash = [n for n in names if n.startswith(f"{f.name}.")]
        if clash:
            raise SchemaError(
                f"field {prefix + clash[0]!r} looks like a key of the nested dict "
                f"{prefix + f.name!r} in batches (which name nested fields by dotted paths); "
                "rename it."
            )
        check_names(f.fields, f"{prefix}{f.name}.")


# Inference and checking moved to their own modules; these names stay importable from here.
_MOVED = {
    "infer_schema": "inference",
    "field_of": "inference",
    "resolve": "inference",
    "sample_items": "inference",
    "check_keys": "inference",
    "sample_checker": "checks",
    "check_sample": "checks",
}


def __getattr__(name: str) -> Any:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module 'snapstore.schema' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"snapstore.{module}"), name)
