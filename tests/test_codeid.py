"""Code identity (fingerprint scheme 2): what the walk through user modules sees and reports."""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_fingerprint import configure, fp  # the shared call helpers of the fingerprint tests

from snapstore.errors import FingerprintError
from snapstore.fingerprint.digest import (
    Fingerprint,
    diff_parts,
    fingerprint_stage,
    hash_code,
    hash_value,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


TREE_SOURCES = {
    "fpx_stage": """
        import json
        import numpy as np
        import fpx_helpers
        from fpx_helpers import Tokenizer
        from fpx_deep import even

        def stage(paths, n=2):
            tok = Tokenizer(n)
            for p in paths:
                yield {
                    "x": fpx_helpers.normalize(p),
                    "t": tok.encode(p),
                    "z": np.zeros(2),
                    "e": even(3),
                    "j": json.dumps(p),
                }
    """,
    "fpx_helpers": """
        import logging
        from typing import Optional
        from fpx_deep import clean

        MAX_LEN = 512
        log = logging.getLogger(__name__)
        Maybe = Optional[int]


        def normalize(text, lower=True):
            log.debug("normalizing %s", Maybe)
            text = clean(text)
            return text.lower()[:MAX_LEN] if lower else text[:MAX_LEN]


        def unrelated(x):
            return x * 3


        def make_suffix(s):
            def add(text):
                return text + s
            return add


        suffix = make_suffix("!")


        class Tokenizer:
            VOCAB = ("a", "b")

            def __init__(self, n):
                self.n = n

            def encode(self, text):
                return [self.VOCAB.index(c) % self.n for c in suffix(text) if c in self.VOCAB]
    """,
    "fpx_deep": """
        def clean(text):
            # strip whitespace
            return text.strip()


        def even(n):
            return n == 0 or odd(n - 1)


        def odd(n):
            return n != 0 and even(n - 1)
    """,
}
TREE = {name: textwrap.dedent(source) for name, source in TREE_SOURCES.items()}


def write_tree(directory: Path, tree: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, source in tree.items():
        (directory / f"{name}.py").write_text(textwrap.dedent(source))
    return directory


@pytest.fixture
def user_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``load(tree, main)`` writes a module tree to a fresh directory and imports ``main`` from it.

    Every load uses the same module names, so keys are comparable; sys.modules is purged of the
    tree's modules before each load and after the test.
    """
    names: set[str] = set()
    count = iter(range(1000))

    def purge() -> None:
        for name in names:
            sys.modules.pop(name, None)

    def load(tree: dict[str, str], main: str = "fpx_stage") -> types.ModuleType:
        names.update(tree)
        purge()
        monkeypatch.syspath_prepend(str(write_tree(tmp_path / f"v{next(count)}", tree)))
        return importlib.import_module(main)

    yield load
    purge()


def edited(module: str, old: str, new: str, tree: dict[str, str] = TREE) -> dict[str, str]:
    assert old in tree[module], old
    return {**tree, module: tree[module].replace(old, new)}


def stage_fp(module: types.ModuleType, **settings: Any) -> Fingerprint:
    return fingerprint_stage(module.stage, (["a"],), {}, format_version=1, **settings)


EDITS = [  # (module, old, new, expected diff, or None when the fingerprint must not change)
    ("fpx_deep", "text.strip()", "text.strip(' ')", ["code: fpx_deep.clean changed"]),
    ("fpx_deep", "# strip whitespace\n", "", None),
    ("fpx_deep", "return text.strip()", "return (text.strip())   # why", None),
    ("fpx_deep", "def clean(text):", "def clean(text):\n    '''Docstring.'''", None),
    ("fpx_helpers", "lower=True", "lower=False", ["code: fpx_helpers.normalize changed"]),
    ("fpx_helpers", "MAX_LEN = 512", "MAX_LEN = 1024", ["code: fpx_helpers.normalize changed"]),
    ("fpx_helpers", 'make_suffix("!")', 'make_suffix("?")',
     ["code: fpx_helpers.make_suffix.<locals>.add changed"]),
    ("fpx_helpers", "% self.n", "% (self.n + 1)", ["code: fpx_helpers.Tokenizer.encode changed"]),
    ("fpx_helpers", 'VOCAB = ("a", "b")', 'VOCAB = ("a", "c")',
     ["code: fpx_helpers.Tokenizer changed"]),
    ("fpx_helpers", "return x * 3", "return x * 4", None),
    ("fpx_stage", "even(3)", "even(5)", ["code: fpx_stage.stage changed"]),
    ("fpx_stage", "tok = Tokenizer(n)", "tok = Tokenizer(n)  # renamed below", None),
]  # fmt: skip


@pytest.mark.parametrize("module, old, new, expected", EDITS)
def test_edit_detection_matrix(
    user_modules: Any, module: str, old: str, new: str, expected: Any
) -> None:
    base = stage_fp(user_modules(TREE))
    after = stage_fp(user_modules(edited(module, old, new)))
    if expected is None:
        assert after.digest == base.digest and diff_parts(base, after) == []
    else:
        assert after.digest != base.digest
        assert diff_parts(base, after) == expected


def test_renaming_a_local_changes_the_code(user_modules: Any) -> None:
    """The documented rule: the normalized AST keeps names, so a pure rename is an edit."""
    base = stage_fp(user_modules(TREE))
    renamed = {**TREE, "fpx_stage": TREE["fpx_stage"].replace("tok", "tokenizer")}
    assert diff_parts(base, stage_fp(user_modules(renamed))) == ["code: fpx_stage.stage changed"]


def test_code_details_name_functions_and_packages(user_modules: Any) -> None:
    code = stage_fp(user_modules(TREE)).details["code"]
    assert code["stage"] == "fpx_stage.stage"
    assert set(code["functions"]) == {
        "fpx_stage.stage",
        "fpx_helpers.normalize",
        "fpx_deep.clean",
        "fpx_deep.even",
        "fpx_deep.odd",
        "fpx_helpers.Tokenizer",
        "fpx_helpers.Tokenizer.__init__",
        "fpx_helpers.Tokenizer.encode",
        "fpx_helpers.make_suffix.<locals>.add",
    }  # fmt: skip  (unrelated, make_suffix itself and library code are not there)
    assert all(len(d) == 16 for d in code["functions"].values())
    assert code["packages"] == {
        "numpy": importlib.metadata.version("numpy"),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }
    assert hash_code(user_modules(TREE).stage) == stage_fp(user_modules(TREE)).parts["code"]


def test_a_new_helper_is_reported_as_added(user_modules: Any) -> None:
    base = stage_fp(user_modules(TREE))
    tree = edited("fpx_helpers", "text = clean(text)", "text = extra(clean(text))")
    tree = {**tree, "fpx_helpers": tree["fpx_helpers"] + "\n\ndef extra(t):\n    return t\n"}
    assert diff_parts(base, stage_fp(user_modules(tree))) == [
        "code: fpx_helpers.normalize changed",
        "code: fpx_helpers.extra added",
    ]


def test_library_code_is_identified_by_version(
    user_modules: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage = user_modules(TREE).stage
    base = stage_fp(user_modules(TREE))
    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "9.9.9" if name == "numpy" else real(name)
    )
    bumped = fingerprint_stage(stage, (["a"],), {}, format_version=1)
    assert bumped.digest != base.digest
    assert diff_parts(base, bumped) == [f"package numpy {real('numpy')} -> 9.9.9"]


def test_library_and_user_modules_are_told_apart_by_location(user_modules: Any) -> None:
    from snapstore.fingerprint import codeid

    helpers = user_modules(TREE) and sys.modules["fpx_helpers"]
    assert codeid.package_of(helpers) is None
    assert codeid.package_of(helpers.normalize) is None
    assert codeid.package_of(np) == "numpy" and codeid.package_of(np.zeros) == "numpy"
    assert codeid.package_of(json.dumps) == "json"
    assert codeid.package_of(len) == "builtins"
    assert codeid.package_of(codeid.CodeWalk) == "snapstore"  # snapstore is a library
    assert codeid._distributions("json") == {
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}"
    }
    assert codeid._distributions("snapstore") == {
        "snapstore": importlib.metadata.version("snapstore")
    }


def test_mutual_recursion_and_self_reference_terminate(user_modules: Any) -> None:
    tree = {
        "fpx_stage": """
            from fpx_deep import even

            class Node:
                def walk(self, depth):
                    return Node().walk(depth - 1) if depth else even(depth)

            def stage(paths):
                yield {"x": Node().walk(3)}
        """,
        "fpx_deep": TREE["fpx_deep"],
    }
    functions = stage_fp(user_modules(tree)).details["code"]["functions"]
    assert {"fpx_deep.even", "fpx_deep.odd", "fpx_stage.Node", "fpx_stage.Node.walk"} <= set(
        functions
    )


def test_helpers_too_deep_are_a_clear_error(
    user_modules: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from snapstore.fingerprint import codeid

    chain = "\n".join(f"def f{i}(x):\n    return f{i + 1}(x)\n" for i in range(8))
    tree = {"fpx_stage": chain + "\ndef f8(x):\n    return x\n\ndef stage(p):\n    yield f0(p)\n"}
    monkeypatch.setattr(codeid, "_MAX_CODE_DEPTH", 5)
    with pytest.raises(FingerprintError, match="more than 5 levels deep") as info:
        stage_fp(user_modules(tree))
    assert "fpx_stage.f5" in str(info.value) and "install it" in str(info.value)


def test_unhashable_global_names_the_global_and_the_function(user_modules: Any) -> None:
    tree = edited(
        "fpx_helpers",
        "def unrelated(x):",
        "import threading\nLOCK = threading.Lock()\n\ndef guarded(x):\n    with LOCK:\n"
        "        return x\n\ndef unrelated(x):",
    )
    tree = edited("fpx_helpers", "text = clean(text)", "text = guarded(clean(text))", tree)
    module = user_modules(tree)
    with pytest.raises(FingerprintError) as info:
        stage_fp(module)
    message = str(info.value)
    assert "global 'LOCK' read by fpx_helpers.guarded" in message
    assert "_thread.lock" in message and "__snapstore_key__" in message
    assert 'ignore_globals=["LOCK"]' in message and 'version="' in message
    ignored = stage_fp(module, ignore_globals=["LOCK"])
    assert ignored.details["code"]["ignored_globals"] == ["LOCK"]
    assert stage_fp(module, ignore_globals=["fpx_helpers.LOCK"]).digest == ignored.digest


def test_globals_that_are_not_data_are_named(user_modules: Any) -> None:
    """Modules, loggers and typing constructs count by name: no error, and stable."""
    module = user_modules(TREE)  # normalize reads a logger and Optional[int]
    assert stage_fp(module).digest == stage_fp(user_modules(TREE)).digest
    renamed = edited("fpx_helpers", "getLogger(__name__)", "getLogger('other')")
    assert stage_fp(user_modules(renamed)).digest != stage_fp(module).digest
    pattern = edited(
        "fpx_helpers", "MAX_LEN = 512", "import re\nMAX_LEN = 512\nWS = re.compile(' +')"
    )
    pattern = edited(
        "fpx_helpers", "text = clean(text)", "text = WS.sub(' ', clean(text))", pattern
    )
    with_regex = stage_fp(user_modules(pattern))  # a compiled regex hashes by pattern and flags
    other = edited("fpx_helpers", "re.compile(' +')", "re.compile(' *')", pattern)
    assert stage_fp(user_modules(other)).digest != with_regex.digest


def test_state_the_code_writes_is_not_hashed_by_value(user_modules: Any) -> None:
    """A call log or memo cache the code fills must not change the fingerprint after a run."""
    tree = {
        "fpx_stage": """
            CALLS = []
            _MEMO = {}
            COUNT = 0

            def remember(key, value):
                _MEMO[key] = value

            def stage(paths):
                global COUNT
                COUNT += 1
                CALLS.append(len(paths))
                for p in paths:
                    if p not in _MEMO:
                        remember(p, p.upper())
                    yield {"x": _MEMO[p]}
        """
    }
    module = user_modules(tree)
    before = stage_fp(module)
    list(module.stage(["a", "b"]))
    assert module.CALLS and module._MEMO and module.COUNT == 1
    assert stage_fp(module).digest == before.digest

    def factory() -> Any:
        calls: list[int] = []

        def stage(n: int) -> Any:
            calls.append(n)
            yield {"n": n}

        return stage

    closure_stage = factory()
    first = fingerprint_stage(closure_stage, (1,), {}, format_version=1)
    list(closure_stage(1))
    assert fingerprint_stage(closure_stage, (1,), {}, format_version=1).digest == first.digest


def test_imports_inside_a_function_are_followed(user_modules: Any) -> None:
    tree = {
        "fpx_stage": """
            def stage(paths):
                import fpx_deep
                from fpx_helpers import normalize
                try:
                    import fpx_not_installed as fast
                except ImportError:
                    fast = None
                import tabnanny
                yield {"x": fpx_deep.clean(normalize(paths[0])), "f": fast, "t": tabnanny}
        """,
        "fpx_helpers": TREE["fpx_helpers"],
        "fpx_deep": TREE["fpx_deep"],
    }
    imported_before = "tabnanny" in sys.modules
    base = stage_fp(user_modules(tree))  # a missing optional module is no error
    assert "fpx_deep.clean" in base.details["code"]["functions"]
    assert "python" in base.details["code"]["packages"]
    assert ("tabnanny" in sys.modules) == imported_before  # a library is named, not imported
    changed = stage_fp(user_modules(edited("fpx_deep", "text.strip()", "text", tree)))
    assert diff_parts(base, changed) == ["code: fpx_deep.clean changed"]


def test_wrappers_lambdas_and_caches(user_modules: Any) -> None:
    tree = {
        "fpx_stage": """
            import contextlib, functools

            def logged(fn):
                @functools.wraps(fn)
                def wrapper(*args):
                    return fn(*args)
                return wrapper

            @logged
            def double(x):
                return 2 * x

            @functools.lru_cache(maxsize=None)
            def square(x):
                return x * x

            @contextlib.contextmanager
            def opened(x):
                yield x + 10

            inc, dec = (lambda x: x + 1), (lambda x: x - 1)
            pick = sorted(
                [3, 1],
                key=lambda x: -x,
            )

            def stage(paths):
                with opened(1) as y:
                    yield {"x": double(1) + square(2) + inc(1) + dec(1) + y}
        """
    }
    base = stage_fp(user_modules(tree))
    functions = base.details["code"]["functions"]
    assert "fpx_stage.logged.<locals>.wrapper" in functions and "fpx_stage.double" in functions
    for old, new in [
        ("return fn(*args)", "return fn(*args) + 0"),  # the decorator's wrapper
        ("return 2 * x", "return 3 * x"),  # the wrapped function
        ("return x * x", "return x ** 2"),  # behind lru_cache
        ("x - 1)", "x - 2)"),  # the second lambda on a line
        ("yield x + 10", "yield x + 11"),  # behind a library decorator (contextmanager)
    ]:
        assert stage_fp(user_modules(edited("fpx_stage", old, new, tree))).digest != base.digest


def test_lambda_in_a_multiline_call_has_source() -> None:
    from snapstore.fingerprint import codeid

    fn = functools.partial(
        sorted,
        key=lambda x: -x,
    ).keywords["key"]
    assert codeid._source_identity(fn) is not None


def test_function_without_source_uses_bytecode_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile("def repl_stage(x):\n    yield x + 1\n", "<stdin>", "exec"), namespace)
    with caplog.at_level(logging.WARNING, logger="snapstore"):
        first = fp(namespace["repl_stage"], 1)
    assert "no source for __main__.repl_stage" in caplog.text and "bytecode" in caplog.text
    assert first.details["code"]["functions"].keys() == {"__main__.repl_stage"}
    exec(compile("def repl_stage(x):\n    yield x + 2\n", "<stdin>", "exec"), namespace)
    assert fp(namespace["repl_stage"], 1).digest != first.digest


def test_classes_of_every_kind_hash(user_modules: Any) -> None:
    tree = {
        "fpx_stage": """
            import abc, collections, dataclasses, enum, functools, typing

            @dataclasses.dataclass(frozen=True)
            class Config:
                size: int = 3
                tags: list = dataclasses.field(default_factory=list)

                def scaled(self):
                    return self.size * 2

            class Mode(enum.Enum):
                FAST = 1
                SLOW = 2

            Pair = collections.namedtuple("Pair", "a b")

            class Typed(typing.NamedTuple):
                a: int
                b: str = "x"

            class Base(abc.ABC):
                __slots__ = ("v",)

                @abc.abstractmethod
                def run(self): ...

                @property
                def twice(self):
                    return 2

                @functools.cached_property
                def cached(self):
                    return 3

                @staticmethod
                def helper():
                    return 4

                @classmethod
                def make(cls):
                    return cls

            class Proto(typing.Protocol):
                def run(self) -> int: ...

            def stage(paths, cfg=Config(), mode=Mode.FAST):
                yield {"x": (Pair, Typed, Base, Proto, cfg.scaled(), mode.value)}
        """
    }
    base = stage_fp(user_modules(tree))
    assert {"fpx_stage.Config", "fpx_stage.Mode", "fpx_stage.Base.run"} <= set(
        base.details["code"]["functions"]
    )
    assert stage_fp(user_modules(tree)).digest == base.digest
    for old, new in [
        ("size: int = 3", "size: int = 4"),
        ("FAST = 1", "FAST = 3"),
        ('b: str = "x"', 'b: str = "y"'),
        ("return 3", "return 5"),
        ("return 4", "return 6"),
        ("frozen=True", "frozen=False"),
    ]:
        assert stage_fp(user_modules(edited("fpx_stage", old, new, tree))).digest != base.digest


def test_generator_arguments_are_refused() -> None:
    for value in [(p for p in ["a"]), iter(["a"]), map(str, [1])]:
        with pytest.raises(FingerprintError, match="generator or iterator") as info:
            fp(configure, value)
        assert "pass a list" in str(info.value) and "argument 'items'" in str(info.value)
    with pytest.raises(FingerprintError, match="generator or iterator"):
        fp(configure, [1], {"nested": iter([])})


def test_same_code_in_another_directory_and_process(tmp_path: Path, user_modules: Any) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        "import sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "import fpx_stage\n"
        "from snapstore.fingerprint.digest import fingerprint_stage\n"
        "f = fingerprint_stage(fpx_stage.stage, (['a'],), {}, format_version=1)\n"
        "print(f.digest, f.parts['code'])\n"
    )
    first = write_tree(tmp_path / "one", TREE)
    second = tmp_path / "elsewhere" / "deeper" / "two"
    shutil.copytree(first, second)
    outputs = []
    for seed, tree_dir in (("1", first), ("2", second)):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO_ROOT)}
        result = subprocess.run(
            [sys.executable, str(script), str(tree_dir)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        outputs.append(result.stdout.split())
    assert outputs[0] == outputs[1]
    here = stage_fp(user_modules(TREE))
    assert [here.digest, here.parts["code"]] == outputs[0]


# -- inputs and upstream hooks --------------------------------------------------------------


class FakeInputs:
    def __init__(self, items: dict[str, str]) -> None:
        self.items = items

    def __snapstore_inputs__(self) -> dict[str, str]:
        return dict(self.items)


class FakeSnapshot:
    def __init__(self, fingerprint: str) -> None:
        self.fingerprint = fingerprint

    def __snapstore_upstream__(self) -> str:
        return self.fingerprint


def reads(paths: Any, tokens: Any = None, max_len: int = 8):
    yield {"n": max_len}


def test_inputs_and_upstream_are_their_own_parts() -> None:
    files = FakeInputs({f"f{i}": f"size=1,mtime={i}" for i in range(5)})
    up = FakeSnapshot("ab12cd34" + "0" * 24)
    f = fingerprint_stage(reads, (files, up), {}, format_version=1)
    assert set(f.details["arguments"]) == {"max_len"}
    assert f.details["inputs"]["paths"]["count"] == 5
    assert len(f.details["inputs"]["paths"]["digest"]) == 16
    assert set(f.details["inputs"]["paths"]["items"]) == {f"f{i}" for i in range(5)}
    assert f.details["upstream"] == {"tokens": up.fingerprint}
    plain = fingerprint_stage(reads, ([], None), {}, format_version=1)
    assert plain.parts["inputs"] == hash_value({}) == plain.parts["upstream"]
    assert plain.details["inputs"] == {} and plain.details["upstream"] == {}
    reordered = FakeInputs(dict(reversed(list(files.items.items()))))
    assert fingerprint_stage(reads, (reordered, up), {}, format_version=1).digest == f.digest
    nested = fingerprint_stage(reads, ([up, files],), {}, format_version=1)
    assert nested.details["arguments"].keys() == {"paths", "tokens", "max_len"}
    assert fingerprint_stage(reads, ([FakeSnapshot("x")],), {}, format_version=1).digest != (
        nested.digest
    )


def test_inputs_and_upstream_diff_sentences(monkeypatch: pytest.MonkeyPatch) -> None:
    items = {f"f{i}": f"v{i}" for i in range(10)}
    old = fingerprint_stage(
        reads, (FakeInputs(items), FakeSnapshot("ab12cd34ffff")), {}, format_version=1
    )
    new_items = {k: v for k, v in items.items() if k not in ("f8", "f9")}
    new_items.update({"f0": "x", "f1": "x", "f2": "x", "f10": "v10"})
    new = fingerprint_stage(
        reads, (FakeInputs(new_items), FakeSnapshot("9f00aa11ffff")), {}, format_version=1
    )
    assert diff_parts(old, new) == [
        "inputs 'paths': 3 changed, 1 added, 2 removed",
        "upstream 'tokens' changed (ab12cd34 -> 9f00aa11)",
    ]
    assert diff_parts(fingerprint_stage(reads, ([], None), {}, format_version=1), old) == [
        "argument 'paths' removed",
        "argument 'tokens' removed",
        "inputs 'paths' added",
        "upstream 'tokens' added",
    ]
    from snapstore.fingerprint import digest as fingerprint

    monkeypatch.setattr(fingerprint, "_MAX_INPUT_DETAILS", 5)
    big_old = fingerprint_stage(reads, (FakeInputs(items),), {}, format_version=1)
    big_new = fingerprint_stage(reads, (FakeInputs(new_items),), {}, format_version=1)
    assert "items" not in big_new.details["inputs"]["paths"]
    assert diff_parts(big_old, big_new) == [
        "inputs 'paths': 9 inputs changed (was 10; per-input details not stored)"
    ]


def test_bad_hook_results_are_errors() -> None:
    class BadInputs:
        def __snapstore_inputs__(self) -> Any:
            return ["a"]

    class BadUpstream:
        def __snapstore_upstream__(self) -> Any:
            return 3

    with pytest.raises(FingerprintError, match=r"argument 'paths'.*expected a dict of str"):
        fingerprint_stage(reads, (BadInputs(),), {}, format_version=1)
    with pytest.raises(FingerprintError, match="fingerprint as a str"):
        fingerprint_stage(reads, ([], BadUpstream()), {}, format_version=1)


class Shuffled(frozenset):  # type: ignore[type-arg]
    """A frozenset whose iteration order the test sets, as id() order is arbitrary."""

    def __iter__(self) -> Any:
        items = sorted(super().__iter__(), key=lambda f: f(0))
        return iter(items[::-1] if os.environ.get("FPX_BACKWARDS") else items)


def test_sets_of_same_named_functions_do_not_depend_on_set_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Keys given in visit order would make a set of lambdas hash by its arbitrary order."""
    fns = Shuffled([lambda x: x + 1, lambda x: x + 2, lambda x: x + 3])
    forward = hash_value(fns)
    monkeypatch.setenv("FPX_BACKWARDS", "1")
    assert hash_value(fns) == forward
    assert fp(configure, [fns]).digest == fp(configure, [fns]).digest


def test_a_module_in_a_closure_is_hashed_as_a_module_global() -> None:
    """``def main(): import numpy as np`` and a stage below it: the module is named (with its
    package), as when read as a global, not refused as a value."""

    def main() -> Any:
        import json

        import numpy as np

        def imgs(n: int) -> Any:
            for i in range(n):
                yield {"x": np.zeros(3) + i, "j": json.dumps(i)}

        return imgs

    first = fingerprint_stage(main(), (2,), {}, format_version=1)
    assert first.digest == fingerprint_stage(main(), (2,), {}, format_version=1).digest
    assert {"numpy", "python"} <= set(first.details["code"]["packages"])

    def make(module: types.ModuleType) -> Any:
        import json

        np = module

        def imgs(n: int) -> Any:
            for i in range(n):
                yield {"x": np.zeros(3) + i, "j": json.dumps(i)}

        return imgs

    # The same key and source: only the module in the cell differs.
    a = fingerprint_stage(make(np), (2,), {}, format_version=1)
    b = fingerprint_stage(make(json), (2,), {}, format_version=1)
    assert a.digest != b.digest
    assert a.digest == fingerprint_stage(make(np), (2,), {}, format_version=1).digest
    ignored = fingerprint_stage(main(), (2,), {}, format_version=1, ignore_globals=["np"])
    assert "numpy" not in ignored.details["code"]["packages"]


def test_a_user_module_in_a_closure_is_followed(user_modules: Any) -> None:
    tree = {
        "fpx_stage": """
            def factory():
                import fpx_helpers

                def stage(paths, n=2):
                    for p in paths:
                        yield {"x": fpx_helpers.normalize(p)}

                return stage

            stage = factory()
        """,
        "fpx_helpers": TREE["fpx_helpers"],
        "fpx_deep": TREE["fpx_deep"],
    }
    base = stage_fp(user_modules(tree))
    assert "fpx_helpers.normalize" in base.details["code"]["functions"]
    changed = stage_fp(user_modules(edited("fpx_helpers", "lower=True", "lower=False", tree)))
    assert diff_parts(base, changed) == ["code: fpx_helpers.normalize changed"]
    unrelated = stage_fp(user_modules(edited("fpx_helpers", "x * 3", "x * 4", tree)))
    assert unrelated.digest == base.digest
