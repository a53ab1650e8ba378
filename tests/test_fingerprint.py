"""Tests for snapstore.fingerprint.digest: canonical value hashing, code identity, stage
fingerprints."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import decimal
import enum
import functools
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import types
from collections import OrderedDict, namedtuple
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from snapstore.errors import FingerprintError, FormatError
from snapstore.fingerprint.digest import (
    FINGERPRINT_SCHEME,
    Fingerprint,
    diff_parts,
    fingerprint_stage,
    hash_code,
    hash_value,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).with_name("fingerprint_golden.json")


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class Shade(enum.Enum):
    RED = 1


@dataclasses.dataclass
class Point:
    x: int
    y: Any = None


@dataclasses.dataclass
class OtherPoint:
    x: int
    y: Any = None


Pair = namedtuple("Pair", "a b")


def fp(fn: Any, *args: Any, **kwargs: Any) -> Fingerprint:
    return fingerprint_stage(fn, args, kwargs, format_version=1)


def load_module(directory: Path, source: str, name: str = "stagemod") -> types.ModuleType:
    """Write ``source`` to ``directory/name.py`` and import it, so inspect.getsource works."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sample_values() -> list[Any]:
    """Values of every supported type that must all hash differently; a fresh list per call."""
    base = np.arange(6, dtype=np.int32)
    return [
        None, False, True, 0, 1, -1, 2**200, -(2**200), 1.0, 0.0, -0.0, float("nan"),
        float("inf"), 1e-300, 1 + 0j, 1j, "", "1", "é", b"", b"1", bytearray(b"1"),
        memoryview(b"1"), [], (), [1], (1,), [1, 2], [2, 1], {}, {1: 2}, {2: 1}, {"1": 2},
        set(), frozenset(), {1}, frozenset({1}), {1, 2}, base, base.astype(np.int64),
        base.reshape(2, 3), base.reshape(3, 2), base.view(np.uint8), np.int32(1),
        np.int64(1), np.float32(1), np.bool_(True), np.str_("1"), Color.RED, Color.BLUE,
        Shade.RED, Point(1), Point(2), OtherPoint(1), Pair(1, 2), (1, 2),
        PurePosixPath("a/b"), PurePosixPath("a/c"), PureWindowsPath("a/b"), range(3),
        range(1, 3), slice(1, 2), slice(1, 3), len, abs, np.add, int, np.float32,
        np.dtype("float32"), np.dtype("float64"), decimal.Decimal("1.0"),
        datetime.date(2024, 1, 1), datetime.timedelta(days=1), Ellipsis,
        OrderedDict([(1, 2)]), re.compile("a"), re.compile("a", re.I), re.compile(b"a"),
        re.compile("x" * 300 + "a"), re.compile("x" * 300 + "b"),
    ]  # fmt: skip


# -- values ---------------------------------------------------------------------------------


def test_equal_values_hash_equal() -> None:
    for first, second in zip(sample_values(), sample_values(), strict=True):
        assert hash_value(first) == hash_value(second), repr(first)


def test_different_values_hash_differently() -> None:
    values = sample_values()
    digests = [hash_value(v) for v in values]
    assert len(set(digests)) == len(values)
    assert all(len(d) == 64 and int(d, 16) >= 0 for d in digests)


def test_scalar_types_are_distinguished() -> None:
    assert len({hash_value(1), hash_value(True), hash_value(1.0), hash_value(1 + 0j)}) == 4
    assert hash_value(0.0) != hash_value(-0.0)
    assert hash_value(float("nan")) == hash_value(float("nan"))
    assert hash_value([1, 2]) != hash_value((1, 2))
    assert hash_value(b"ab") != hash_value("ab")


def test_dict_and_set_order_independence() -> None:
    keys = [f"k{i}" for i in range(50)]
    forward = {k: [i, {"n": i}] for i, k in enumerate(keys)}
    backward = {k: forward[k] for k in reversed(keys)}
    assert list(forward) != list(backward)
    assert hash_value(forward) == hash_value(backward)
    assert hash_value(set(keys)) == hash_value(set(reversed(keys)))
    assert hash_value(frozenset(keys)) == hash_value(frozenset(reversed(keys)))
    assert hash_value({1: "a", 2: "b"}) != hash_value({1: "b", 2: "a"})


