"""The JSON examples of docs/cli.md agree with what the commands print.

Every ``$ snapstore ... --json`` example (and the ``verify --json`` object) is checked against
the real output of the same command, run through click's CliRunner on roots built like the
page's own: its example stage (``prep.tokenized``, taken from the page) materialized twice, a
crashed run, an incomplete entry, an open reader, a corrupt manifest, a damaged block. What
depends on the day, the machine or the data (fingerprints, times, sizes, timings) cannot be
equal; what is checked is what the page promises:

- every object has the same keys in the same order (an example object with a ``...`` line
  shows some keys only: those must be there, in that order);
- every value has the same JSON type (where neither is null), and a list the page shows items of
  has items;
- the values that say which release wrote the output are equal: ``format_version`` and
  ``scheme`` anywhere, ``stage``, and the digests of the fingerprint parts that depend on the
  release alone (``format``, ``scheme``, and ``version`` for a stage without one).

An example added to the page without a command here fails the test, as does a command here
whose example was removed.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import snapstore
from snapstore.cli.main import main
from snapstore.manage.copy import copy_snapshot

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
ELIDED = "__elided__"

# Each example's command as the page writes it, and the arguments it runs with here: {big} and
# {small} are the example stage's two snapshots (`b2c1` and `494d` on the page), {incomplete}
# the killed run (`3bce`), {corrupt} a snapshot whose manifest was damaged (`e47b`), {good} an
# intact one beside it, {root2} their root, {verify_root} a root holding a damaged block.
EXAMPLES: dict[str, list[str]] = {
    "snapstore ls --json": ["ls", "--json"],
    "snapstore info --json b2c1": ["info", "--json", "{big}"],
    "snapstore info --json 3bce": ["info", "--json", "{incomplete}"],
    "snapstore --root /tmp/snapdemo2 info --json e47b": [
        "--root", "{root2}", "info", "--json", "{corrupt}",
    ],
    "snapstore diff --json b0f7 de2f": ["diff", "--json", "{big}", "{small}"],
    "snapstore head b2c1 -n 1 --field tokens --field label --field text --json": [
        "head", "{big}", "-n", "1", "--field", "tokens", "--field", "label", "--field", "text",
        "--json",
    ],
    "snapstore du --json": ["du", "--json"],
    "verify --json": ["--root", "{verify_root}", "verify", "--all", "--json"],
    "snapstore gc --dry-run --keep-last 1 --json": [
        "gc", "--dry-run", "--keep-last", "1", "--json",
    ],
    "snapstore --root /tmp/cpdemo/src cp 09eb9ea6556599e7e1076495b8a8977f memory://demo --json": [
        "--root", "{root2}", "cp", "{good}", "memory://snapstore-docs-cli-demo", "--json",
    ],
    "snapstore bench b2c1 --simulate-ttfb 50ms --simulate-bandwidth 200MB/s --json": [
        "bench", "{big}", "--simulate-ttfb", "50ms", "--simulate-bandwidth", "200MB/s", "--json",
    ],
    # Snapshots that share partitions: {grow_all} (d4f7 on the page: 40 files), {grow_prefix}
    # (3b28: the first 20), {grow_added} (5d1c: 41 files); {grow_copy} holds a copy of 3b28.
    "snapstore --root /tmp/growdemo info --json 3b28": [
        "--root", "{grow_root}", "info", "--json", "{grow_prefix}",
    ],
    "snapstore --root /tmp/growdemo diff --json d4f7 5d1c": [
        "--root", "{grow_root}", "diff", "--json", "{grow_all}", "{grow_added}",
    ],
    "snapstore --root /tmp/growdemo du --json": ["--root", "{grow_root}", "du", "--json"],
    "snapstore --root /tmp/growdemo cp d4f7 /tmp/growcopy --json": [
        "--root", "{grow_root}", "cp", "{grow_all}", "{grow_copy}", "--json",
    ],
    "snapstore --root /tmp/growdemo verify --all --json": [
        "--root", "{grow_root}", "verify", "--all", "--json",
    ],
}  # fmt: skip
# Run before the reader of {big} opens (gc keeps what a reader holds open; the page's gc runs on
# the root as first built).
BEFORE_READER = {"snapstore gc --dry-run --keep-last 1 --json"}

PINNED_KEYS = {"format_version", "scheme", "stage"}
PINNED_PATHS = re.compile(
    r"\.fingerprint_parts\.(format|scheme|version)$|\.parts\.(format|scheme|version)\.[ab]$"
)


def fenced_blocks(text: str) -> Iterator[tuple[str, list[str]]]:
    """``(info string, lines)`` of each fenced block of ``text``."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = re.match(r"^```(\S*)\s*$", lines[i])
        if match is None:
            i += 1
            continue
        end = lines.index("```", i + 1)
        yield match.group(1), lines[i + 1 : end]
        i = end + 1


