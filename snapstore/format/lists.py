"""Python lists (and tuples) as sample values: which field a list implies, the cheap check that
a list fits a field, and a column of lists as flat values for Arrow.

A list of numbers is a varying-length 1-D array: ``[3, 5, 8]`` is ``int64[*]``, a list of
floats (ints allowed among them) ``float64[*]``, a list of bools ``bool[*]``; it reads back as a
numpy array. An empty list fits any varying 1-D array field. A list of str or bytes is stored as
an Arrow list of strings and reads back as a list. Anything else in a list (nested lists, None,
dicts, mixed kinds) is refused: an array of more than one dimension is a numpy array.

Checks are one C-level pass over the items (``set(map(type, items))``, ``min``, ``max``), never
a Python loop per item; the flat values of a column of lists are one ``np.fromiter`` over the
chained items.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

__all__ = ["LIST_TYPES", "classify", "fits_exactly", "flatten", "list_check"]

LIST_TYPES = (list, tuple)
_INT_TYPES = frozenset({int, np.int64})
_FLOAT_TYPES = frozenset({float, int, np.float64, np.int64})
_BOOL_TYPES = frozenset({bool, np.bool_})
_STR_TYPES = frozenset({str})
_BYTES_TYPES = frozenset({bytes})
_INT_LIMIT = 2**63
# Ints in a float64 list must be exactly representable: |x| <= 2**53.
_EXACT = 2**53
# The item types of a list field (kind "list") by its item kind.
_OBJECT_TYPES = {"str": _STR_TYPES, "bytes": _BYTES_TYPES}


def classify(items: Sequence[Any]) -> tuple[Literal["array", "list"], str | None]:
    """The field kind and dtype a list implies: ``("array", "int64" | "float64" | "bool")``,
    ``("array", None)`` for an empty list, or ``("list", "str" | "bytes")``.

    Raises
    ------
    ValueError
        Saying what the list holds and what to do instead; the caller names sample and field.
    """
    if not items:
        return "array", None
    types = set(map(type, items))
    if types <= _BOOL_TYPES:
        return "array", "bool"
    if types <= _INT_TYPES:
        if min(items) >= -_INT_LIMIT and max(items) < _INT_LIMIT:
            return "array", "int64"
        raise ValueError(
            "holds an int that does not fit in 64 bits; store such numbers as str, or as a "
            "numpy array of a type that holds them"
        )
    if types <= _FLOAT_TYPES:
        if all(-_EXACT <= x <= _EXACT for x in items if type(x) in _INT_TYPES):
            return "array", "float64"
        raise ValueError(
            "mixes floats with an int beyond 2**53, which float64 cannot hold exactly; make "
            "the list all int, or convert it yourself (np.array(items, dtype=np.float64))"
        )
    if types == _STR_TYPES:
        return "list", "str"
    if types == _BYTES_TYPES:
        return "list", "bytes"
    raise ValueError(_refusal(types))


def _refusal(types: set[type]) -> str:
    if types & {list, tuple}:
        return (
            "holds nested lists; a list is a 1-D array: yield a numpy array (np.array(...)) "
            "for an array of more than one dimension"
        )
    if type(None) in types:
        return (
            "holds None; list items may not be None: use float('nan') in a list of floats, "
            "or make the whole field None"
        )
    found = ", ".join(sorted(t.__name__ for t in types))
    return (
        f"holds {found}; a list must hold only int, only float (ints allowed among them), only "
        "bool, only str or only bytes. Convert its items, or yield a numpy array"
    )


def list_check(kind: str, dtype: str | None) -> Callable[[Any], bool]:
    """A cheap predicate: does a list (or tuple) fit a field of ``kind`` and ``dtype``, a
    varying 1-D array field or a list field? No messages: :func:`classify` explains refusals."""
    if kind == "list":
        allowed = _OBJECT_TYPES[str(dtype)]
        return lambda v: set(map(type, v)) <= allowed
    if dtype == "int64":
        return lambda v: (
            not v
            or (set(map(type, v)) <= _INT_TYPES and min(v) >= -_INT_LIMIT and max(v) < _INT_LIMIT)
        )
    if dtype == "float64":
        return _float_check
    if dtype == "bool":
        return lambda v: set(map(type, v)) <= _BOOL_TYPES
    return lambda v: not v  # an array field of another dtype: only an empty list fits


def _float_check(v: Any) -> bool:
    if not v:
        return True
    types = set(map(type, v))
    if not types <= _FLOAT_TYPES:
        return False
    # min/max compare floats too: a float beyond 2**53 (or a nan) only sends it to the slow check
    return types.isdisjoint(_INT_TYPES) or (min(v) >= -_EXACT and max(v) <= _EXACT)


def fits_exactly(items: Sequence[Any], dtype: str) -> bool:
    """Whether every item of a list of numbers keeps its value as ``dtype`` (ints in float64)."""
    if dtype != "float64":
        return True
    return all(-_EXACT <= x <= _EXACT for x in items if type(x) in _INT_TYPES)


def flatten(
    values: Sequence[Any], dtype: np.dtype[Any]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Sizes and flat values of a column whose rows are all lists (or tuples) of numbers, in one
    C-level pass each (the rows are checked: their items fit ``dtype``)."""
    sizes = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    total = int(sizes.sum())
    flat = np.fromiter(itertools.chain.from_iterable(values), dtype=dtype, count=total)
    return sizes, flat