def test_numpy_arrays() -> None:
    data = np.arange(12, dtype=np.int32)
    assert hash_value(data) != hash_value(data.view(np.float32))  # same bytes, other dtype
    assert hash_value(data) != hash_value(data.reshape(3, 4))  # same bytes, other shape
    grid = data.reshape(3, 4)
    strided = grid[:, ::2]
    assert not strided.flags.c_contiguous
    assert hash_value(strided) == hash_value(np.ascontiguousarray(strided))
    assert hash_value(np.asfortranarray(grid)) == hash_value(grid)
    assert hash_value(grid.astype(">i4")) != hash_value(grid)  # byte order is part of dtype
    with pytest.raises(FingerprintError, match="object"):
        hash_value(np.array([object()], dtype=object))


def test_subclass_of_builtin_keeps_its_name() -> None:
    class Tagged(list[int]):
        pass

    assert hash_value(Tagged([1])) != hash_value([1])
    assert hash_value(OrderedDict(a=1)) != hash_value({"a": 1})


def test_shared_references_are_not_cycles() -> None:
    shared = [1, 2]
    assert hash_value([shared, shared]) == hash_value([[1, 2], [1, 2]])


def test_reference_cycle_is_an_error_naming_the_path() -> None:
    loop: list[Any] = [1, {"x": None}]
    loop[1]["x"] = loop
    with pytest.raises(FingerprintError, match="cycle") as info:
        hash_value(loop, "argument 'items'")
    assert "argument 'items' -> [1] -> ['x']" in str(info.value)


def test_deep_nesting_is_an_error_not_recursion_error() -> None:
    deep: Any = 0
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(FingerprintError, match="nested deeper"):
        hash_value(deep)
    shallow: Any = 0
    for _ in range(50):
        shallow = {"k": [shallow]}
    assert len(hash_value(shallow)) == 64


