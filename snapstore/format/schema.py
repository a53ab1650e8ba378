"""Sample schema: which fields a sample has, their kinds, and how they map to Arrow.

A sample is a ``dict`` of ``str`` to one of: a numpy array (any integer, unsigned, float,
complex or bool dtype, any rank, fixed or varying shape), a numpy scalar, a Python ``int``,
``float``, ``bool``, ``str`` or ``bytes``, a list of numbers (a varying 1-D array, see
:mod:`snapstore.format.lists`), a list of str or bytes, a nested dict of these, or ``None`` (which
makes the field nullable). A torch tensor or another array-like (``__array__``, ``__dlpack__``)
counts as the numpy array it converts to (see :mod:`snapstore.format.arraylike`). The schema is
inferred from the samples of the first block unless declared (:mod:`snapstore.format.declare`); a
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from ..errors import SchemaError
from .declare import field_from_declaration
from .fields import SUPPORTED_DTYPES, Field, FieldKind

__all__ = ["SUPPORTED_DTYPES", "Field", "FieldKind", "Schema", "check_names"]


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
            :mod:`snapstore.format.declare`.

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
        raise AttributeError(f"module 'snapstore.format.schema' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"snapstore.format.{module}"), name)
