"""The package's layers, and a check that each module imports only from its layer or below.

The layers are the subpackages of ``snapstore/`` (``format``, ``storage``, ``fingerprint``,
``read``, ``write``, ``manage``), with a few top-level modules at the bottom (``errors``) and at
the top (the API, the integrations, and the click app in ``cli/``, installed as
``snapstore.cli``). A module may import from its own layer and the layers below it, never from
one above, and the imports among modules may form no circle. Imports inside functions count: a
lazy import is a dependency all the same, only a later one. The README's "Architecture"
paragraph draws the same map.

Two kinds of import are not dependencies:

- imports under ``if TYPE_CHECKING:``, which never run: they name a type for an annotation. They
  are left out of the circle check, but they may not point to a layer above, nor name a
  private type.
- names loaded from a string by :func:`importlib.import_module`, which is how a lower layer
  reaches an optional module above it without depending on it (the store's protocol registry
  opens ``webhdfs://`` through :mod:`snapstore.storage.webhdfs`, the engine registry runs Ray
  through :mod:`snapstore.ray`), as fsspec's ``known_implementations`` does.

No module imports a name starting with an underscore from another module: what modules share
has a public name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Bottom to top: each layer is a subpackage (all its modules) or a list of top-level modules.
# The README's architecture diagram draws the same.
LAYERS: dict[str, tuple[str, ...]] = {
    "base": ("errors", "oldpaths", "tracing", "verdict", "watch"),
    "format": ("format/",),
    "storage": ("storage/",),
    "fingerprint": ("fingerprint/",),
    "read": ("read/",),
    "write": ("write/",),
    "manage": ("manage/",),
    "api": ("snapshot", "handle", "mix", "__init__"),
    "integrations": (
        "torch_pool",
        "torch_ragged",
        "torch_passes",
        "torch_accelerate",
        "torch_device",
        "torch",
        "lightning",
        "grain",
        "tensorflow",
        "ray",
    ),
    "cli": ("cli/",),
}
LAYER_NAMES = list(LAYERS)


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for ``snapstore`` (a package as its ``__init__``) and the
    click app (which installs as ``snapstore.cli``)."""
    found: dict[str, Path] = {}
    for path in sorted((ROOT / "snapstore").rglob("*.py")):
        parts = ["snapstore", *path.relative_to(ROOT / "snapstore").with_suffix("").parts]
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in sorted((ROOT / "cli").glob("*.py")):
        found["snapstore.cli" + ("" if path.stem == "__init__" else f".{path.stem}")] = path
    return found


MODULES = _modules()