_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True)
    | st.complex_numbers(allow_nan=True)
    | st.text()
    | st.binary()
    | hnp.arrays(hnp.scalar_dtypes(), hnp.array_shapes(min_dims=0, max_side=3))
)
_keys = st.none() | st.booleans() | st.integers() | st.text() | st.binary()
_values = st.recursive(
    _leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(_keys, inner, max_size=4)
        | st.frozensets(_keys, max_size=4)
        | st.sets(_keys, max_size=4)
        | st.builds(Point, st.integers(), inner)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(_values)
def test_deepcopy_hashes_equal(value: Any) -> None:
    assert hash_value(value) == hash_value(copy.deepcopy(value))


# -- arguments ------------------------------------------------------------------------------

DEFAULT_LEN = 1024


def tokenized(paths: list[str], max_len: int = DEFAULT_LEN, *rest: Any, seed: int = 0, **kw: Any):
    yield from paths


def test_defaults_are_bound() -> None:
    base = fp(tokenized, ["a"])
    assert fp(tokenized, ["a"], max_len=DEFAULT_LEN).digest == base.digest
    assert fp(tokenized, ["a"], DEFAULT_LEN).digest == base.digest
    assert fp(tokenized, paths=["a"], seed=0).digest == base.digest
    assert fp(tokenized, ["a"], 512).digest != base.digest
    assert fp(tokenized, ["a"], DEFAULT_LEN, "extra").digest != base.digest
    assert fp(tokenized, ["a"], other=1).digest != base.digest
    assert base.details["argument_values"]["max_len"] == "1024"
    assert set(base.details["arguments"]) == {"paths", "max_len", "rest", "seed", "kw"}


def test_bad_binding_names_the_signature() -> None:
    with pytest.raises(TypeError, match=r"tokenized\(paths") as info:
        fp(tokenized)
    assert not isinstance(info.value, FingerprintError)


def test_ignore_leaves_arguments_out() -> None:
    a = fingerprint_stage(tokenized, (["a"],), {"seed": 1}, format_version=1, ignore=["seed"])
    b = fingerprint_stage(tokenized, (["a"],), {"seed": 2}, format_version=1, ignore=["seed"])
    assert a.digest == b.digest
    assert a.details["ignored"] == ["seed"]
    assert "seed" not in a.details["arguments"]
    c = fingerprint_stage(tokenized, (["a"],), {"verbose": 1}, format_version=1, ignore=["verbose"])
    assert c.digest == fp(tokenized, ["a"]).digest  # a keyword caught by **kw


def test_ignore_of_unknown_name_is_an_error() -> None:
    def strict(a: int) -> None: ...

    with pytest.raises(TypeError, match="not parameters"):
        fingerprint_stage(strict, (1,), {}, format_version=1, ignore=["b"])


def configure(items: list[Any], cfg: dict[str, Any] | None = None, lr: float = 0.1):
    yield items


def test_unhashable_argument_message() -> None:
    items = [0, 1, 2, {"lock": threading.Lock()}]
    with pytest.raises(FingerprintError) as info:
        fp(configure, items)
    message = str(info.value)
    assert "argument 'items' -> [3] -> ['lock']" in message
    assert "lock" in message.split("found")[1]
    assert 'version="' in message and 'ignore=["items"]' in message
    assert "key=" in message and "__snapstore_key__" in message
    assert isinstance(info.value, TypeError)


def test_unhashable_attribute_path() -> None:
    cfg = {"tokenizer": Point(x=1, y=object())}
    with pytest.raises(FingerprintError, match=r"argument 'cfg' -> \['tokenizer'\] -> \.y: found"):
        fp(configure, [], cfg)


def test_ways_out_of_an_unhashable_argument() -> None:
    items = [{"lock": threading.Lock()}]
    ignored = fingerprint_stage(
        configure, (items,), {}, format_version=1, version="v1", ignore=["items"]
    )
    assert ignored.details["version"] == "v1"
    keyed = fingerprint_stage(
        configure, (items,), {}, format_version=1, key=lambda items, **_: len(items)
    )
    assert keyed.details["key"] is not None and keyed.details["arguments"] == {}

    class Vocab:
        def __init__(self, words: list[str]) -> None:
            self.words = words
            self.lock = threading.Lock()

        def __snapstore_key__(self) -> Any:
            return self.words

    assert fp(configure, [Vocab(["a"])]).digest == fp(configure, [Vocab(["a"])]).digest
    assert fp(configure, [Vocab(["a"])]).digest != fp(configure, [Vocab(["b"])]).digest


def test_key_replaces_arguments() -> None:
    def by_len(items: list[Any], **_: Any) -> int:
        return len(items)

    a = fingerprint_stage(configure, ([1, 2],), {}, format_version=1, key=by_len)
    b = fingerprint_stage(configure, ([3, 4],), {}, format_version=1, key=by_len)
    c = fingerprint_stage(configure, ([3],), {}, format_version=1, key=by_len)
    assert a.digest == b.digest != c.digest
    assert a.details["key"].endswith("by_len")


def test_parts_and_json_round_trip() -> None:
    f = fingerprint_stage(configure, ([1],), {}, format_version=3, version="v2")
    assert set(f.parts) == {
        "scheme", "code", "arguments", "inputs", "upstream", "format", "version"
    }  # fmt: skip
    assert len(f.digest) == 32 and f.digest == f.digest.lower()
    assert f.details["scheme"] == FINGERPRINT_SCHEME and f.details["format_version"] == 3
    assert f.details["stage"] == f"{__name__}.configure"
    data = json.loads(json.dumps(f.to_json()))
    assert Fingerprint.from_json(data) == f
    data["parts"]["code"] = "0" * 64
    with pytest.raises(FormatError, match="does not match"):
        Fingerprint.from_json(data)
    with pytest.raises(FormatError):
        Fingerprint.from_json({"parts": {}})


# -- code -----------------------------------------------------------------------------------

STAGE = """
import functools

def deco(**settings):
    return lambda fn: fn

def helper(x):
    return x

def stage(paths, n=2):
    for p in paths:
        yield {"x": p * n}
"""


def test_code_edits_change_hash_but_formatting_does_not(tmp_path: Path) -> None:
    base = hash_code(load_module(tmp_path / "a", STAGE).stage)
    reformatted = STAGE.replace(
        'def stage(paths, n=2):\n    for p in paths:\n        yield {"x": p * n}',
        'def stage(paths,\n          n = 2):  # a comment\n    """Doc."""\n\n'
        '    for p in paths:\n\n        # why\n        yield {"x": (p * n)}',
    )
    assert reformatted != STAGE
    assert hash_code(load_module(tmp_path / "b", reformatted).stage) == base
    decorated = STAGE.replace("def stage", "@deco(root='/tmp/x')\ndef stage")
    assert hash_code(load_module(tmp_path / "c", decorated).stage) == base
    edited = STAGE.replace("p * n", "p * n + 1")
    assert hash_code(load_module(tmp_path / "d", edited).stage) != base
    renamed = STAGE.replace("for p in paths", "for q in paths").replace("p * n", "q * n")
    assert hash_code(load_module(tmp_path / "e", renamed).stage) != base  # v1: names count


def test_same_source_at_two_paths(tmp_path: Path) -> None:
    one = load_module(tmp_path / "x" / "deep" / "dir", STAGE)
    two = load_module(tmp_path / "y", STAGE)
    assert one.stage.__code__.co_filename != two.stage.__code__.co_filename
    assert hash_code(one.stage) == hash_code(two.stage)
    assert fp(one.stage, ["a"]).digest == fp(two.stage, ["a"]).digest


def test_source_less_function_uses_bytecode() -> None:
    def define(body: str) -> Any:
        namespace: dict[str, Any] = {}
        exec(compile(f"def f(x):\n    return {body}\n", "<no-source>", "exec"), namespace)
        return namespace["f"]

    assert hash_code(define("x + 1")) == hash_code(define("x + 1"))
    assert hash_code(define("x + 1")) != hash_code(define("x + 2"))
    assert hash_code(define("(x, 1.5, 'a')")) != hash_code(define("(x, 1.5, 'b')"))


def test_lambdas_partials_methods_builtins() -> None:
    plus_one = lambda x: x + 1  # noqa: E731
    plus_two = lambda x: x + 2  # noqa: E731
    assert hash_code(plus_one) != hash_code(plus_two)
    assert hash_code(functools.partial(tokenized, max_len=1)) == hash_code(
        functools.partial(tokenized, max_len=1)
    )
    assert hash_code(functools.partial(tokenized, max_len=1)) != hash_code(
        functools.partial(tokenized, max_len=2)
    )
    assert hash_code(functools.partial(tokenized, max_len=1)) != hash_code(tokenized)
    assert hash_code(len) != hash_code(abs)
    assert hash_code([1].append) != hash_code([2].append)
    assert hash_code(np.add) != hash_code(np.multiply)
    assert fp(functools.partial(tokenized, max_len=5), ["a"]).details["stage"].endswith("tokenized")


@dataclasses.dataclass
class Scaler:
    factor: float

    def scale(self, x: float) -> float:
        return x * self.factor

    def __call__(self, x: float) -> float:
        return x * self.factor


class Plain:
    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, x: float) -> float:
        return x * self.factor


