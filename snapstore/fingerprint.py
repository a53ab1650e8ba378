"""Fingerprints of a stage call: canonical hashing of code and values into named parts.

A fingerprint is sha256 over named parts, each itself a sha256 hex digest (scheme 1)::

    scheme     FINGERPRINT_SCHEME
    code       hash_code(fn): the stage's normalized source (see below)
    arguments  the bound arguments, one digest per name (or hash_value(key(...)))
    format     the on-disk format version
    version    the user's version string, or None

The digest is the first 128 bits of sha256 over the sorted ``(name, part digest)`` pairs, so new
parts (input identity, upstream snapshot, helper code) slot in as more names.

Values are hashed by a typed, length-prefixed encoding fed into sha256: never ``hash()``,
``id()`` or pickle, so the result does not depend on ``PYTHONHASHSEED``, the process, the working
directory or the machine. Dicts and sets are order-independent (entries sorted by digest);
lists and tuples are ordered and distinct; ``1``, ``True`` and ``1.0`` differ; floats hash
through ``float.hex`` (``-0.0`` differs from ``0.0``, nan is stable). Classes and numpy dtypes
hash by qualified name; a value of any other type is a :class:`FingerprintError` that names where
it was found and the ways out, never a silent fallback.

Code identity (scheme 1) is the AST of the function's source without docstrings, decorators,
comments, formatting or positions, so moving or reformatting a file keeps the fingerprint while
any edit to the body, including renaming a local variable, changes it. Without source (REPL,
``exec``) it is the bytecode, names and constants, which is specific to the Python version.
Not yet covered: helpers the stage calls, module globals it reads and values captured in a
closure. Changing any rule here must bump :data:`FINGERPRINT_SCHEME`.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime
import decimal
import enum
import fractions
import functools
import hashlib
import inspect
import pathlib
import reprlib
import textwrap
import types
import uuid
from collections.abc import Callable, Collection
from typing import Any, Protocol

import numpy as np

from .errors import FingerprintError, FormatError

__all__ = [
    "FINGERPRINT_SCHEME",
    "Fingerprint",
    "diff_parts",
    "fingerprint_stage",
    "hash_code",
    "hash_value",
]

FINGERPRINT_SCHEME = 1
_DIGEST_CHARS = 32  # 128 bits: collisions need ~2**64 snapshots
_MAX_DEPTH = 100  # a few stack frames per level stays far below the interpreter's recursion limit
_REPR_CHARS = 80
_PART_ORDER = ("scheme", "code", "arguments", "format", "version")
_TEXT_TYPES = (  # exact types whose str() is canonical; subclasses (pandas Timestamp) are refused
    datetime.date, datetime.datetime, datetime.time, datetime.timedelta,
    decimal.Decimal, fractions.Fraction, uuid.UUID,
)  # fmt: skip
_BUILTIN_CALLABLES = (
    types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
    types.MethodWrapperType, types.ClassMethodDescriptorType, np.ufunc,
)  # fmt: skip
_CODE_TYPES = (functools.partial, types.MethodType, types.FunctionType, *_BUILTIN_CALLABLES)
Buffer = bytes | bytearray | memoryview


class _Sink(Protocol):
    def update(self, data: Buffer, /) -> None: ...


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """The fingerprint of one stage call, with the parts it hashes and their explanation.

    Attributes
    ----------
    digest : str
        32 lowercase hex characters: the first 128 bits of sha256 over the sorted parts.
    parts : dict of str to str
        Part name (``"code"``, ``"arguments"``...) to the full sha256 hex digest of that part.
    details : dict
        JSON-able explanation: stage name, per-argument digests and short reprs, ignored
        arguments, key function, version, format version and scheme.
    """

    digest: str
    parts: dict[str, str]
    details: dict[str, Any]

    def __hash__(self) -> int:
        return hash(self.digest)

    def __str__(self) -> str:
        return self.digest

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict that :meth:`from_json` turns back into an equal fingerprint."""
        return {"digest": self.digest, "parts": dict(self.parts), "details": dict(self.details)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fingerprint:
        """Rebuild a fingerprint stored by :meth:`to_json`.

        Raises
        ------
        FormatError
            If fields are missing or, for the current scheme, the digest does not match the parts.
        """
        digest, parts, details = data.get("digest"), data.get("parts"), data.get("details", {})
        if not (isinstance(digest, str) and isinstance(parts, dict) and isinstance(details, dict)):
            raise FormatError(
                f"expected a fingerprint record with 'digest', 'parts' and 'details'; found "
                f"keys {sorted(data)}. The manifest is corrupt or not written by snapstore."
            )
        if details.get("scheme") == FINGERPRINT_SCHEME and _combine(parts) != digest:
            raise FormatError(
                f"fingerprint {digest} does not match its parts (they give {_combine(parts)}); "
                "the record is corrupt. Remove the snapshot and write it again."
            )
        return cls(digest, dict(parts), dict(details))


class _Unhashable(Exception):
    """Internal: carries the reason up while each level adds its path segment."""

    def __init__(self, found: str, reason: str) -> None:
        super().__init__(reason)
        self.found, self.reason = found, reason
        self.segments: list[str] = []


def _frame(h: _Sink, tag: bytes, payload: Buffer = b"") -> None:
    """Feed one self-delimiting item: tag length, tag, payload length, payload."""
    h.update(len(tag).to_bytes(1, "big") + tag + len(payload).to_bytes(8, "big"))
    h.update(payload)


def _int_bytes(value: int) -> bytes:
    return int.to_bytes(value, (value.bit_length() + 8) // 8, "big", signed=True)


_SCALARS: dict[type, tuple[bytes, Callable[[Any], Buffer]]] = {
    type(None): (b"none", lambda v: b""),
    type(...): (b"ellipsis", lambda v: b""),
    bool: (b"bool", lambda v: b"\x01" if v else b"\x00"),
    int: (b"int", _int_bytes),
    float: (b"float", lambda v: float.hex(v).encode()),
    complex: (b"complex", lambda v: f"{float.hex(v.real)},{float.hex(v.imag)}".encode()),
    str: (b"str", lambda v: str.encode(v, "utf-8", "surrogatepass")),
    bytes: (b"bytes", lambda v: v),
    bytearray: (b"bytearray", lambda v: v),
}


def _qualname(obj: Any) -> str:
    """``module.qualname`` of a class or function (``builtins.`` left out)."""
    module = getattr(obj, "__module__", None) or getattr(
        getattr(obj, "__objclass__", None), "__module__", None
    )
    name = str(getattr(obj, "__qualname__", None) or getattr(obj, "__name__", repr(obj)))
    return name if module in (None, "builtins") else f"{module}.{name}"


def _dtype_text(dtype: np.dtype[Any]) -> str:
    return dtype.str if dtype.fields is None else repr(dtype.descr)


def _segment(kind: str, key: Any) -> str:
    """One step of an error path: ``[3]``, ``['name']``, ``.field``, ``key 'x'``, ``{'x'}``."""
    if kind == "index":
        return f"[{key}]"
    if kind == "attr":
        return f".{key}"
    text = _short_repr(key)
    return {"key": f"[{text}]", "dictkey": f"key {text}"}.get(kind, f"{{{text}}}")


class _Hasher:
    """One hashing walk: tracks the containers being visited to refuse reference cycles."""

    def __init__(self) -> None:
        self._active: set[int] = set()  # id() only detects cycles; it never reaches a digest

    def digest(self, value: Any, depth: int, kind: str, key: Any) -> bytes:
        h = hashlib.sha256()
        self.child(h, value, depth, kind, key)
        return h.digest()

    def child(self, h: _Sink, value: Any, depth: int, kind: str, key: Any) -> None:
        try:
            self.encode(h, value, depth)
        except _Unhashable as exc:
            exc.segments.append(_segment(kind, key))
            raise

    def encode(self, h: _Sink, value: Any, depth: int = 0) -> None:
        cls = type(value)
        scalar = _SCALARS.get(cls)
        if scalar is not None:
            _frame(h, scalar[0], scalar[1](value))
            return
        if depth >= _MAX_DEPTH:
            raise _Unhashable(_qualname(cls), f"values nested deeper than {_MAX_DEPTH} levels")
        if id(value) in self._active:
            raise _Unhashable(_qualname(cls), "a reference cycle: the value contains itself")
        self._active.add(id(value))
        try:
            self._compound(h, value, cls, depth + 1)
        finally:
            self._active.discard(id(value))

    def _compound(self, h: _Sink, value: Any, cls: type, depth: int) -> None:
        if getattr(cls, "__snapstore_key__", None) is not None and not isinstance(value, type):
            _frame(h, b"key", _qualname(cls).encode())
            self.child(h, value.__snapstore_key__(), depth, "attr", "__snapstore_key__()")
        elif cls is np.ndarray or cls is np.memmap:
            if value.dtype.hasobject:
                raise _Unhashable(f"numpy array of dtype {value.dtype}", "objects have no bytes")
            shape = ",".join(map(str, value.shape))
            _frame(h, b"ndarray", f"{_dtype_text(value.dtype)}|{shape}".encode())
            flat = np.ascontiguousarray(value).reshape(-1).view(np.uint8)  # no copy if contiguous
            _frame(h, b"data", flat.data)
        elif isinstance(value, np.generic) and not value.dtype.hasobject:
            _frame(h, b"npscalar", _dtype_text(value.dtype).encode())
            _frame(h, b"data", value.tobytes())
        elif isinstance(value, enum.Enum):
            _frame(h, b"enum", f"{_qualname(cls)}.{value.name}".encode())
        elif isinstance(value, type):
            _frame(h, b"type", _qualname(value).encode())
        elif isinstance(value, np.dtype):
            _frame(h, b"dtype", _dtype_text(value).encode())
        elif callable(value) and (_is_code(value) or _is_callable_object(value)):
            _frame(h, b"code")
            self.code(h, value, depth)
        elif dataclasses.is_dataclass(value):
            self._fields(h, value, depth)
        elif isinstance(value, pathlib.PurePath):
            _frame(h, b"path", f"{cls.__name__}:{value.as_posix()}".encode())
        elif cls is range:
            _frame(h, b"range", f"{value.start}:{value.stop}:{value.step}".encode())
        elif cls is slice:
            _frame(h, b"slice")
            for name in ("start", "stop", "step"):
                self.child(h, getattr(value, name), depth, "attr", name)
        elif cls in _TEXT_TYPES:
            _frame(h, b"text", f"{_qualname(cls)}:{value}".encode())
        elif cls is memoryview:
            _frame(h, b"memoryview", f"{value.format}|{value.shape}".encode())
            _frame(h, b"data", value.tobytes())
        elif isinstance(value, tuple) and hasattr(cls, "_fields"):
            _frame(h, b"namedtuple", f"{_qualname(cls)}|{len(value)}".encode())
            for name, item in zip(cls._fields, value, strict=True):
                _frame(h, b"field", name.encode())
                self.child(h, item, depth, "attr", name)
        elif isinstance(value, (list, tuple, dict, set, frozenset, *_SCALARS)):
            self._builtin(h, value, cls, depth)
        else:
            raise _Unhashable(_qualname(cls), "no deterministic hash is defined for this type")

    def _builtin(self, h: _Sink, value: Any, cls: type, depth: int) -> None:
        base = next(
            b for b in (list, tuple, dict, set, frozenset, *_SCALARS) if isinstance(value, b)
        )
        if cls is not base:  # a subclass: its name matters, and so does any state it carries
            _frame(h, b"subclass", _qualname(cls).encode())
            extra = getattr(value, "__dict__", None)
            if extra:
                self.child(h, extra, depth, "attr", "__dict__")
        if base in _SCALARS:
            _frame(h, _SCALARS[base][0], _SCALARS[base][1](value))
        elif base in (list, tuple):
            _frame(h, base.__name__.encode(), len(value).to_bytes(8, "big"))
            for i, item in enumerate(value):
                self.child(h, item, depth, "index", i)
        elif base is dict:
            entries = sorted(
                (self.digest(k, depth, "dictkey", k), self.digest(v, depth, "key", k))
                for k, v in value.items()
            )
            _frame(h, b"dict", b"".join(k + v for k, v in entries))
        else:
            items = sorted(self.digest(item, depth, "elem", item) for item in value)
            _frame(h, base.__name__.encode(), b"".join(items))

    def _fields(self, h: _Sink, value: Any, depth: int) -> None:
        _frame(h, b"dataclass", _qualname(type(value)).encode())
        for field in dataclasses.fields(value):
            _frame(h, b"field", field.name.encode())
            self.child(h, getattr(value, field.name), depth, "attr", field.name)

    def code(self, h: _Sink, fn: Any, depth: int) -> None:
        """Feed the code identity of a callable (the one place that decides it)."""
        if isinstance(fn, functools.partial):
            _frame(h, b"partial")
            self.child(h, fn.func, depth, "attr", "func")
            self.child(h, fn.args, depth, "attr", "args")
            self.child(h, fn.keywords, depth, "attr", "keywords")
        elif isinstance(fn, types.MethodType):
            _frame(h, b"method")
            self.code(h, fn.__func__, depth)
            self.child(h, fn.__self__, depth, "attr", "__self__")
        elif isinstance(fn, types.FunctionType):
            source = _source_identity(fn)
            if source is not None:
                _frame(h, b"source", source.encode())
            else:
                _frame(h, b"bytecode", _bytecode_identity(fn.__code__))
        elif isinstance(fn, _BUILTIN_CALLABLES):
            _frame(h, b"builtin", _qualname(fn).encode())
            owner = getattr(fn, "__self__", None)
            if owner is not None and not isinstance(owner, types.ModuleType):
                self.child(h, owner, depth, "attr", "__self__")
        elif isinstance(fn, type):
            _frame(h, b"class", _qualname(fn).encode())
        elif _is_callable_object(fn):
            _frame(h, b"callable", _qualname(type(fn)).encode())
            self.code(h, type(fn).__call__, depth)
            if getattr(type(fn), "__snapstore_key__", None) is not None:
                self.child(h, fn.__snapstore_key__(), depth, "attr", "__snapstore_key__()")
            elif dataclasses.is_dataclass(fn):
                self._fields(h, fn, depth)
            elif isinstance(getattr(fn, "__dict__", None), dict):
                self.child(h, vars(fn), depth, "attr", "__dict__")
            else:
                raise _Unhashable(_qualname(type(fn)), "a callable object without a __dict__")
        else:
            raise _Unhashable(_qualname(type(fn)), "not a function this scheme can hash")


def _is_code(value: Any) -> bool:
    return isinstance(value, _CODE_TYPES)


def _callable_name(fn: Any) -> str:
    """The name details and messages use for a stage, key function or partial."""
    if isinstance(fn, functools.partial):
        return _callable_name(fn.func)
    if _is_code(fn) or isinstance(fn, type):
        return _qualname(fn)
    return _qualname(type(fn))


def _is_callable_object(value: Any) -> bool:
    return callable(value) and isinstance(type(value).__call__, types.FunctionType)


def _source_identity(fn: types.FunctionType) -> str | None:
    """The normalized AST of ``fn``'s source, or None when the source cannot be had."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    node: ast.AST
    if fn.__name__ == "<lambda>":  # getsource gives whole lines; find the one lambda on them
        lambdas = [n for n in ast.walk(tree) if isinstance(n, ast.Lambda)]
        if len(lambdas) != 1:
            return None
        node = lambdas[0]
    else:
        first = tree.body[0] if tree.body else None
        if not isinstance(first, (ast.FunctionDef, ast.AsyncFunctionDef)) or first.name != (
            fn.__name__
        ):
            return None
        first.decorator_list = []  # @snapshot(...) and friends must not matter
        node = first
    for inner in ast.walk(node):
        if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            head = inner.body[0] if inner.body else None
            if isinstance(head, ast.Expr) and isinstance(getattr(head.value, "value", 0), str):
                inner.body = inner.body[1:] or [ast.Pass()]
    return _ast_text(node)


def _ast_text(node: Any) -> str:
    """Like ``ast.dump`` without positions, but fields that are None or [] are left out.

    ``ast.dump`` itself differs between Python versions (3.12 added ``type_params=[]``, 3.13
    omits empty fields), which would change every fingerprint with the interpreter.
    """
    if isinstance(node, ast.AST):
        kept = [(k, v) for k, v in ast.iter_fields(node) if v is not None and v != []]
        return f"{type(node).__name__}({', '.join(f'{k}={_ast_text(v)}' for k, v in kept)})"
    if isinstance(node, list):
        return f"[{', '.join(_ast_text(item) for item in node)}]"
    return repr(node)


def _bytecode_identity(code: types.CodeType) -> bytes:
    """Digest of bytecode, names and constants; specific to the Python version."""
    h = hashlib.sha256()
    _frame(h, b"co_code", code.co_code)
    for name in ("co_names", "co_varnames", "co_freevars", "co_cellvars"):
        _frame(h, name.encode(), "\0".join(getattr(code, name)).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _frame(h, b"const_code", _bytecode_identity(const))
        else:
            _Hasher().encode(h, const)
    return h.digest()


def _explain(where: str, exc: _Unhashable, argument: str | None) -> FingerprintError:
    steps = exc.segments[::-1]
    if len(steps) > 12:  # a path 100 levels deep says no more than its two ends
        steps = [*steps[:6], "...", *steps[-6:]]
    path = " -> ".join([where, *steps])
    ignore = f'ignore=["{argument}"]' if argument else "ignore=[<the argument>]"
    return FingerprintError(
        f"cannot fingerprint {path}: found {exc.found} ({exc.reason}). Expected plain data "
        "(None, bool, int, float, str, bytes, list, tuple, dict, set, numpy array, dataclass, "
        'Enum, path, function). Ways out: pass version="..." together with '
        f"{ignore} to snapshot() (and bump the version by hand when it changes the data); "
        "pass key= to snapshot(), a function of the stage's arguments returning plain data "
        "that identifies them; or define __snapstore_key__(self) on the class, returning "
        "plain data that identifies the object."
    )


def _hash(value: Any, where: str, argument: str | None = None) -> str:
    h = hashlib.sha256()
    try:
        _Hasher().encode(h, value)
    except _Unhashable as exc:
        raise _explain(where, exc, argument) from None
    return h.hexdigest()


def hash_value(value: Any, where: str = "value") -> str:
    """The sha256 hex digest of ``value``'s canonical typed encoding.

    Parameters
    ----------
    value : object
        Plain data (see the module docstring for the supported types).
    where : str
        How to name ``value`` in an error message, e.g. ``"argument 'cfg'"``.

    Returns
    -------
    str
        64 lowercase hex characters, equal in every process and on every machine.

    Raises
    ------
    FingerprintError
        If ``value`` holds something without a deterministic hash, or a reference cycle; the
        message gives the path to it and the ways out.

    Examples
    --------
    >>> hash_value({"a": 1, "b": 2}) == hash_value({"b": 2, "a": 1})
    True
    >>> hash_value([1]) == hash_value((1,))
    False
    """
    return _hash(value, where)


def hash_code(fn: Callable[..., Any]) -> str:
    """The sha256 hex digest of a callable's code identity.

    Python functions hash by their normalized source AST (bytecode when there is no source);
    ``functools.partial`` by its function and bound arguments; bound methods by the function
    and ``__self__``; callable objects by class, ``__call__`` and state; builtins by name.

    Raises
    ------
    FingerprintError
        If part of the callable (a bound ``__self__``, a partial's arguments) cannot be hashed.

    Examples
    --------
    >>> hash_code(len) == hash_code(len)
    True
    """
    h = hashlib.sha256()
    try:
        _Hasher().code(h, fn, 0)
    except _Unhashable as exc:
        raise _explain(f"code of {_callable_name(fn)}", exc, None) from None
    return h.hexdigest()


def _short_repr(value: Any) -> str:
    text = _REPR.repr(value)
    return text if len(text) <= _REPR_CHARS else text[: _REPR_CHARS - 3] + "..."


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR_CHARS


def _combine(parts: dict[str, str]) -> str:
    h = hashlib.sha256()
    _frame(h, b"snapstore-fingerprint")
    for name in sorted(parts):
        _frame(h, b"part", name.encode())
        _frame(h, b"digest", parts[name].encode())
    return h.hexdigest()[:_DIGEST_CHARS]


def _bind_arguments(
    fn: Callable[..., Any],
    name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    ignore: Collection[str],
) -> dict[str, Any]:
    """The call's arguments by parameter name, defaults applied, ignored names left out."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"cannot read the signature of {name}: {exc}") from exc
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{name}{sig} cannot be called with these arguments: {exc}") from exc
    bound.apply_defaults()
    var_kw = next((p.name for p in sig.parameters.values() if p.kind is p.VAR_KEYWORD), None)
    unknown = sorted(n for n in ignore if n not in sig.parameters)
    if unknown and var_kw is None:
        raise TypeError(f"ignore= names {unknown}, which are not parameters of {name}{sig}")
    values = {n: v for n, v in bound.arguments.items() if n not in ignore}
    if var_kw in values:  # ignore= may also name keywords caught by **kwargs
        values[var_kw] = {k: v for k, v in values[var_kw].items() if k not in ignore}
    return values


def fingerprint_stage(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    format_version: int,
    version: str | None = None,
    key: Callable[..., Any] | None = None,
    ignore: Collection[str] = (),
) -> Fingerprint:
    """The fingerprint of calling ``fn(*args, **kwargs)``.

    Parameters
    ----------
    fn : callable
        The stage (undecorated).
    args, kwargs
        The call's arguments; bound to ``fn``'s signature with defaults applied, so
        ``f(x)`` and ``f(x, n=DEFAULT)`` fingerprint equally.
    format_version : int
        The on-disk format version.
    version : str, optional
        The user's version, folded in as its own part.
    key : callable, optional
        ``key(*args, **kwargs)`` is hashed instead of the arguments.
    ignore : collection of str
        Argument names (or keywords caught by ``**kwargs``) left out; recorded in details.

    Returns
    -------
    Fingerprint

    Raises
    ------
    TypeError
        If the arguments do not fit ``fn``'s signature, or ``ignore`` names no parameter.
    FingerprintError
        If an argument or the code cannot be hashed; the message says where and how to fix it.
    """
    name = _callable_name(fn)
    values = _bind_arguments(fn, name, args, kwargs, ignore)
    digests: dict[str, str] = {}
    if key is None:
        for arg, value in values.items():
            digests[arg] = _hash(value, f"argument {arg!r}", argument=arg)
        arguments = hash_value(digests, "argument digests")
    else:
        arguments = hash_value(key(*args, **kwargs), f"key(...) of {name}")
    parts = {
        "scheme": hash_value(FINGERPRINT_SCHEME),
        "code": hash_code(fn),
        "arguments": arguments,
        "format": hash_value(format_version),
        "version": hash_value(version),
    }
    details: dict[str, Any] = {
        "stage": name,
        "arguments": digests,
        "argument_values": {arg: _short_repr(value) for arg, value in values.items()},
        "ignored": sorted(ignore),
        "key": None if key is None else _callable_name(key),
        "version": version,
        "format_version": format_version,
        "scheme": FINGERPRINT_SCHEME,
    }
    return Fingerprint(_combine(parts), parts, details)


def _argument_changes(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    if a.get("key") or b.get("key"):
        return [f"arguments changed (as identified by key function {b.get('key')!r})"]
    old, new = a.get("arguments", {}), b.get("arguments", {})
    old_values, new_values = a.get("argument_values", {}), b.get("argument_values", {})
    out = []
    for arg in sorted(set(old) | set(new)):
        if arg not in new:
            now_ignored = arg in b.get("ignored", ())
            out.append(f"argument {arg!r} {'is now ignored' if now_ignored else 'removed'}")
        elif arg not in old:
            was_ignored = arg in a.get("ignored", ())
            out.append(f"argument {arg!r} {'is no longer ignored' if was_ignored else 'added'}")
        elif old[arg] != new[arg]:
            before, after = old_values.get(arg), new_values.get(arg)
            change = f" ({before} -> {after})" if before != after else ""
            out.append(f"argument {arg!r} changed{change}")
    return out or ["arguments changed"]


def diff_parts(a: Fingerprint, b: Fingerprint) -> list[str]:
    """Sentences saying why ``b`` differs from ``a``, part by part and argument by argument.

    Returns
    -------
    list of str
        Empty when every part is equal, e.g. ``["argument 'max_len' changed (512 -> 1024)"]``.

    Examples
    --------
    >>> def f(n=1):
    ...     yield n
    >>> diff_parts(fingerprint_stage(f, (), {}, format_version=1),
    ...            fingerprint_stage(f, (2,), {}, format_version=1))
    ["argument 'n' changed (1 -> 2)"]
    """
    da, db = a.details, b.details
    known = [p for p in _PART_ORDER if p in a.parts or p in b.parts]
    out: list[str] = []
    for part in known + sorted((set(a.parts) | set(b.parts)) - set(_PART_ORDER)):
        old, new = a.parts.get(part), b.parts.get(part)
        if old == new:
            continue
        if old is None or new is None:
            out.append(f"part {part!r} {'added' if old is None else 'removed'}")
        elif part == "code":
            out.append(f"code of stage {db.get('stage')!r} changed")
        elif part == "arguments":
            out.extend(_argument_changes(da, db))
        elif part == "format":
            before, after = da.get("format_version"), db.get("format_version")
            out.append(f"format version changed ({before} -> {after})")
        elif part == "version":
            out.append(f"version changed ({da.get('version')!r} -> {db.get('version')!r})")
        elif part == "scheme":
            out.append(f"fingerprint scheme changed ({da.get('scheme')} -> {db.get('scheme')})")
        else:
            out.append(f"part {part!r} changed")
    return out