def parse_example(lines: list[str]) -> Any:
    """The JSON of an example; a line of ``...`` marks an object that shows some keys only."""
    text = "\n".join(
        f'"{ELIDED}": true' if re.fullmatch(r"\s*\.\.\.[^\"]*", line) else line for line in lines
    )
    return json.loads(text)


def doc_examples() -> dict[str, Any]:
    """Command (as written after ``$``) -> the JSON the page shows for it."""
    examples: dict[str, Any] = {}
    for info, lines in fenced_blocks(DOC.read_text()):
        if info == "json":
            # The one bare JSON block: the shape of `verify --json` (the heading above it).
            examples["verify --json"] = parse_example(lines)
            continue
        if info != "console":
            continue
        command, output = "", list[str]()
        for line in [*lines, "$ end"]:
            if line.startswith("$ "):
                if "--json" in command.split():
                    examples[command] = parse_example(output)
                command, output = line[2:], []
            else:
                output.append(line)
    return examples


def compare(doc: Any, real: Any, path: str = "$") -> list[str]:
    """What in the example ``doc`` disagrees with the real output ``real`` (see the module)."""
    if isinstance(doc, dict):
        if not isinstance(real, dict):
            return [f"{path}: the page shows an object, the command printed {real!r}"]
        keys = [k for k in doc if k != ELIDED]
        shown = [k for k in real if k in keys] if ELIDED in doc else list(real)
        problems = []
        if shown != keys:
            problems.append(f"{path}: the page shows the keys {keys}, the command prints {shown}")
        for key in keys:
            if key in real:
                problems += compare(doc[key], real[key], f"{path}.{key}")
        return problems
    if isinstance(doc, list):
        if not isinstance(real, list):
            return [f"{path}: the page shows a list, the command printed {real!r}"]
        if doc and not real:
            return [f"{path}: the page shows items, the command printed none"]
        return [p for i, (d, r) in enumerate(zip(doc, real)) for p in compare(d, r, f"{path}[{i}]")]
    key = path.rsplit(".", 1)[-1]
    if key in PINNED_KEYS or PINNED_PATHS.search(path):
        return (
            [] if doc == real else [f"{path}: the page shows {doc!r}, the command prints {real!r}"]
        )
    if doc is None or real is None or json_type(doc) == json_type(real):
        return []
    return [f"{path}: the page shows {doc!r}, the command prints {real!r} (another type)"]


def json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    return "number" if isinstance(value, (int, float)) else type(value).__name__


def example_stage_source(
    root: Path, heading: str = "## Example root", page_root: str = "/tmp/snapdemo"
) -> str:
    """The page's example stage (the first Python block after ``heading``), writing under
    ``root`` instead of ``page_root``."""
    text = DOC.read_text()
    after = text[text.index(heading) :]
    source = next(lines for info, lines in fenced_blocks(after) if info == "python")
    code = "\n".join(source)
    assert f'"{page_root}"' in code, f"the example stage no longer writes to {page_root}"
    return code.replace(f'"{page_root}"', repr(str(root)))