def test_bound_methods_and_callable_objects() -> None:
    assert hash_code(Scaler(2).scale) == hash_code(Scaler(2).scale)
    assert hash_code(Scaler(2).scale) != hash_code(Scaler(3).scale)
    assert hash_code(Scaler(2)) != hash_code(Scaler(3))
    assert hash_code(Plain(2)) == hash_code(Plain(2)) != hash_code(Plain(3))
    assert hash_value(Scaler(2)) != hash_value(Scaler(3))

    class Locked:
        def __init__(self) -> None:
            self.lock = threading.Lock()

        def run(self) -> None: ...

    with pytest.raises(FingerprintError, match=r"code of .*run -> \.__self__"):
        hash_code(Locked().run)


def test_functions_as_argument_values() -> None:
    a = fp(configure, [tokenized])
    assert a.digest == fp(configure, [tokenized]).digest
    assert a.digest != fp(configure, [configure]).digest
    assert a.digest != fp(configure, [lambda x: x]).digest


# -- processes and golden -------------------------------------------------------------------

SCRIPT_WORDS = [f"word{i}" for i in range(20)]
SCRIPT = f"""
import sys
sys.path.insert(0, sys.argv[1])
import stagemod
from snapstore.fingerprint.digest import fingerprint_stage, hash_value
words = set({SCRIPT_WORDS!r})
cfg = {{"b": 2, "a": [1.5, None], "words": frozenset(words)}}
f = fingerprint_stage(stagemod.stage, (sorted(words),), {{"n": 3}}, format_version=1)
g = fingerprint_stage(stagemod.stage, (words,), {{"n": cfg}}, format_version=1)
print(f.digest, g.digest, hash_value(words), ",".join(words))
"""