def _layer_of(module: str) -> str | None:
    """``snapstore.storage.store`` and ``snapstore.storage`` are in layer storage,
    ``snapstore.errors`` in base, ``snapstore`` (its ``__init__``) in api."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for name, members in LAYERS.items():
        if f"{top}/" in members or (len(parts) <= 2 and top in members):
            return name
    return None


LAYER_OF = {module: LAYER_NAMES.index(n) for module in MODULES if (n := _layer_of(module))}


TYPE_CHECKING = ("TYPE_CHECKING", "typing.TYPE_CHECKING")  # not `if not TYPE_CHECKING:`


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in TYPE_CHECKING:
            skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return skipped


def _import_call(node: ast.AST) -> str | None:
    """The module a call such as ``importlib.import_module("snapstore.ray")`` names, when it is
    a literal: a dependency like any import (a registry's "module:attribute" strings are not)."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    name = ast.unparse(node.func)
    first = node.args[0]
    if name in ("importlib.import_module", "import_module", "__import__") and isinstance(
        first, ast.Constant
    ):
        return str(first.value)
    return None


def _imports(
    module: str, path: Path, type_checking: bool = False
) -> Iterator[tuple[str, str, int]]:
    """(imported module, imported name or "", line) for each import of a package module, those
    under ``if TYPE_CHECKING:`` included only if ``type_checking``."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = set() if type_checking else _type_checking_nodes(tree)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if (called := _import_call(node)) is not None and called.startswith("snapstore."):
            yield called, "", getattr(node, "lineno", 0)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "snapstore":
                    yield alias.name, "", node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            elif node.module and node.module.split(".")[0] == "snapstore":
                base = node.module
            else:
                continue
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:  # from .format import layout
                    yield f"{base}.{alias.name}", "", node.lineno
                else:  # from .format.layout import COMMIT_NAME, from snapstore import Snapshot
                    yield base, alias.name, node.lineno


def _graph(type_checking: bool = False) -> dict[str, list[tuple[str, str, int]]]:
    return {m: list(_imports(m, p, type_checking)) for m, p in MODULES.items()}


def test_every_module_has_a_layer() -> None:
    missing = sorted(set(MODULES) - set(LAYER_OF))
    assert not missing, (
        f"modules {missing} are in no layer: put each in the subpackage of the lowest layer "
        "whose modules it may import (or add a top-level module to LAYERS in "
        "tests/test_layers.py and to the README's architecture diagram)"
    )


def test_the_map_sees_every_layer_and_import() -> None:
    """The checks below are only as good as the import reader: it must resolve relative and
    absolute imports of every form to modules that exist."""
    assert {LAYER_NAMES[n] for n in LAYER_OF.values()} == set(LAYER_NAMES)
    graph = _graph(type_checking=True)
    targets = {t for imports in graph.values() for t, _, _ in imports}
    assert targets <= set(MODULES), (
        f"imports of modules that do not exist (an old path?): {sorted(targets - set(MODULES))}"
    )
    assert ("snapstore.format.layout", "", 0) not in graph["snapstore.read.reader"]
    reader = {t for t, _, _ in graph["snapstore.read.reader"]}
    assert {"snapstore.format.layout", "snapstore.storage.store", "snapstore.errors"} <= reader


def test_no_module_imports_from_a_layer_above() -> None:
    upward = []
    for module, imports in _graph(type_checking=True).items():
        for target, name, line in imports:
            if target != module and LAYER_OF.get(target, -1) > LAYER_OF.get(module, -1):
                upward.append(
                    f"{module} (layer {LAYER_NAMES[LAYER_OF[module]]}) imports "
                    f"{target}{'.' + name if name else ''} (layer "
                    f"{LAYER_NAMES[LAYER_OF[target]]}) at line {line}"
                )
    assert not upward, "imports from a layer above:\n" + "\n".join(upward)


def test_no_private_name_crosses_modules() -> None:
    crossing = [
        f"{module} imports the private {target}.{name} at line {line}: give it a public name"
        for module, imports in _graph(type_checking=True).items()
        for target, name, line in imports
        if target != module and name.startswith("_") and not name.startswith("__")
    ]
    assert not crossing, "\n".join(crossing)


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_no_import_circle() -> None:
    graph = {m: {t for t, _, _ in imports if t != m} for m, imports in _graph().items()}
    circle = _circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle or [])


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ],
)
def test_circle_finder(graph: dict[str, set[str]], expected: list[str] | None) -> None:
    assert _circle(graph) == expected


def test_readme_draws_the_same_layers() -> None:
    """The README's diagram names each layer (top down) and, for a subpackage, its modules."""
    text = (ROOT / "README.md").read_text()
    diagram = text.split("## Architecture", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    drawn: dict[str, list[str]] = {}
    layer = ""
    for line in diagram.splitlines():
        if not line.startswith(" "):
            layer, _, line = line.partition(" ")
        names = line.split("(", 1)[0].replace(",", " ").split()
        drawn.setdefault(layer.rstrip("/"), []).extend(names)
    assert list(drawn) == list(reversed(LAYER_NAMES)), "the README draws the layers top down"
    for name, members in LAYERS.items():
        expected = (
            [
                module.rsplit(".", 1)[1]
                for module in MODULES
                if LAYER_OF.get(module) == LAYER_NAMES.index(name) and module.count(".") == 2
            ]
            if members[0].endswith("/")
            else list(members)
        )
        assert sorted(drawn[name]) == sorted(expected), f"layer {name} in README.md"


def test_every_subpackage_is_packaged() -> None:
    """pyproject.toml lists packages by name: a subpackage left out would be missing from a
    wheel (an editable install would still find it, so nothing else here would notice)."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    packages = {m for m, p in MODULES.items() if p.name == "__init__.py"}
    assert listed == packages, (
        f"add {sorted(packages - listed)} to [tool.setuptools] packages in pyproject.toml"
        if packages - listed
        else f"pyproject.toml lists packages that do not exist: {sorted(listed - packages)}"
    )