def build_shared(base: Path) -> dict[str, str]:
    """The root of "Snapshots that share partitions": the page's stage over 40 files, the first
    20, and the 40 with one added; and a copy of the 20 at another root."""
    root, data, modules = base / "growdemo", base / "growdata", base / "growmodules"
    data.mkdir()
    modules.mkdir()
    heading = "## Snapshots that share partitions"
    (modules / "grow.py").write_text(example_stage_source(root, heading, "/tmp/growdemo"))
    for i in range(40):
        (data / f"f{i:02d}.txt").write_text(f"day one file {i:02d}\n")
    sys.path.insert(0, str(modules))
    try:
        sys.modules.pop("grow", None)
        lengths = importlib.import_module("grow").lengths
        paths = sorted(str(p) for p in data.glob("*.txt"))
        every = lengths(snapstore.files(paths)).materialize()
        prefix = lengths(snapstore.files(paths[:20])).materialize()
        (data / "f10b.txt").write_text("a file that came later\n")
        added = lengths(snapstore.files(sorted(str(p) for p in data.glob("*.txt"))))
        added.materialize()
    finally:
        sys.path.remove(str(modules))
        sys.modules.pop("grow", None)
    copy_snapshot(str(root), prefix.fingerprint, str(base / "growcopy"))
    for snap in (every, prefix, added):
        snap.close()
    return {
        "grow_root": str(root), "grow_all": every.fingerprint, "grow_prefix": prefix.fingerprint,
        "grow_added": added.fingerprint, "grow_copy": str(base / "growcopy"),
    }  # fmt: skip


def small(seed: int) -> Iterator[dict[str, int]]:
    for i in range(100):
        yield {"x": seed * 1000 + i}


CRASHED_RUN = "runs/20200101T000000-host-1-00000001/shard-00000.snap"


def build(base: Path) -> tuple[dict[str, str], snapstore.Snapshot]:
    """The roots of the examples; returns the names the commands use and a snapshot whose
    reader is to be opened (as on the page: `b2c1` is read while `ls` and `info` run)."""
    root = base / "snapdemo"
    modules = base / "modules"
    modules.mkdir()
    (modules / "prep.py").write_text(example_stage_source(root))
    sys.path.insert(0, str(modules))
    try:
        sys.modules.pop("prep", None)
        prep = importlib.import_module("prep")
        big = prep.tokenized(300).materialize()
        small_snap = prep.tokenized(50, max_len=32).materialize()
    finally:
        sys.path.remove(str(modules))
        sys.modules.pop("prep", None)
    incomplete = "3bceface031112315192e652f0b774cd"
    (root / incomplete / CRASHED_RUN).parent.mkdir(parents=True)
    (root / incomplete / CRASHED_RUN).write_bytes(b"x" * 1000)
    (root / big.fingerprint / CRASHED_RUN).parent.mkdir(parents=True)
    (root / big.fingerprint / CRASHED_RUN).write_bytes(b"x" * 1000)
    (root / "notes").mkdir()

    root2 = base / "snapdemo2"
    corrupt = snapstore.snapshot(small, root=root2)(0).materialize()
    good = snapstore.snapshot(small, root=root2)(1).materialize()
    with (next((root2 / corrupt.fingerprint / "runs").iterdir()) / "manifest.json").open("a") as f:
        f.write(" ")

    verify_root = base / "verifydemo"
    damaged = snapstore.snapshot(small, root=verify_root)(2).materialize()
    reader = damaged._open()
    shard = verify_root / reader.shard_paths[0]
    data = bytearray(shard.read_bytes())
    data[int(reader.index["offset"][0]) + 8] ^= 0xFF  # inside the first block
    shard.write_bytes(bytes(data))
    for snap in (big, small_snap, corrupt, good, damaged):
        snap.close()
    names = {
        "root": str(root), "big": big.fingerprint, "small": small_snap.fingerprint,
        "incomplete": incomplete, "root2": str(root2), "corrupt": corrupt.fingerprint,
        "good": good.fingerprint, "verify_root": str(verify_root), **build_shared(base),
    }  # fmt: skip
    return names, big


