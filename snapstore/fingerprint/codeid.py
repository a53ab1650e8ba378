"""Code identity: what a stage's code is, transitively through the user's own modules.

A :class:`CodeWalk` starts at the stage and visits, once each, every function and class of the
*user's* code it reaches, giving each a digest keyed by ``module.qualname`` (the module name as
imported: ``helpers``, ``pkg.helpers``; a script run as ``python prep.py`` or ``python -m prep``
is named as ``import prep`` names it, see :mod:`snapstore.fingerprint.importname`; code with no
file keeps ``__main__``). Library code is not read: it is named, and its distribution and version
are recorded. The code part hashes the stage's identity, every ``key -> digest`` and every ``package
-> version``.

A function's identity covers:

- its source as a normalized AST without docstrings, decorators, comments, formatting or
  positions: moving, reformatting or commenting keeps it; any edit to the code, renaming a local
  variable included, changes it. Nested functions, lambdas and comprehensions are part of the
  enclosing source. Without source (a plain REPL, ``exec``) it is the bytecode, names and
  constants, with a logged warning: that is specific to the Python version. Jupyter and IPython
  keep cell sources, which are hashed like files;
- its default values (not the stage's own: those are arguments) and closure cell contents (a
  module in a cell, from ``import numpy as np`` in the enclosing function, is identified as a
  module read as a global is: named, with its package, and followed along the chains the code
  reads when it is the user's);
- every name it reads, found in its bytecode (globals and the attribute chains after them, e.g.
  ``helpers.normalize``; imports inside the function): user functions and classes are visited in
  turn; library functions, classes and modules are named; user modules are followed along the
  chains the code uses; loggers and typing constructs are named; builtins are named (no Python
  version); anything else is hashed by value, and a value without a deterministic hash is an
  error naming the global and the function that reads it.

A class's identity covers its bases, metaclass, dataclass fields and options, enum members, and
its body: methods (visited as functions), properties, static and class methods, class-level
values (by value). What dataclass, enum, namedtuple or Protocol machinery adds is left out (its
inputs decide it), and standard-library bases are named without the Python version.

State, not input: a global or closure variable the code rebinds (``global X; X = ...``,
``module.X = ...``, ``nonlocal``), and a builtin container (list, dict, set, bytearray, deque) the
code mutates in place (``X.append``, ``X[k] = v``...), count by name and type wherever read: their
value at fingerprint time depends on how often the stage ran (call logs, memo caches).

User or library code is decided by the module's file: inside ``sys.prefix``,
``sys.base_prefix``, ``sys.exec_prefix``, the standard library, or a ``site-packages`` or
``dist-packages`` directory is library code, and so is ``snapstore``; everything else is the
user's (beside the script, on the working directory or ``PYTHONPATH``, editable installs outside
the environment, ``__main__``, code without a file). Library code is identified by its top-level
distribution and version (``importlib.metadata``; the standard library as ``python`` and
``major.minor``; a module no distribution claims by its name and ``unknown``).

``ignore_globals`` leaves names out (recorded as ignored): a global as written (``LOCK``,
``helpers.LOCK``) or qualified by its module, a closure variable (``lock`` or
``module.function.lock``), a class attribute (``Class.attr`` or ``module.Class.attr``).

Not seen: dynamic lookups (``getattr(module, name)``, ``globals()[name]``). Source is read from
disk: reload a module edited after import in a long-lived session before fingerprinting.
"""

from __future__ import annotations

import ast
import builtins
import collections
import dataclasses
import dis
import enum
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import os
import sys
import sysconfig
import textwrap
import tokenize
import types
from collections.abc import Collection, Iterator
from typing import Any, Protocol

from ..errors import FingerprintError
from ..oldpaths import historic_name
from .hashing import Sink, Unhashable, feed_item, qualname_of
from .importname import module_name, spellings

__all__ = ["CodeWalk", "ValueEncoder", "package_of"]

log = logging.getLogger(historic_name(__name__))

