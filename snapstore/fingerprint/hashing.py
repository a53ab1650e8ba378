"""Hashing primitives that the code identity (:mod:`snapstore.fingerprint.codeid`) and the value
hasher (:mod:`snapstore.fingerprint.digest`) share: what a hash is fed through (:class:`Sink`), one
self-delimiting item (:func:`feed_item`), the error that makes a value unhashable, and the names and
underlying functions of callables.

The bottom of the fingerprint layer: it imports only :mod:`snapstore.fingerprint.importname`.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Protocol

import numpy as np

from ..oldpaths import historic_name
from .importname import module_name

__all__ = [
    "BUILTIN_CALLABLES",
    "Buffer",
    "Sink",
    "Unhashable",
    "callable_name",
    "feed_item",
    "is_callable_object",
    "is_code",
    "qualname_of",
    "underlying_function",
]

BUILTIN_CALLABLES = (
    types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
    types.MethodWrapperType, types.ClassMethodDescriptorType, np.ufunc,
)  # fmt: skip
_CODE_TYPES = (functools.partial, types.MethodType, types.FunctionType, *BUILTIN_CALLABLES)

Buffer = bytes | bytearray | memoryview


class Sink(Protocol):
    def update(self, data: Buffer, /) -> None: ...


class Unhashable(Exception):
    """Internal: the reason, path segments, and where code read it (``context``, ``hint``)."""

    def __init__(self, found: str, reason: str) -> None:
        super().__init__(reason)
        self.found, self.reason = found, reason
        self.segments: list[str] = []
        self.context: str | None = None
        self.hint: str | None = None


def feed_item(h: Sink, tag: bytes, payload: Buffer = b"") -> None:
    """Feed one self-delimiting item: tag length, tag, payload length, payload."""
    h.update(len(tag).to_bytes(1, "big") + tag + len(payload).to_bytes(8, "big"))
    h.update(payload)


def qualname_of(obj: Any) -> str:
    """``module.qualname`` of a class or function (``builtins.`` left out)."""
    module = getattr(obj, "__module__", None) or getattr(
        getattr(obj, "__objclass__", None), "__module__", None
    )
    name = str(getattr(obj, "__qualname__", None) or getattr(obj, "__name__", repr(obj)))
    if module in (None, "builtins") or not isinstance(module, str):
        return name if module in (None, "builtins") else f"{module}.{name}"
    namespace = obj.__globals__ if isinstance(obj, types.FunctionType) else None
    # snapstore's own names as they were before its subpackages: the layout is not identity
    return historic_name(module_name(module, namespace), name)


def is_code(value: Any) -> bool:
    return isinstance(value, _CODE_TYPES) or callable(getattr(value, "__wrapped__", None))


def callable_name(fn: Any) -> str:
    """The name details and messages use for a stage, key function or partial."""
    if isinstance(fn, functools.partial):
        return callable_name(fn.func)
    if is_code(fn) or isinstance(fn, type):
        return qualname_of(fn)
    return qualname_of(type(fn))


def is_callable_object(value: Any) -> bool:
    return callable(value) and isinstance(type(value).__call__, types.FunctionType)


def underlying_function(fn: Any) -> Any:
    """The Python function whose parameters a call of ``fn`` binds (its defaults are arguments)."""
    if isinstance(fn, functools.partial):
        return underlying_function(fn.func)
    if isinstance(fn, types.MethodType):
        return fn.__func__
    if isinstance(fn, types.FunctionType):
        return fn
    if is_callable_object(fn):
        return type(fn).__call__
    return None