def run(names: dict[str, str], args: list[str]) -> Any:
    argv = ["--root", names["root"], *(a.format(**names) for a in args)]
    result = CliRunner().invoke(main, argv)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def real_outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    names, big = build(tmp_path_factory.mktemp("docs-cli"))
    outputs = {c: run(names, EXAMPLES[c]) for c in EXAMPLES if c in BEFORE_READER}
    reader = snapstore.open(big.fingerprint, root=names["root"])
    try:
        next(iter(reader))  # open and pinned, and the read recorded
        outputs.update({c: run(names, a) for c, a in EXAMPLES.items() if c not in BEFORE_READER})
    finally:
        reader.close()
    return outputs


def test_every_json_example_has_a_command() -> None:
    assert sorted(doc_examples()) == sorted(EXAMPLES)


@pytest.mark.parametrize("command", sorted(EXAMPLES))
def test_a_json_example_matches_the_real_output(command: str, real_outputs: dict[str, Any]) -> None:
    problems = compare(doc_examples()[command], real_outputs[command])
    assert not problems, f"docs/cli.md, `{command}`:\n" + "\n".join(problems)


def test_the_info_example_shows_the_parts_of_this_release(real_outputs: dict[str, Any]) -> None:
    """The text form of `info` shows the same release-bound part digests (to 16 digits)."""
    lines = next(
        lines
        for info, lines in fenced_blocks(DOC.read_text())
        if info == "console" and lines and lines[0] == "$ snapstore info b2c1"
    )
    shown = dict(line.split() for line in lines if re.fullmatch(r"  (format|scheme) +\w+", line))
    parts = real_outputs["snapstore info --json b2c1"]["fingerprint_parts"]
    assert shown == {name: parts[name][:16] for name in ("format", "scheme")}


def test_the_shared_partition_examples_show_the_real_counts(real_outputs: dict[str, Any]) -> None:
    """How many partitions are shared, new, dropped, copied and checked follows from the file
    names alone (content-defined boundaries): the page's counts are the real ones."""
    doc = doc_examples()
    for command, path in [
        ("snapstore --root /tmp/growdemo info --json 3b28", ("partitions",)),
        ("snapstore --root /tmp/growdemo info --json 3b28", ("partitions_shared",)),
        ("snapstore --root /tmp/growdemo du --json", ("stages", 0, "partitions")),
        ("snapstore --root /tmp/growdemo cp d4f7 /tmp/growcopy --json", ("partitions_copied",)),
        ("snapstore --root /tmp/growdemo cp d4f7 /tmp/growcopy --json", ("partitions_present",)),
        ("snapstore --root /tmp/growdemo verify --all --json", ("partitions",)),
    ]:
        shown, real = doc[command], real_outputs[command]
        for key in path:
            shown, real = shown[key], real[key]
        assert shown == real, (command, path)
    shown = doc["snapstore --root /tmp/growdemo diff --json d4f7 5d1c"]["partitions"]
    real = real_outputs["snapstore --root /tmp/growdemo diff --json d4f7 5d1c"]["partitions"]
    assert {k: len(v) for k, v in shown.items()} == {k: len(v) for k, v in real.items()}


def test_the_comparison_catches_what_it_must() -> None:
    real = {"format_version": 3, "a": [{"b": 1, "c": "x"}], "fingerprint_parts": {"format": "f"}}
    assert compare(real, real) == []
    assert compare({**real, "format_version": 1}, real) == [
        "$.format_version: the page shows 1, the command prints 3"
    ]
    assert compare({"format_version": 3, ELIDED: True}, real) == []
    assert compare({"a": [], "format_version": 3, ELIDED: True}, real) == [
        "$: the page shows the keys ['a', 'format_version'], the command prints "
        "['format_version', 'a']"
    ]
    assert compare({**real, "a": [{"b": "1", "c": "x"}]}, real) == [
        "$.a[0].b: the page shows '1', the command prints 1 (another type)"
    ]
    assert compare({**real, "fingerprint_parts": {"format": "g"}}, real) == [
        "$.fingerprint_parts.format: the page shows 'g', the command prints 'f'"
    ]