def test_fingerprint_is_the_same_in_other_processes(tmp_path: Path) -> None:
    module_dir = tmp_path / "mod"
    load_module(module_dir, STAGE)
    (tmp_path / "script.py").write_text(SCRIPT)
    outputs = []
    for seed in ("1", "2"):
        cwd = tmp_path / f"cwd{seed}"
        cwd.mkdir()
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO_ROOT)}
        result = subprocess.run(
            [sys.executable, str(tmp_path / "script.py"), str(module_dir)],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        outputs.append(result.stdout.split())
    assert outputs[0][3] != outputs[1][3], "the two hash seeds should iterate the set differently"
    assert outputs[0][:3] == outputs[1][:3]
    here = fp(load_module(tmp_path / "local", STAGE).stage, sorted(SCRIPT_WORDS), n=3)
    assert here.digest == outputs[0][0]


# Golden stage: do not edit this function or its arguments; the golden file records them.
def golden_stage(paths, max_len=512, *, cfg=None, mode=Color.RED, table=None):
    """Docstrings do not count."""
    for path in paths:
        yield {"path": str(path), "max_len": max_len}


GOLDEN_VALUES: dict[str, Any] = {
    "none": None,
    "bool": True,
    "int": -(2**70),
    "float": -0.0,
    "nan": float("nan"),
    "complex": 1.5 - 2j,
    "str": "naïve",
    "bytes": b"\x00\xff",
    "list": [1, "a", None],
    "tuple": (1, 2.5),
    "dict": {"b": 1, "a": [2]},
    "set": {"x", "y", "z"},
    "array": np.arange(6, dtype="<i4").reshape(2, 3),
    "npscalar": np.float32(0.5),
    "dataclass": Point(1, "two"),
    "enum": Color.BLUE,
    "path": PurePosixPath("data/train"),
    "range": range(2, 10, 3),
    "slice": slice(1, None),
    "namedtuple": Pair(1, 2),
    "dtype": np.dtype("uint8"),
}


def golden_fingerprint() -> Fingerprint:
    cfg = {"lr": 0.1, "tags": {"a", "b"}, "table": np.linspace(0, 1, 5)}
    args = ([PurePosixPath("a.txt"), "b.txt"],)
    return fingerprint_stage(
        golden_stage, args, {"cfg": cfg}, format_version=1, version="v1", ignore=["table"]
    )


def golden_record() -> dict[str, Any]:
    return {
        "fingerprint": golden_fingerprint().to_json(),
        "values": {name: hash_value(value) for name, value in GOLDEN_VALUES.items()},
    }


def test_golden_fingerprint() -> None:
    """The fingerprint of a fixed stage and arguments must never drift.

    A failure means the hashing rules changed: every stored snapshot would silently miss. Such a
    change requires bumping FINGERPRINT_SCHEME (and regenerating this file with
    ``SNAPSTORE_UPDATE_GOLDEN=1``).
    """
    record = golden_record()
    if os.environ.get("SNAPSTORE_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    expected = json.loads(GOLDEN.read_text())
    assert record["values"] == expected["values"]
    assert record["fingerprint"]["parts"] == expected["fingerprint"]["parts"]
    assert record["fingerprint"]["digest"] == expected["fingerprint"]["digest"]
    assert expected["fingerprint"]["details"]["scheme"] == FINGERPRINT_SCHEME


# -- diff -----------------------------------------------------------------------------------


def test_diff_parts_sentences(tmp_path: Path) -> None:
    def make(**kwargs: Any) -> Fingerprint:
        settings_ = {"format_version": 1, "version": "v1", **kwargs}
        fn = settings_.pop("fn", tokenized)
        return fingerprint_stage(fn, settings_.pop("args", (["a"],)), {}, **settings_)

    base = make()
    assert diff_parts(base, make()) == []
    assert diff_parts(base, make(args=(["a"], 512))) == ["argument 'max_len' changed (1024 -> 512)"]
    assert diff_parts(base, make(version="v2")) == ["version changed ('v1' -> 'v2')"]
    assert diff_parts(base, make(format_version=2)) == ["format version changed (1 -> 2)"]
    assert diff_parts(base, make(ignore=["seed"])) == ["argument 'seed' is now ignored"]

    old = load_module(tmp_path / "old", STAGE).stage
    new_source = STAGE.replace("def stage(paths, n=2):", "def stage(paths, n=2, seed=0):")
    new = load_module(tmp_path / "new", new_source).stage
    assert diff_parts(make(fn=old), make(fn=new)) == [
        "code: stagemod.stage changed",
        "argument 'seed' added",
    ]
    assert diff_parts(make(fn=new), make(fn=old))[1] == "argument 'seed' removed"
    assert diff_parts(make(fn=old, key=len), make(fn=old, args=(["a", "b"],), key=len)) == [
        "arguments changed (as identified by key function 'len')"
    ]

    future = Fingerprint(base.digest, {**base.parts, "lineage": "0" * 64}, base.details)
    assert diff_parts(base, future) == ["part 'lineage' added"]
    scheme1 = {k: v for k, v in make(fn=old).details.items() if k != "code"}  # no code details
    was = Fingerprint(base.digest, make(fn=old).parts, scheme1)
    assert diff_parts(was, make(fn=new))[0] == "code of stage 'stagemod.stage' changed"


# -- transitive code identity: an edit-detection matrix over temporary user modules ---------


def test_snapstore_names_keep_their_fingerprint() -> None:
    """A stage whose code reads snapstore's names (``Columns``, ``Field``, ``default_root``...)
    and takes a ``WriteOptions`` hashes them as they were named before the layer subpackages:
    the digests below come from the release before them (commit 004d52a), so moving a module
    does not make every such snapshot a miss."""
    import snapstore_names_stage

    import snapstore

    fp = fingerprint_stage(
        snapstore_names_stage.stage,
        (10,),
        {"options": snapstore.WriteOptions()},
        format_version=1,
    )
    assert fp.parts["code"][:16] == "1f3023356a23d11c"
    assert fp.parts["arguments"][:16] == "2ae2ad814d9d9846"
    assert fp.digest == "f3ff7e6b5b445872d2ca684dd7e1e455"
    assert hash_value(snapstore.WriteOptions()) == (
        "15b4e3a3aa29183a30f77293a3c137017fb371e5e355c19ef396fcd0a9c18d8a"
    )


def test_historic_names_name_modules_and_objects_that_exist() -> None:
    import importlib

    from snapstore.oldpaths import HISTORIC_MODULES, HISTORIC_NAMES, historic_name

    for module in HISTORIC_MODULES:
        importlib.import_module(module)
    for full in HISTORIC_NAMES:
        module, _, name = full.rpartition(".")
        assert hasattr(importlib.import_module(module), name), full
    assert historic_name("snapstore.storage.local", "LocalStore") == "snapstore.store.LocalStore"
    assert historic_name("snapstore.format.fields", "Field") == "snapstore.schema.Field"
    assert historic_name("snapstore.read.options", "ReaderOptions") == (
        "snapstore.options.ReaderOptions"
    )
    assert historic_name("numpy", "ndarray") == "numpy.ndarray"