_MAX_CODE_DEPTH = 100  # helpers calling helpers this deep are a library mistaken for user code
_MAX_CODE_OBJECTS = 10_000
_BUILTINS = "builtins"  # the package "name" of builtins: named, never versioned
_STDLIB = "python"
_MUTABLE = (list, dict, set, bytearray, collections.deque)
_MUTATORS = frozenset(
    {"append", "extend", "insert", "remove", "pop", "popitem", "clear", "update", "setdefault",
     "add", "discard", "difference_update", "intersection_update", "appendleft", "extendleft",
     "symmetric_difference_update", "rotate", "sort", "reverse"}
)  # fmt: skip
_SIMPLE_LOADS = frozenset(
    {"LOAD_FAST", "LOAD_CONST", "LOAD_DEREF", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_FAST_CHECK",
     "LOAD_SMALL_INT", "LOAD_FAST_BORROW"}
)  # fmt: skip
_CLASS_SKIP = frozenset(
    {"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__annotations__",
     "__firstlineno__", "__static_attributes__", "__orig_bases__", "__parameters__",
     "__abstractmethods__", "_abc_impl", "__dataclass_fields__", "__dataclass_params__",
     "__match_args__", "__annotate__", "__annotate_func__", "__annotations_cache__",
     "__type_params__", "__protocol_attrs__", "__non_callable_proto_members__", "_is_protocol",
     "_is_runtime_protocol", "__callable_proto_members_only__", "__slotnames__"}
)  # fmt: skip
_GENERATED = frozenset(
    {"__init__", "__repr__", "__eq__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__",
     "__setattr__", "__delattr__", "__getstate__", "__setstate__", "__replace__", "__new__"}
)  # fmt: skip
_DATACLASS_OPTIONS = ("init", "repr", "eq", "order", "unsafe_hash", "frozen")
_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
_NO_SOURCE = (
    "no source for %s (defined in an interactive session or by exec): it is fingerprinted by "
    "its bytecode, which is specific to Python %s; another version will not reuse its snapshots"
)
_TUPLE_FIELD = type(vars(collections.namedtuple("_", "a"))["a"])
_SLOTS = (types.MemberDescriptorType, types.GetSetDescriptorType, _TUPLE_FIELD)  # generated
_WARNED: set[str] = set()
_MISSING = object()


def _function_key(fn: types.FunctionType) -> str:
    """``module.qualname`` from the code itself: a functools.wraps wrapper keeps its own name."""
    module = fn.__globals__.get("__name__")
    name = fn.__code__.co_qualname
    return f"{module_name(module, fn.__globals__)}.{name}" if isinstance(module, str) else name


# -- user code or library code --------------------------------------------------------------


