"""The package's layers, and a check that each module imports only from its layer or below.

Every module of ``snapstore/`` (and of ``cli/``) sits in one layer, bottom to top. A module may
import from its own layer and the layers below it, never from one above, and the imports among
modules may form no circle. Imports inside functions count: a lazy import is a dependency all
the same, only a later one. The README's "Architecture" paragraph draws the same map.

Two kinds of import are not dependencies:

- imports under ``if TYPE_CHECKING:``, which never run: they name a type for an annotation
  (``trees`` annotates with :class:`~snapstore.store.Store`, ``explain`` with
  :class:`~snapstore.fingerprint.Fingerprint`, ``codeid`` with the value hasher it calls
  back, ``handle`` with :class:`~snapstore.Snapshot`). They are left out of the circle check
  (each of those four points back to a module of its own layer that imports it), but they
  may not point to a layer above, nor name a private type; when the layers become
  subpackages, a ``Protocol`` in the lower module can replace each of them.
- names loaded from a string by :func:`importlib.import_module`, which is how a lower layer
  reaches an optional module above it without depending on it (the store's protocol registry
  opens ``webhdfs://`` through :mod:`snapstore.webhdfs`, the engine registry runs Ray through
  :mod:`snapstore.ray`), as fsspec's ``known_implementations`` does.

No module imports a name starting with an underscore from another module: what modules share
has a public name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Bottom to top. The README's architecture diagram lists the same modules.
LAYERS: dict[str, tuple[str, ...]] = {
    "format": (  # samples, schemas, columns and blocks on disk; no I/O beyond a file
        "errors", "checksums", "format", "plan", "lists", "fields", "declare", "schema", "scalars",
        "arraylike", "inference", "checks", "encode", "ragged", "columns", "handoff",
    ),
    "storage": (  # where bytes live: stores, retries, caches, and the leases kept in them
        "retry", "roots", "trees", "store", "webhdfs", "cache", "simulate", "listing",
        "hostindex", "travel", "claims", "pins",
    ),
    "fingerprint": (  # what a stage's result is named by
        "importname", "hashing", "codeid", "explain", "fingerprint", "inputs",
    ),
    "read": ("prefetch", "reader", "assemble", "batches", "options"),
    "write": ("writer", "partitions", "progress", "engines", "parallel"),
    "manage": ("catalog", "gc", "verify", "copy"),
    "api": ("snapshot", "handle", "__init__"),
    "integrations": ("torch_ragged", "torch", "grain", "tensorflow", "ray"),
    "cli": ("cli.common", "cli.inspect_cmd", "cli.verify_cmd", "cli.copy_cmd", "cli.main",
            "cli.__init__"),
}  # fmt: skip
LAYER_OF = {module: n for n, modules in enumerate(LAYERS.values()) for module in modules}
LAYER_NAMES = list(LAYERS)


def _modules() -> dict[str, Path]:
    found = {p.stem: p for p in sorted((ROOT / "snapstore").glob("*.py"))}
    found.update({f"cli.{p.stem}": p for p in sorted((ROOT / "cli").glob("*.py"))})
    return found


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return skipped


def _imports(
    module: str, path: Path, type_checking: bool = False
) -> Iterator[tuple[str, str, int]]:
    """(imported module, imported name or "", line) for each import of a package module, those
    under ``if TYPE_CHECKING:`` included only if ``type_checking``."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = set() if type_checking else _type_checking_nodes(tree)
    package = "cli" if module.startswith("cli.") else "snapstore"
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in ("snapstore", "cli") and len(parts) > 1:
                    yield _qualified(parts[0], parts[1]), "", node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:
                base, parts = package, (node.module or "").split(".")
            elif (
                node.level == 0
                and node.module
                and node.module.split(".")[0]
                in (
                    "snapstore",
                    "cli",
                )
            ):
                base, parts = node.module.split(".")[0], node.module.split(".")[1:]
            else:
                continue
            for alias in node.names:
                if parts and parts[0]:
                    yield _qualified(base, parts[0]), alias.name, node.lineno
                elif _qualified(base, alias.name) in LAYER_OF:  # from . import format
                    yield _qualified(base, alias.name), "", node.lineno
                else:  # from snapstore import Snapshot
                    yield _qualified(base, "__init__"), alias.name, node.lineno


def _qualified(package: str, module: str) -> str:
    return module if package == "snapstore" else f"cli.{module}"


def _graph(type_checking: bool = False) -> dict[str, list[tuple[str, str, int]]]:
    return {m: list(_imports(m, p, type_checking)) for m, p in _modules().items()}


def test_every_module_has_a_layer() -> None:
    missing = sorted(set(_modules()) - set(LAYER_OF))
    assert not missing, (
        f"modules {missing} are in no layer: add each to LAYERS in tests/test_layers.py (the "
        "lowest layer whose modules it may import) and to the README's architecture diagram"
    )


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
    text = (ROOT / "README.md").read_text()
    diagram = text.split("## Architecture", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    drawn: dict[str, list[str]] = {}
    layer = ""
    for line in diagram.splitlines():
        if not line.startswith(" "):
            layer, _, line = line.partition(" ")
        names = line.split("(", 1)[0].replace(",", " ").split()
        drawn.setdefault(layer, []).extend(names)
    assert list(drawn) == list(reversed(LAYER_NAMES)), "the README draws the layers top down"
    for name, modules in LAYERS.items():
        assert sorted(drawn[name]) == sorted(modules), f"layer {name} in README.md"
