"""Schema declarations: the compact form passed as ``schema=``, parsed into fields, and the
declaration of a field written back as Python source (for error messages to copy from).

A declaration maps each field name to one of:

- ``int``, ``float``, ``bool``, ``str``, ``bytes``;
- ``(dtype, shape)`` for a numpy array, ``None`` for a varying dimension;
- ``list[int]``, ``list[float]``, ``list[bool]``: the varying 1-D arrays ``int64[*]``,
  ``float64[*]``, ``bool[*]`` (what lists of those numbers are stored as); ``list[str]``,
  ``list[bytes]``: lists of str or bytes;
- a dict of declarations: a nested dict;
- ``X | None`` or ``Optional[X]`` (for the types above), or ``nullable(X)`` (for any of them,
  tuples and dicts included): the field may also be None.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import SchemaError
from .fields import SCALAR_KINDS, Field, FieldKind, check_dtype

__all__ = ["Nullable", "declaration_of", "field_from_declaration", "nullable"]

_LIST_ITEMS: dict[type, tuple[FieldKind, str]] = {
    int: ("array", "int64"),
    float: ("array", "float64"),
    bool: ("array", "bool"),
    str: ("list", "str"),
    bytes: ("list", "bytes"),
}
_EXPECTED = (
    "expected int, float, bool, str, bytes, a (dtype, shape) tuple such as ('int32', (None,)), "
    "list[int], list[float], list[bool], list[str], list[bytes], a dict of these (a nested "
    "dict), X | None, or snapstore.nullable(X)"
)


@dataclass(frozen=True)
class Nullable:
    """A declaration whose field may also be None; made by :func:`nullable`."""

    declaration: Any


def nullable(declaration: Any) -> Nullable:
    """Declare a field that may be None: ``nullable(("float32", (4,)))``, ``nullable({...})``.

    For Python types ``X | None`` says the same (``str | None``, ``list[int] | None``); tuples
    and dicts cannot be written that way, so they take this function.

    Parameters
    ----------
    declaration : object
        Any field declaration (see :meth:`snapstore.Schema.declare`).

    Returns
    -------
    Nullable
        A marker that :meth:`snapstore.Schema.declare` reads as "this, or None".

    Examples
    --------
    >>> from snapstore import Schema, nullable
    >>> Schema.declare({"box": nullable(("float32", (4,)))})["box"].describe()
    'float32[4] | None'
    """
    return Nullable(declaration)


def field_from_declaration(leaf: str, decl: Any, name: str | None = None) -> Field:
    """The field ``leaf`` a declaration describes; ``name`` names it in messages (a dotted path
    inside nested dicts), ``leaf`` by default.

    Raises
    ------
    SchemaError
        If the declaration is not one of the forms of this module, naming the field.
    """
    name = name or leaf
    if isinstance(decl, Nullable):
        return replace(field_from_declaration(leaf, decl.declaration, name), nullable=True)
    inner = _optional_of(name, decl)
    if inner is not None:
        return replace(field_from_declaration(leaf, inner, name), nullable=True)
    if isinstance(decl, type) and decl in SCALAR_KINDS:
        return Field(leaf, SCALAR_KINDS[decl])
    if typing.get_origin(decl) is list:
        args = typing.get_args(decl)
        if len(args) == 1 and args[0] in _LIST_ITEMS:
            kind, dtype = _LIST_ITEMS[args[0]]
            return Field(leaf, kind, dtype, (None,) if kind == "array" else None)
    elif isinstance(decl, tuple) and len(decl) == 2:
        try:
            np_dtype = check_dtype(np.dtype(decl[0]), name)
            shape = tuple(None if d is None else int(d) for d in decl[1])
        except TypeError as exc:
            raise SchemaError(
                f"field {name!r}: cannot understand declaration {decl!r} ({exc}); {_EXPECTED}."
            ) from exc
        return Field(leaf, "array", np_dtype.name, shape)
    elif isinstance(decl, Mapping) and decl and all(isinstance(k, str) for k in decl):
        children = tuple(field_from_declaration(k, v, f"{name}.{k}") for k, v in decl.items())
        return Field(leaf, "struct", fields=children)
    raise SchemaError(f"field {name!r}: cannot understand declaration {decl!r}; {_EXPECTED}.")


def _optional_of(name: str, decl: Any) -> Any:
    """``X`` for ``X | None`` or ``Optional[X]``, None for anything that is not a union."""
    origin = typing.get_origin(decl)
    if origin is not typing.Union and origin is not types.UnionType:
        return None
    args = typing.get_args(decl)
    others = [a for a in args if a is not type(None)]
    if len(others) != 1 or len(args) != 2:
        raise SchemaError(
            f"field {name!r}: declaration {decl!r} is a union; a field has one type, which may "
            "also be None (X | None). Make the values one type."
        )
    return others[0]


def declaration_of(field: Field) -> str:
    """The declaration of ``field`` as Python source, e.g. ``"list[str] | None"``.

    A field whose type is still unknown (None in every sample so far) is ``<type> | None``.
    """
    if field.kind == "null":
        return "<type> | None"
    if field.kind == "struct":
        body = "{" + ", ".join(f"{c.name!r}: {declaration_of(c)}" for c in field.fields) + "}"
    elif field.kind == "list":
        body = f"list[{field.dtype}]"
    elif field.kind == "array":
        body = f"({field.dtype or 'float64'!r}, {tuple(field.shape or ())!r})"
    else:
        body = field.kind
    if not field.nullable:
        return body
    if field.kind in ("struct", "array"):
        return f"snapstore.nullable({body})"
    return f"{body} | None"