@functools.cache
def _library_roots() -> tuple[str, ...]:
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.update(sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib"))
    roots = {
        os.path.normcase(f(p)) for p in paths if p for f in (os.path.abspath, os.path.realpath)
    }
    return tuple(sorted(r for r in roots if os.path.dirname(r) != r))  # never a filesystem root


@functools.lru_cache(maxsize=4096)
def _is_library_file(file: str) -> bool:
    forms = {os.path.normcase(f(file)) for f in (os.path.abspath, os.path.realpath)}
    return any(
        {"site-packages", "dist-packages"} & set(form.split(os.sep))
        or any(form.startswith(root + os.sep) for root in _library_roots())
        for form in forms
    )


def _classify(module: str | None, file: str | None, python_code: bool) -> str | None:
    """The top-level import name of library code, or None for user code."""
    top = (module or "").partition(".")[0]
    if top == "snapstore" or module == _BUILTINS:
        return top
    if file:
        return (top or _STDLIB) if _is_library_file(file) else None
    if not module or module == "__main__":
        return None
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return top
    return None if python_code else top  # a Python function without a file is hashed: safe


def package_of(obj: Any) -> str | None:
    """Where ``obj`` (function, class, module, builtin) comes from: None for user code."""
    if isinstance(obj, types.ModuleType):
        file = getattr(obj, "__file__", None) or next(iter(getattr(obj, "__path__", [])), None)
        return _classify(obj.__name__, file, python_code=True)
    if isinstance(obj, types.FunctionType):
        file = obj.__globals__.get("__file__")
        name = obj.__globals__.get("__name__", obj.__module__)
        return _classify(name if isinstance(name, str) else None, file, python_code=True)
    module = getattr(obj, "__module__", None)
    if not isinstance(module, str) and not isinstance(obj, type):
        module = type(getattr(obj, "__self__", None) or obj).__module__  # a builtin method
    if not isinstance(module, str):
        return None
    home = sys.modules.get(module)
    if isinstance(obj, type) and home is not None and vars(home).get(obj.__name__) is obj:
        return package_of(home)
    if isinstance(obj, type):  # local, or its module is not imported: a method's globals tell
        for value in vars(obj).values():
            if isinstance(value, types.FunctionType) and value.__module__ == module:
                return package_of(value)
    file = getattr(sys.modules.get(module), "__file__", None)
    return _classify(module, file, python_code=isinstance(obj, type))


def _distributions(top: str) -> dict[str, str]:
    """Distribution name -> version for a top-level import name."""
    if top == _STDLIB or top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return {_STDLIB: _PYTHON}
    named = _version(top) is not None  # the usual case: the distribution is named as imported
    dists = [top] if named else sorted(set(_packages_distributions().get(top, ())))
    return {dist: _version(dist) or "unknown" for dist in dists} or {top: "unknown"}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


_packages_distributions = functools.cache(importlib.metadata.packages_distributions)


# -- source, bytecode and the names code reads ----------------------------------------------


def _source_identity(fn: types.FunctionType) -> str | None:
    """The normalized AST of ``fn``'s source, or None when the source cannot be had.

    The source is found from the code object, so a ``functools.wraps`` wrapper is its own
    source, not the wrapped function's.
    """
    code = fn.__code__
    try:
        if code.co_name == "<lambda>":
            return _lambda_identity(code)
        lines, _ = inspect.getsourcelines(code)
        head = ast.parse(textwrap.dedent("".join(lines))).body[0]
    except (OSError, TypeError, SyntaxError, tokenize.TokenError, IndexError):
        return None
    if not isinstance(head, (ast.FunctionDef, ast.AsyncFunctionDef)) or head.name != code.co_name:
        return None
    head.decorator_list = []  # @snapshot(...) and friends must not matter
    for inner in ast.walk(head):
        if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = inner.body[0] if inner.body else None
            if isinstance(doc, ast.Expr) and isinstance(getattr(doc.value, "value", 0), str):
                inner.body = inner.body[1:] or [ast.Pass()]
    return _ast_text(head)


def _lambda_identity(code: types.CodeType) -> str | None:
    """A lambda's AST, found in its whole file (or cell) by where its body's code starts.

    Its lines alone may not parse (a call over several lines) or hold several lambdas.
    """
    lines, _ = inspect.findsource(code)
    tree = _parse_file("".join(lines))
    starts = {(p[0], p[2]) for p in code.co_positions() if p[0] is not None}
    found = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Lambda) and (node.body.lineno, node.body.col_offset) in starts
    ]
    return _ast_text(found[0]) if len(found) == 1 else None


@functools.lru_cache(maxsize=32)
def _parse_file(text: str) -> ast.Module:
    return ast.parse(text)  # never mutated: lambdas hold no docstrings or decorators


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


def _const_bytes(const: Any) -> bytes:
    """A canonical encoding of a code constant (frozensets sorted: no hash-seed order)."""
    if isinstance(const, types.CodeType):
        return b"code:" + _bytecode_identity(const)
    if isinstance(const, tuple):
        return b"(" + b",".join(_const_bytes(c) for c in const) + b")"
    if isinstance(const, frozenset):
        return b"{" + b",".join(sorted(_const_bytes(c) for c in const)) + b"}"
    if isinstance(const, float):
        return b"float:" + float.hex(const).encode()
    if isinstance(const, complex):
        return f"complex:{float.hex(const.real)},{float.hex(const.imag)}".encode()
    return f"{type(const).__name__}:{const!r}".encode("utf-8", "surrogatepass")


def _bytecode_identity(code: types.CodeType) -> bytes:
    """Digest of bytecode, names and constants; specific to the Python version."""
    h = hashlib.sha256()
    feed_item(h, b"co_code", code.co_code)
    for name in ("co_names", "co_varnames", "co_freevars", "co_cellvars"):
        feed_item(h, name.encode(), "\0".join(getattr(code, name)).encode())
    for const in code.co_consts:
        feed_item(h, b"const", _const_bytes(const))
    return h.digest()


