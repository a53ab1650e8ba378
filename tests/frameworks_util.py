"""Run the recipes of docs/guide/frameworks.md as scripts, and read back what each rank trained on.

A recipe is a fenced ``python`` block right after an HTML comment ``<!-- test: NAME -->``.
:func:`script` makes a runnable file of it: the module-level constants the test names
(``ROOT = ...``) are replaced with the test's values (a recipe that lacks one fails the test,
so the page and its test cannot drift apart), and :data:`RECORDER` is put in front. The recorder
runs in every process the framework starts (torchrun's ranks, Lightning's relaunched or spawned
ranks), and appends to ``$SNAPSTORE_RECORD/<pid>.jsonl``:

- ``{"rank": r, "ids": [...]}`` for each forward of a ``Linear`` with 16 inputs, the recipes'
  first layer, whose input rows are the test snapshots' ``features`` (16 copies of the sample's
  id): what the model trained on, after any dispatching and collating;
- ``{"rank": r, "set_epoch": e}`` for each ``SnapshotIterableDataset.set_epoch`` call.

:func:`launch` runs a command in its own process group with a deadline, and kills the group
(ranks, DataLoader workers) when it passes, so a hung collective fails the test with the
output so far instead of holding CI.
"""

from __future__ import annotations

import ast
import collections
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guide" / "frameworks.md"
FEATURES = 16  # the width of the recipes' first layer and of the test snapshots' features
BLOCK = re.compile(r"<!-- test: ([\w-]+) -->\s*\n```python\n(.*?)\n```", re.DOTALL)

RECORDER = f"""\
import json as _json, os as _os
import torch as _torch
import snapstore.torch as _snapstore_torch


def _rank():
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(_os.environ.get("RANK", "0"))


def _record(entry):
    path = _os.path.join(_os.environ["SNAPSTORE_RECORD"], f"{{_os.getpid()}}.jsonl")
    with open(path, "a") as f:
        f.write(_json.dumps({{"rank": _rank(), **entry}}) + "\\n")


def _record_forward(module, args):
    if isinstance(module, _torch.nn.Linear) and module.in_features == {FEATURES} and args:
        rows = args[0].detach()
        if not bool((rows == rows[:, :1]).all()):
            raise AssertionError("features are not the test snapshot's: " + repr(rows[:2]))
        _record({{"ids": rows[:, 0].long().tolist()}})


_torch.nn.modules.module.register_module_forward_pre_hook(_record_forward)
_set_epoch = _snapstore_torch.SnapshotIterableDataset.set_epoch


def _recorded_set_epoch(self, epoch):
    _record({{"set_epoch": epoch}})
    _set_epoch(self, epoch)


_snapstore_torch.SnapshotIterableDataset.set_epoch = _recorded_set_epoch
if _os.environ.get("SNAPSTORE_NO_EPOCH_CALLBACK"):  # the recipe as if it had no SnapshotEpochs
    import snapstore.lightning as _snapstore_lightning

    _snapstore_lightning.SnapshotEpochs.on_train_epoch_start = lambda *args: None
# ---- the recipe, from docs/guide/frameworks.md ----
"""


def recipes() -> dict[str, str]:
    """The page's marked code blocks by name."""
    found: dict[str, str] = {}
    for name, code in BLOCK.findall(GUIDE.read_text()):
        if name in found:
            raise AssertionError(f"{GUIDE}: two blocks marked <!-- test: {name} -->")
        found[name] = code + "\n"
    return found


def recipe(name: str, **constants: Any) -> str:
    """Recipe ``name`` with its module-level ``NAME = ...`` constants set to ``constants``."""
    code = recipes()[name]
    lines = code.splitlines(keepends=True)
    seen = set()
    for node in reversed(ast.parse(code).body):  # from the end, so line numbers stay valid
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in constants:
                seen.add(target.id)
                end = node.end_lineno or node.lineno
                value = constants[target.id]
                lines[node.lineno - 1 : end] = [f"{target.id} = {value!r}\n"]
    missing = set(constants) - seen
    if missing:
        raise AssertionError(f"recipe {name!r} in {GUIDE} has no constant(s) {sorted(missing)}")
    return "".join(lines)


def script(path: Path, name: str, **constants: Any) -> Path:
    """Write recipe ``name`` as a runnable script at ``path``, the recorder in front."""
    path.write_text(RECORDER + recipe(name, **constants))
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def environment(record: Path, **extra: str) -> dict[str, str]:
    """The environment of a launched recipe: gloo on 127.0.0.1, Hugging Face offline, no
    inherited rank, records to ``record``."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(
        SNAPSTORE_RECORD=str(record),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        GLOO_SOCKET_IFNAME="lo",
        ACCELERATE_USE_CPU="1",  # else Accelerate under torchrun on CPUs runs 2 lone processes
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",  # 2 ranks on 2 cores
        **extra,
    )
    return env


def torchrun(script_path: Path, env: dict[str, str], nproc: int = 2) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
        "--master_addr", "127.0.0.1", "--master_port", env["MASTER_PORT"], str(script_path),
    ]  # fmt: skip


def launch(cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> str:
    """Run ``cmd``; its output, or AssertionError with the output's end if it failed or hung."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the ranks and their workers with it
        out, _ = proc.communicate()
        raise AssertionError(f"{cmd} hung for {timeout} s; output:\n{out[-6000:]}") from None
    if proc.returncode != 0:
        raise AssertionError(f"{cmd} exited {proc.returncode}; output:\n{out[-6000:]}")
    return out


class Records:
    """What the processes of a run recorded: per rank, the ids of each forward, in order, and
    the epochs ``set_epoch`` was called with."""

    def __init__(self, record: Path) -> None:
        self.batches: dict[int, list[list[int]]] = collections.defaultdict(list)
        self.set_epoch: dict[int, list[int]] = collections.defaultdict(list)
        for path in sorted(record.glob("*.jsonl")):
            for line in path.read_text().splitlines():
                entry = json.loads(line)
                if "ids" in entry:
                    self.batches[entry["rank"]].append(entry["ids"])
                else:
                    self.set_epoch[entry["rank"]].append(entry["set_epoch"])

    def epochs(self, rank: int, per_epoch: int) -> list[list[int]]:
        """Rank ``rank``'s ids, cut into epochs of ``per_epoch`` samples."""
        ids = [i for batch in self.batches[rank] for i in batch]
        if len(ids) % per_epoch:
            raise AssertionError(
                f"rank {rank} trained on {len(ids)} samples, not epochs of {per_epoch}"
            )
        return [ids[start : start + per_epoch] for start in range(0, len(ids), per_epoch)]