@dataclasses.dataclass
class _Reads:
    """The names a function's code (nested code included) reads and writes."""

    chains: set[tuple[str, ...]] = dataclasses.field(default_factory=set)
    rebound: set[tuple[str, ...]] = dataclasses.field(default_factory=set)
    mutated: set[tuple[str, ...]] = dataclasses.field(default_factory=set)
    imports: set[tuple[str, int, tuple[str, ...]]] = dataclasses.field(default_factory=set)
    attrs: set[str] = dataclasses.field(default_factory=set)
    cells_rebound: set[str] = dataclasses.field(default_factory=set)  # nonlocal x; x = ...
    cells_mutated: set[str] = dataclasses.field(default_factory=set)  # x.append(...), x[k] = v
    cell_chains: set[tuple[str, ...]] = dataclasses.field(default_factory=set)  # cell.a.b


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _scan(code: types.CodeType) -> _Reads:
    reads = _Reads()
    for co in _code_objects(code):
        ins = list(dis.get_instructions(co))
        for i, inst in enumerate(ins):
            op = inst.opname
            if op in ("LOAD_ATTR", "LOAD_METHOD", "IMPORT_FROM"):
                reads.attrs.add(inst.argval)
            elif op in ("STORE_GLOBAL", "DELETE_GLOBAL"):
                reads.rebound.add((inst.argval,))
            elif op == "IMPORT_NAME":
                level = ins[i - 2].argval if i >= 2 and ins[i - 2].opname == "LOAD_CONST" else 0
                names = ins[i - 1].argval if i >= 1 else None
                fromlist = tuple(names) if isinstance(names, tuple) else ()
                reads.imports.add((inst.argval, int(level or 0), fromlist))
            elif op in ("LOAD_GLOBAL", "LOAD_NAME"):
                chain, rebound, mutated = _chain(ins, i)
                reads.chains.add(chain)
                reads.rebound.update(rebound)
                reads.mutated.update(mutated)
            elif op in ("STORE_DEREF", "DELETE_DEREF") and inst.argval in co.co_freevars:
                reads.cells_rebound.add(inst.argval)
            elif op == "LOAD_DEREF" and inst.argval in co.co_freevars:
                chain, _, mutated = _chain(ins, i)
                reads.cell_chains.add(chain)
                reads.cells_mutated.update(c[0] for c in mutated if len(c) == 1)
    return reads


def _chain(ins: list[dis.Instruction], i: int) -> tuple[tuple[str, ...], set[Any], set[Any]]:
    """The chain ``NAME.a.b`` loaded from instruction ``i``, and which prefixes it writes.

    Returns the chain, the chains it rebinds (``NAME.a.x = ...``) and the chains whose value it
    mutates in place (``NAME.a.append(...)``, ``NAME.a[key] = v`` with a simple key).
    """
    chain = [ins[i].argval]
    j = i + 1
    while j < len(ins) and ins[j].opname in ("LOAD_ATTR", "LOAD_METHOD"):
        chain.append(ins[j].argval)
        j += 1
    rebound, mutated = set(), set()
    after = [inst.opname for inst in ins[j : j + 4]]
    if after[:1] == ["STORE_ATTR"] or after[:1] == ["DELETE_ATTR"]:
        rebound.add((*chain, ins[j].argval))
    if len(chain) > 1 and chain[-1] in _MUTATORS:
        mutated.add(tuple(chain[:-1]))
    augmented = ["COPY", "COPY", "BINARY_SUBSCR"]  # NAME[key] += v
    item_write = after[1:2] in (["STORE_SUBSCR"], ["DELETE_SUBSCR"]) or after[1:4] == augmented
    if after[:1] and after[0] in _SIMPLE_LOADS and item_write:
        mutated.add(tuple(chain))
    return tuple(chain), rebound, mutated


def _is_typing(obj: Any) -> bool:
    kind = type(obj)
    return kind.__module__ in ("typing", "typing_extensions") or isinstance(
        obj, (types.GenericAlias, types.UnionType)
    )


# -- the walk -------------------------------------------------------------------------------


@dataclasses.dataclass
class _Item:
    obj: Any
    key: str
    depth: int
    parent: str | None
    reads: set[tuple[Any, ...]] = dataclasses.field(default_factory=set)


class ValueEncoder(Protocol):
    """What a walk needs of the value hasher (:class:`~snapstore.fingerprint.digest.Hasher`,
    which sets itself as :attr:`CodeWalk.encoder`): hash a value the code reads into ``h``."""

    def encode(self, h: Sink, value: Any) -> None: ...


class CodeWalk:
    """One code-identity walk: every user function and class reached, once each.

    Parameters
    ----------
    ignore_globals : collection of str
        Names the code reads that are left out (see the module docstring).
    skip_defaults : object, optional
        The stage's own function, whose defaults are hashed as arguments instead.
    """

    def __init__(self, ignore_globals: Collection[str] = (), skip_defaults: Any = None) -> None:
        self.ignore = frozenset(ignore_globals)
        self.functions: dict[str, str] = {}
        self.packages: dict[str, str] = {}
        self.encoder: ValueEncoder | None = None  # the value hasher, which sets itself here
        self._skip_defaults = skip_defaults
        self._keys: dict[int, str] = {}
        self._objects: list[Any] = []  # keeps each keyed object alive so no id() is reused
        self._items: dict[str, _Item] = {}
        self._queue: collections.deque[_Item] = collections.deque()
        self._current: _Item | None = None
        self._state: set[tuple[Any, ...]] = set()
        self._imported: set[str] = set()
        self._in_class = False

    def reference(self, obj: Any) -> tuple[bytes, str]:
        """``(b"ref", key)`` for user code (visited in turn), ``(b"ext", name)`` otherwise."""
        top = package_of(obj)
        if top is None:
            return b"ref", self._ref(obj)
        self.note_package(top)
        return b"ext", qualname_of(obj)

    def note_package(self, top: str | None) -> None:
        """Record the distribution and version of a library's top-level import name."""
        if top is None or (self._in_class and (top in sys.stdlib_module_names or top == _STDLIB)):
            return  # Enum, ABC, dataclass machinery: building blocks of a class, named only
        if top != _BUILTINS and top not in self._imported:
            self._imported.add(top)
            self.packages.update(_distributions(top))

    def run(self) -> None:
        """Visit everything referenced so far, and what that references, until done."""
        while self._queue:
            while self._queue:
                self._visit(self._queue.popleft())
            # A value hashed before a later function turned out to write it is state after all.
            self._queue.extend(item for item in self._items.values() if item.reads & self._state)
        self._current = None

    def digest(self, root: bytes, *, packages: bool = True) -> str:
        """The code part: the stage's own identity, every function's and every package's."""
        h = hashlib.sha256()
        feed_item(h, b"snapstore-code", root)
        for key in sorted(self.functions):
            feed_item(h, b"function", key.encode())
            feed_item(h, b"digest", self.functions[key].encode())
        for dist in sorted(self.packages) if packages else ():
            feed_item(h, b"package", dist.encode())
            feed_item(h, b"version", self.packages[dist].encode())
        return h.hexdigest()

    def details(self) -> dict[str, Any]:
        return {
            "functions": {k: self.functions[k][:16] for k in sorted(self.functions)},
            "packages": {k: self.packages[k] for k in sorted(self.packages)},
            "ignored_globals": sorted(self.ignore),
        }

    def _ref(self, obj: Any) -> str:
        key = self._keys.get(id(obj))
        if key is not None:
            return key
        parent = self._current
        depth = parent.depth + 1 if parent else 0
        base = _function_key(obj) if isinstance(obj, types.FunctionType) else qualname_of(obj)
        key, n = base, 2
        while key in self._items:
            key, n = f"{base}#{n}", n + 1
        if depth > _MAX_CODE_DEPTH or len(self._items) >= _MAX_CODE_OBJECTS:
            raise self._too_deep(key, parent, depth)
        self._keys[id(obj)] = key
        self._objects.append(obj)
        item = _Item(obj, key, depth, parent.key if parent else None)
        self._items[key] = item
        self._queue.append(item)
        return key

    def _too_deep(self, key: str, parent: _Item | None, depth: int) -> FingerprintError:
        path = [key]
        while parent is not None:
            path.append(parent.key)
            parent = self._items.get(parent.parent or "")
        shown = " <- ".join(path if len(path) <= 8 else [*path[:3], "...", *path[-3:]])
        what = f"more than {_MAX_CODE_OBJECTS} user functions and classes are reached"
        if depth > _MAX_CODE_DEPTH:
            what = f"helpers call each other more than {_MAX_CODE_DEPTH} levels deep"
        return FingerprintError(
            f"cannot fingerprint the code: {what} ({shown}). This is usually a library treated "
            "as user code because it is not installed in the environment; install it (then it "
            "is identified by its version), or pass ignore_globals=[...] naming the global "
            "that leads into it."
        )

    def _visit(self, item: _Item) -> None:
        self._current = item
        item.reads.clear()
        h = hashlib.sha256()
        self._in_class = isinstance(item.obj, type)  # an error abandons the whole walk
        if self._in_class:
            self._class(h, item.obj, item)
        else:
            self._function(h, item.obj, item)
        self._in_class = False
        self.functions[item.key] = h.hexdigest()

    def _value(self, h: Sink, value: Any, context: str, names: set[str]) -> None:
        """Hash a value the code reads; an error names where it was read."""
        assert self.encoder is not None, "CodeWalk.encoder must be set before run()"
        if names & self.ignore:
            feed_item(h, b"ignored")
            return
        try:
            self.encoder.encode(h, value)
        except Unhashable as exc:
            if exc.context is None:
                exc.context, exc.hint = context, min(names, key=len) if names else None
            raise

    def _function(self, h: Sink, fn: types.FunctionType, item: _Item) -> None:
        source = _source_identity(fn)
        if source is not None:
            feed_item(h, b"source", source.encode())
        else:
            feed_item(h, b"bytecode", _bytecode_identity(fn.__code__))
            if item.key not in _WARNED:
                _WARNED.add(item.key)
                log.warning(_NO_SOURCE, item.key, _PYTHON)
        if fn is not self._skip_defaults:
            where = f"the default values of {item.key}"
            self._value(h, fn.__defaults__, where, {f"{item.key}.__defaults__"})
            self._value(h, fn.__kwdefaults__, where, {f"{item.key}.__kwdefaults__"})
        reads = _scan(fn.__code__)
        self._note_writes(fn, reads)
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            feed_item(h, b"cell", name.encode())
            content = _contents(cell)
            keys = {("cell", id(cell)), ("obj", id(content))}
            if content is _MISSING or keys & self._state:  # not assigned yet, or state
                feed_item(h, b"unread", qualname_of(type(content)).encode())
            elif isinstance(content, types.ModuleType):
                item.reads.update(keys)
                self._module_cell(h, name, content, reads, item)
            else:
                item.reads.update(keys)
                where = f"closure variable {name!r} of {item.key}"
                self._value(h, content, where, {name, f"{item.key}.{name}"})
        entries: dict[str, bytes] = {}
        for chain in sorted(reads.chains):
            self._read_chain(entries, chain, fn.__globals__, item)
        for imported in sorted(reads.imports):
            self._read_import(entries, imported, fn, reads, item)
        for name in sorted(entries):
            feed_item(h, b"global", name.encode())
            feed_item(h, b"identity", entries[name])

    def _module_cell(
        self, h: Sink, name: str, module: types.ModuleType, reads: _Reads, item: _Item
    ) -> None:
        """A module in a closure cell, identified as a module global is (see :meth:`_global`),
        through the chains the code reads from the cell (``np.zeros``, ``helpers.normalize``).

        A cell's value was refused before ("found module"), so this hashing is new and changes
        no fingerprint that could be computed before.
        """
        if {name, f"{item.key}.{name}"} & self.ignore:
            feed_item(h, b"ignored")
            return
        entries: dict[str, bytes] = {}
        chains = {chain for chain in reads.cell_chains if chain[0] == name} or {(name,)}
        for chain in sorted(chains):
            self._read_chain(entries, chain, {name: module}, item)
        feed_item(h, b"module-cell")
        for dotted in sorted(entries):
            feed_item(h, b"global", dotted.encode())
            feed_item(h, b"identity", entries[dotted])

    def _note_writes(self, fn: types.FunctionType, reads: _Reads) -> None:
        """Mark what ``fn`` writes as state: (kind, id) keys, objects kept alive."""
        marks: list[tuple[tuple[Any, ...], Any]] = []
        for chain in reads.rebound | reads.mutated:
            owner, obj = self._resolve(fn.__globals__, chain)
            if owner is not None and chain in reads.rebound:
                marks.append((("bind", id(owner), chain[-1]), owner))
            if isinstance(obj, _MUTABLE) and chain in reads.mutated:
                marks.append((("obj", id(obj)), obj))
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            if name in reads.cells_rebound:
                marks.append((("cell", id(cell)), cell))
            content = _contents(cell) if name in reads.cells_mutated else None
            if isinstance(content, _MUTABLE):
                marks.append((("obj", id(content)), content))
        self._state.update(key for key, _ in marks)
        self._objects.extend(obj for _, obj in marks)

    @staticmethod
    def _resolve(namespace: dict[str, Any], chain: tuple[str, ...]) -> tuple[Any, Any]:
        """The namespace holding the chain's last name (through user modules) and its value."""
        owner, obj = namespace, namespace.get(chain[0], _MISSING)
        for attr in chain[1:]:
            if not isinstance(obj, types.ModuleType) or package_of(obj) is not None:
                return None, _MISSING
            owner, obj = vars(obj), vars(obj).get(attr, _MISSING)
        return owner, obj

    def _read_chain(
        self, entries: dict[str, bytes], chain: tuple[str, ...], namespace: Any, item: _Item
    ) -> None:
        """Identify ``NAME.a.b`` read in ``namespace``, following it through user modules."""
        if chain[0] not in namespace:
            entries[chain[0]] = b"builtin" if chain[0] in vars(builtins) else b"missing"
            return
        obj = namespace[chain[0]]
        for i in range(len(chain)):
            dotted = ".".join(chain[: i + 1])
            if dotted not in entries:
                names = {dotted, *spellings(namespace.get("__name__"), chain[i])}
                keys: set[tuple[Any, ...]] = {("bind", id(namespace), chain[i])}
                if isinstance(obj, _MUTABLE):
                    keys.add(("obj", id(obj)))
                entries[dotted] = self._global(obj, dotted, names, keys, item)
            if i + 1 == len(chain) or not isinstance(obj, types.ModuleType):
                return
            if package_of(obj) is not None:
                return
            namespace, obj = vars(obj), vars(obj).get(chain[i + 1], _MISSING)

    def _global(
        self, obj: Any, dotted: str, names: set[str], keys: set[tuple[Any, ...]], item: _Item
    ) -> bytes:
        """The identity of one value a function reads by name."""
        if obj is _MISSING:
            return b"missing"
        if names & self.ignore:
            return b"ignored"
        if isinstance(obj, types.ModuleType):
            self.note_package(package_of(obj))
            return b"module:" + obj.__name__.encode()
        if keys & self._state:
            return b"state:" + qualname_of(type(obj)).encode()
        if isinstance(obj, (logging.Logger, logging.LoggerAdapter)):
            logger = obj if isinstance(obj, logging.Logger) else obj.logger
            return b"logger:" + logger.name.encode()
        if _is_typing(obj):
            text = repr(obj)
            if " at 0x" not in text:
                return b"typing:" + text.encode()
        item.reads.update(keys)
        h = hashlib.sha256()
        self._value(h, obj, f"global {dotted!r} read by {item.key}", names)
        return b"value:" + h.digest()

    def _read_import(
        self,
        entries: dict[str, bytes],
        imported: tuple[str, int, tuple[str, ...]],
        fn: types.FunctionType,
        reads: _Reads,
        item: _Item,
    ) -> None:
        """``import x`` / ``from x import y`` inside a function: read like globals.

        A library not imported yet is named without importing it; a module that cannot be
        imported is recorded as such (the code may well fall back on ImportError).
        """
        name, level, fromlist = imported
        try:
            package = fn.__globals__.get("__package__") or ""
            full = importlib.util.resolve_name("." * level + name, package) if level else name
            spec = None if full in sys.modules else importlib.util.find_spec(full)
            top = _classify(full, spec.origin, True) if spec and spec.has_location else None
            if top is not None:
                self.note_package(top)
                entries[full] = b"module:" + full.encode()
                return
            module = importlib.import_module(full)
            for attr in fromlist:
                if attr != "*" and not hasattr(module, attr):  # a submodule not imported yet
                    importlib.import_module(f"{full}.{attr}")
        except (ImportError, ValueError):
            entries["." * level + name] = b"unimportable"
            return
        attrs = fromlist or tuple(a for a in sorted(reads.attrs) if a in vars(module))
        for attr in attrs or ("",):
            chain = (full, attr) if attr else (full,)
            self._read_chain(entries, chain, {full: module}, item)

    def _class(self, h: Sink, cls: type, item: _Item) -> None:
        self._value(h, [cls.__bases__, type(cls)], f"the bases of {item.key}", set())
        qualified = {f"{cls.__qualname__}.{{}}"}
        qualified.update(f"{n}.{{}}" for n in spellings(cls.__module__, cls.__qualname__))
        if dataclasses.is_dataclass(cls):
            params = cls.__dataclass_params__  # type: ignore[attr-defined]
            options = {k: getattr(params, k, None) for k in _DATACLASS_OPTIONS}
            self._value(h, options, f"the dataclass options of {item.key}", set())
            for f in cls.__dataclass_fields__.values():
                feed_item(h, b"field", f.name.encode())
                kind = f._field_type.name  # type: ignore[attr-defined]
                spec = [kind, f.default, f.default_factory, f.init, f.kw_only]
                spec = [... if v is dataclasses.MISSING else v for v in spec]  # ...: no default
                where = f"dataclass field {f.name!r} of {item.key}"
                self._value(h, spec, where, {q.format(f.name) for q in qualified})
        is_enum = issubclass(cls, enum.Enum)
        members: dict[str, Any] = dict(getattr(cls, "__members__", {})) if is_enum else {}
        if is_enum:
            values = {name: member.value for name, member in members.items()}
            self._value(h, values, f"the enum members of {item.key}", set())
        for name, value in sorted(vars(cls).items()):
            skip = name in _CLASS_SKIP or (is_enum and (_sunder(name) or name in members))
            if skip or _generated(cls, value):
                continue
            feed_item(h, b"attr", name.encode())
            where, names = (
                f"class attribute {name!r} of {item.key}",
                {q.format(name) for q in qualified},
            )
            if isinstance(value, (staticmethod, classmethod, property, functools.cached_property)):
                feed_item(h, type(value).__name__.encode())
                inner = getattr(value, "__func__", getattr(value, "func", None))
                value = (
                    [value.fget, value.fset, value.fdel] if isinstance(value, property) else inner
                )
            elif isinstance(value, _SLOTS):
                value = type(value).__name__  # slots, namedtuple fields: generated descriptors
            self._value(h, value, where, names)


def _contents(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell: the variable is not assigned yet
        return _MISSING


def _sunder(name: str) -> bool:
    return len(name) > 2 and name[0] == name[-1] == "_" and name[1] != "_" and name[-2] != "_"


def _generated(cls: type, value: Any) -> bool:
    """A method that dataclass, enum, namedtuple or Protocol machinery put in the class body.

    Their inputs (fields, members, options) are hashed instead: what they add varies by Python.
    """
    machinery = dataclasses.is_dataclass(cls) or issubclass(cls, (enum.Enum, tuple))
    if not (machinery or getattr(cls, "_is_protocol", False)):
        return False
    fn = getattr(value, "__func__", value)  # static and class methods too
    return isinstance(fn, types.FunctionType) and (
        (fn.__code__.co_filename.startswith("<") and fn.__name__ in _GENERATED)
        or package_of(fn) is not None
    )
