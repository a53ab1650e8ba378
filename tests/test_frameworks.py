"""The recipes of docs/guide/frameworks.md, run as the page shows them on 2 CPU processes (gloo).

Each launched test takes a recipe from the page (tests/frameworks_util.py), sets its constants
to a 128-sample snapshot and 2 epochs, runs it (torchrun, or the script itself for Lightning,
which starts its own ranks) and reads back the ids each rank's model trained on, recorded in
its first layer's forward. They check the issue's promises: every sample once per epoch across
the ranks, each epoch in its own order, and that order the one ``snap.batches`` plans for the
rank (and epoch ``e`` of the trainer reading epoch ``e``). In-process tests cover Lightning's
restart and its read-ahead on resume, the ragged forms under the frameworks' batch transfer,
Accelerate's dispatching of varying-shape fields, and the page's transform and per-sample
fragments.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchdata.stateful_dataloader")
if not torch.distributed.is_available():  # pragma: no cover - depends on the build
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from frameworks_util import (  # noqa: E402
    FEATURES,
    Records,
    environment,
    launch,
    recipes,
    script,
    torchrun,
)

import snapstore  # noqa: E402
from snapstore.torch import RaggedList, SnapshotIterableDataset  # noqa: E402

N = 128
BATCH = 16  # per rank
EPOCHS = 2
WORKERS = 2  # DataLoader workers per rank, where a test does not say
LAUNCH_TIMEOUT_S = 240  # a launched recipe that hangs fails with its output instead
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")


def table(n: int) -> Iterator[dict[str, Any]]:
    """Fixed-shape fields; ``features`` is the id 16 times, which the recorder reads back."""
    for i in range(n):
        image = np.zeros((8, 8, 3), np.uint8)
        image[:, :, 0] = np.arange(8, dtype=np.uint8)  # a left-to-right ramp, to see flips
        yield {
            "id": i,
            "features": np.full(FEATURES, i, np.float32),
            "label": np.float32(i % 7),
            "image": image,
        }


def tokens(n: int) -> Iterator[dict[str, Any]]:
    """``table``'s id, features and label, with a varying-shape field."""
    for i in range(n):
        yield {
            "id": i,
            "features": np.full(FEATURES, i, np.float32),
            "label": np.float32(i % 7),
            "tokens": np.arange(1 + i % 5, dtype=np.int32) + i,
        }


def materialize(stage: Any, root: Path) -> snapstore.Snapshot:
    # Blocks of 8 samples, so that shuffling mixes 16 blocks.
    options = snapstore.WriteOptions(block_bytes=256, block_min_rows=8)
    return snapstore.snapshot(stage, root=root, options=options)(N).materialize()


@pytest.fixture(scope="module")
def table_snap(tmp_path_factory: pytest.TempPathFactory) -> snapstore.Snapshot:
    return materialize(table, tmp_path_factory.mktemp("frameworks") / "root")


@pytest.fixture(scope="module")
def tokens_snap(tmp_path_factory: pytest.TempPathFactory) -> snapstore.Snapshot:
    return materialize(tokens, tmp_path_factory.mktemp("frameworks") / "root")


def planned(
    snap: snapstore.Snapshot, batch: int, epoch: int, rank: int, world: int, workers: int = 0
) -> list[list[int]]:
    """The batches of one rank's epoch in the order a DataLoader with ``workers`` yields them:
    its workers' batches in turn."""
    per_worker = [
        [
            b["id"].tolist()
            for b in snap.batches(
                batch,
                epoch=epoch,
                rank=rank,
                world_size=world,
                worker=w,
                num_workers=max(workers, 1),
                shuffle=True,
                seed=0,
            )
        ]
        for w in range(max(workers, 1))
    ]
    return [b for turn in zip(*per_worker, strict=True) for b in turn]


def flat(batches: list[list[int]]) -> list[int]:
    return [i for b in batches for i in b]


def run(tmp_path: Path, name: str, *, launcher: str, **constants: Any) -> Records:
    """Run recipe ``name`` with ``constants`` on the test snapshot; what the ranks recorded."""
    extra = constants.pop("env", {})
    record = tmp_path / "record"
    record.mkdir()
    # Not "<name>.py": a script named accelerate.py would shadow the package.
    path = script(tmp_path / f"recipe_{name.replace('-', '_')}.py", name, **constants)
    env = environment(record, **extra)
    cmd = torchrun(path, env) if launcher == "torchrun" else [sys.executable, str(path)]
    launch(cmd, cwd=tmp_path, env=env, timeout=LAUNCH_TIMEOUT_S)
    return Records(record)


def location(snap: snapstore.Snapshot) -> dict[str, str]:
    return {"ROOT": str(snap.store.url), "FINGERPRINT": snap.fingerprint}


def check_epochs(records: Records, expected: dict[int, list[list[int]]]) -> None:
    """Each rank trained on ``expected[rank]`` (its epochs' ids, in order); together the ranks
    read every sample once per epoch, and the epochs' orders differ."""
    per_epoch = N // len(expected)
    got = {rank: records.epochs(rank, per_epoch) for rank in expected}
    assert sorted(records.batches) == sorted(expected)
    for epoch in range(EPOCHS):
        ids = [i for rank in got for i in got[rank][epoch]]
        assert sorted(ids) == list(range(N)), f"epoch {epoch}: not every sample once"
    for rank, epochs in got.items():
        assert len(epochs) == EPOCHS
        assert epochs[0] != epochs[1]
        assert epochs == expected[rank], f"rank {rank} did not read the planned order"


def test_torchrun_ddp(table_snap: snapstore.Snapshot, tmp_path: Path) -> None:
    records = run(
        tmp_path, "torchrun-ddp", launcher="torchrun", BATCH_SIZE=BATCH, NUM_WORKERS=2,
        EPOCHS=EPOCHS, **location(table_snap),
    )  # fmt: skip
    expected = {
        r: [flat(planned(table_snap, BATCH, e, r, 2, workers=2)) for e in range(EPOCHS)]
        for r in range(2)
    }
    check_epochs(records, expected)
    assert not records.set_epoch  # no set_epoch anywhere: each pass is the next epoch


@pytest.mark.parametrize(
    ("strategy", "workers", "callback"),
    [("ddp", 2, False), ("ddp_spawn", 1, True)],
    ids=["ddp-no-set-epoch", "ddp_spawn-SnapshotEpochs"],
)
def test_lightning(
    table_snap: snapstore.Snapshot, tmp_path: Path, strategy: str, workers: int, callback: bool
) -> None:
    """The DataLoader is built before fit; each rank reads its half of each epoch, epoch e of
    the trainer the snapshot's epoch e, without SnapshotEpochs (and no set_epoch call at all)
    as with it."""
    pytest.importorskip("pytorch_lightning")
    env = {} if callback else {"SNAPSTORE_NO_EPOCH_CALLBACK": "1"}
    records = run(
        tmp_path, "lightning-ddp", launcher="script", STRATEGY=strategy, BATCH_SIZE=BATCH,
        NUM_WORKERS=workers, EPOCHS=EPOCHS, env=env, **location(table_snap),
    )  # fmt: skip
    expected = {
        r: [flat(planned(table_snap, BATCH, e, r, 2, workers=workers)) for e in range(EPOCHS)]
        for r in range(2)
    }
    check_epochs(records, expected)
    if callback:
        assert {r: records.set_epoch[r] for r in range(2)} == {0: [0, 1], 1: [0, 1]}
    else:
        assert not records.set_epoch


@pytest.mark.parametrize("stateful", [False, True], ids=["DataLoader", "StatefulDataLoader"])
@pytest.mark.parametrize("dispatch", [None, False], ids=["dispatched", "dispatch_batches=False"])
def test_accelerate(
    table_snap: snapstore.Snapshot, tmp_path: Path, dispatch: bool | None, stateful: bool
) -> None:
    """2 DataLoader workers: a StatefulDataLoader starts them when Accelerate first asks for its
    state, before the pass and its set_epoch."""
    pytest.importorskip("accelerate")
    records = run(
        tmp_path, "accelerate", launcher="torchrun", DISPATCH_BATCHES=dispatch, STATEFUL=stateful,
        BATCH_SIZE=BATCH, NUM_WORKERS=WORKERS, EPOCHS=EPOCHS, **location(table_snap),
    )  # fmt: skip
    if dispatch is None:
        # Process 0 reads the whole epoch; each step it sends process r the r-th of 2 batches.
        epochs = [planned(table_snap, BATCH, e, 0, 1, WORKERS) for e in range(EPOCHS)]
        expected = {r: [flat(batches[r::2]) for batches in epochs] for r in range(2)}
    else:
        expected = {
            r: [flat(planned(table_snap, BATCH, e, r, 2, WORKERS)) for e in range(EPOCHS)]
            for r in range(2)
        }
    check_epochs(records, expected)
    assert records.set_epoch[0][-1] == EPOCHS - 1  # Accelerate's set_epoch reached the dataset


ACCELERATE_RESUME = """\
import json, sys
from accelerate import Accelerator, DataLoaderConfiguration
from torch.utils.data import DataLoader
import snapstore
from snapstore.torch import SnapshotIterableDataset

root, fingerprint, mode, out = sys.argv[1:5]  # mode: full, stop (after 3 steps) or resume
config = DataLoaderConfiguration(dispatch_batches=False, use_stateful_dataloader=True)
accelerator = Accelerator(dataloader_config=config)
ds = SnapshotIterableDataset(snapstore.open(fingerprint, root), batch_size=8, seed=0)
loader = accelerator.prepare(DataLoader(ds, batch_size=None, num_workers=2))
if mode == "resume":
    accelerator.load_state(out + "/checkpoint")
seen = []
for epoch in range(2 if mode != "stop" else 1):
    for step, batch in enumerate(loader):
        seen.append(batch["id"].tolist())
        if mode == "stop" and step == 2:
            accelerator.save_state(out + "/checkpoint")
            break
with open(f"{out}/{mode}-{accelerator.process_index}.json", "w") as f:
    json.dump(seen, f)
"""


def test_accelerate_stateful_resume(table_snap: snapstore.Snapshot, tmp_path: Path) -> None:
    """accelerator.save_state after 3 steps of epoch 0 and load_state in a new run: the new run
    trains on exactly the batches the first had left, of both epochs, on each process (under a
    StatefulDataLoader with 2 workers, which Accelerate's shard wrapper makes fast-forward)."""
    pytest.importorskip("accelerate")
    path = tmp_path / "resume_recipe.py"
    path.write_text(ACCELERATE_RESUME)
    record = tmp_path / "record"
    record.mkdir()
    env = environment(record)
    for mode in ("full", "stop", "resume"):
        args = [str(table_snap.store.url), table_snap.fingerprint, mode, str(tmp_path)]
        launch(torchrun(path, env) + args, cwd=tmp_path, env=env, timeout=LAUNCH_TIMEOUT_S)
    for rank in range(2):
        full, stop, resumed = (
            json.loads((tmp_path / f"{mode}-{rank}.json").read_text())
            for mode in ("full", "stop", "resume")
        )
        assert len(full) == 2 * N // (2 * 8) and len(stop) == 3
        assert stop + resumed == full, f"rank {rank}"


@pytest.mark.parametrize("dispatch", [None, False], ids=["dispatched", "dispatch_batches=False"])
def test_hf_trainer(tokens_snap: snapstore.Snapshot, tmp_path: Path, dispatch: bool | None) -> None:
    """HF Trainer builds the DataLoader (per_sample=True, batches of 8 per device) and calls
    set_epoch; max_steps of 2 epochs; the collate pads the varying-shape tokens."""
    pytest.importorskip("transformers")
    per_device = 8
    records = run(
        tmp_path, "hf-trainer", launcher="torchrun", OUTPUT_DIR=str(tmp_path / "out"),
        BATCH_SIZE=per_device, MAX_STEPS=EPOCHS * N // (2 * per_device), MAX_TOKENS=8,
        DISPATCH_BATCHES=dispatch, NUM_WORKERS=1, **location(tokens_snap),
    )  # fmt: skip
    read = 256  # the recipe's batch_size: the dataset reads an epoch's share at once here
    if dispatch is None:
        epochs = [flat(planned(tokens_snap, read, e, 0, 1)) for e in range(EPOCHS)]
        steps = [[ids[s : s + per_device] for s in range(0, N, per_device)] for ids in epochs]
        expected = {r: [flat(batches[r::2]) for batches in steps] for r in range(2)}
        ranks_reading = [0]
    else:
        expected = {
            r: [flat(planned(tokens_snap, read, e, r, 2)) for e in range(EPOCHS)] for r in range(2)
        }
        ranks_reading = [0, 1]
    check_epochs(records, expected)
    for rank in ranks_reading:  # the Trainer's set_epoch reached the dataset, every epoch
        assert sorted(set(records.set_epoch[rank])) == list(range(EPOCHS)), records.set_epoch


# ---- Lightning in this process: restarts and resume -------------------------------------------


def lightning_fit(
    snap: snapstore.Snapshot, tmp_path: Path, *, epochs: int, callbacks: list[Any] = (),
    ckpt_path: str | None = None, num_workers: int = 0, stateful: bool = False,
    iterator_step: bool = False,
) -> list[list[int]]:  # fmt: skip
    """One ``fit`` on one CPU process; the ids of the batches trained on."""
    pl = pytest.importorskip("pytorch_lightning")
    from torchdata.stateful_dataloader import StatefulDataLoader

    trained: list[list[int]] = []

    class Model(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(FEATURES, 1)

        def loss(self, batch: dict[str, Any]) -> Any:
            trained.append(batch["id"].tolist())
            prediction = self.net(batch["features"]).squeeze(1)
            return torch.nn.functional.mse_loss(prediction, batch["label"])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class PlainStep(Model):
        def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
            return self.loss(batch)

    class IteratorStep(Model):
        def training_step(self, dataloader_iter: Any) -> Any:
            batch, _, _ = next(dataloader_iter)
            return self.loss(batch)

    ds = SnapshotIterableDataset(snap, batch_size=BATCH, seed=0)
    loader_type = StatefulDataLoader if stateful else torch.utils.data.DataLoader
    loader = loader_type(ds, batch_size=None, num_workers=num_workers)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=epochs, callbacks=list(callbacks),
        default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    model = IteratorStep() if iterator_step else PlainStep()
    trainer.fit(model, train_dataloaders=loader, ckpt_path=ckpt_path)
    return trained


@pytest.fixture
def quiet_lightning() -> Iterator[None]:
    import logging
    import warnings

    logger = logging.getLogger("pytorch_lightning")
    level = logger.level
    logger.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "does not have many workers", pytree deprecations
        yield
    logger.setLevel(level)


@pytest.mark.usefixtures("quiet_lightning")
@pytest.mark.parametrize("stateful", [False, True], ids=["DataLoader", "StatefulDataLoader"])
def test_lightning_restart_reads_the_trainers_epoch(
    table_snap: snapstore.Snapshot, tmp_path: Path, stateful: bool
) -> None:
    """Restarted from an end-of-epoch checkpoint, epoch 1 of the trainer reads the snapshot's
    epoch 1 with SnapshotEpochs; without it, the fresh dataset's count starts again at 0.
    Lightning starts that pass before any hook sees the restored epoch: SnapshotEpochs has it
    started again (it read epoch 0 before)."""
    pytest.importorskip("pytorch_lightning")
    from pytorch_lightning.callbacks import ModelCheckpoint

    from snapstore.lightning import SnapshotEpochs

    checkpoints = tmp_path / "checkpoints"
    saver = ModelCheckpoint(dirpath=checkpoints, save_last=True)
    first = lightning_fit(
        table_snap, tmp_path, epochs=1, callbacks=[SnapshotEpochs(), saver], stateful=stateful
    )
    assert first == planned(table_snap, BATCH, 0, 0, 1)
    last = str(checkpoints / "last.ckpt")
    common = {"epochs": 3, "ckpt_path": last, "stateful": stateful}
    with_callback = lightning_fit(table_snap, tmp_path, callbacks=[SnapshotEpochs()], **common)
    epochs_1_2 = planned(table_snap, BATCH, 1, 0, 1) + planned(table_snap, BATCH, 2, 0, 1)
    assert with_callback == epochs_1_2
    without = lightning_fit(table_snap, tmp_path, **common)
    assert without[: len(first)] == first  # what the callback is for


@pytest.mark.usefixtures("quiet_lightning")
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("iterator_step", [False, True], ids=["batch-step", "iterator-step"])
def test_lightning_resume_and_read_ahead(
    table_snap: snapstore.Snapshot, tmp_path: Path, num_workers: int, iterator_step: bool
) -> None:
    """The page's claim: resumed from a mid-epoch checkpoint taken after 3 steps of a
    StatefulDataLoader, Lightning's fit skips the 4th batch (fetched ahead, never trained on);
    with a training_step that takes the loader's iterator, it resumes at the 4th. SnapshotEpochs
    leaves an epoch resumed from the loader's state alone, and the next epoch is the
    uninterrupted run's."""
    pytest.importorskip("pytorch_lightning")
    from pytorch_lightning.callbacks import ModelCheckpoint

    from snapstore.lightning import SnapshotEpochs

    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1)
    common = {"epochs": 2, "num_workers": num_workers, "stateful": True}
    common["iterator_step"] = iterator_step
    full = lightning_fit(table_snap, tmp_path, callbacks=[saver, SnapshotEpochs()], **common)
    assert full == planned(table_snap, BATCH, 0, 0, 1, num_workers) + planned(
        table_snap, BATCH, 1, 0, 1, num_workers
    )
    step3 = str(tmp_path / "ckpt" / "epoch=0-step=3.ckpt")
    resumed = lightning_fit(
        table_snap, tmp_path, ckpt_path=step3, callbacks=[SnapshotEpochs()], **common
    )
    assert resumed == (full[3:] if iterator_step else full[4:])  # batch 3 (0-based) skipped


# ---- varying-shape fields under the frameworks' batch transfer, and dispatch -------------------


def first_batch(snap: snapstore.Snapshot, ragged: str) -> dict[str, Any]:
    ds = SnapshotIterableDataset(snap, batch_size=BATCH, seed=0, ragged=ragged)
    return next(iter(torch.utils.data.DataLoader(ds, batch_size=None)))


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and a.is_nested:
        return all(torch.equal(x, y) for x, y in zip(a.unbind(), b.unbind(), strict=True))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return all(same(x, y) for x, y in zip(a, b, strict=True))


def batch_transfers() -> list[Any]:
    pytest.importorskip("pytorch_lightning")
    pytest.importorskip("accelerate")
    from accelerate.utils import send_to_device
    from pytorch_lightning.utilities import move_data_to_device

    return [move_data_to_device, send_to_device]


@pytest.mark.parametrize("ragged", ["packed", "pad", "nested"])
def test_ragged_forms_survive_batch_transfer(tokens_snap: snapstore.Snapshot, ragged: str) -> None:
    batch = first_batch(tokens_snap, ragged)
    for transfer in batch_transfers():
        moved = transfer(batch, torch.device("cpu"))
        assert moved.keys() == batch.keys()
        assert all(same(moved[k], batch[k]) for k in batch)


def test_ragged_list_survives_batch_transfer(tokens_snap: snapstore.Snapshot) -> None:
    # Lightning's move_data_to_device and Accelerate's send_to_device call .to() on what has
    # it (RaggedList.to moves its one buffer), and rebuild other lists by type(x)(items).
    batch = first_batch(tokens_snap, "list")
    for transfer in batch_transfers():
        moved = transfer(batch, torch.device("cpu"))
        assert isinstance(moved["tokens"], RaggedList)
        assert same(moved["tokens"], batch["tokens"])
    rebuilt = type(batch["tokens"])(t for t in batch["tokens"])
    assert isinstance(rebuilt, RaggedList) and same(rebuilt, batch["tokens"])


@pytest.fixture
def accelerator_state() -> Iterator[None]:
    pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState, GradientState

    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def dispatched_batches(snap: snapstore.Snapshot, ragged: str) -> list[dict[str, Any]]:
    """One process's batches through a loader prepared with dispatch_batches=True."""
    from accelerate import Accelerator, DataLoaderConfiguration

    config = DataLoaderConfiguration(dispatch_batches=True)
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    ds = SnapshotIterableDataset(snap, batch_size=BATCH, seed=0, ragged=ragged)
    return list(accelerator.prepare(torch.utils.data.DataLoader(ds, batch_size=None)))


@pytest.mark.usefixtures("accelerator_state")
@pytest.mark.parametrize("ragged", ["list", "packed", "nested"])
def test_dispatch_refuses_varying_shape_fields(
    tokens_snap: snapstore.Snapshot, ragged: str
) -> None:
    """Dispatched batches are concatenated and sliced by Accelerate: a list failed there without
    saying why, and packed values were sliced as rows (offsets cut short), silently."""
    with pytest.raises(ValueError, match=r"field 'tokens'.*dispatch_batches=False"):
        dispatched_batches(tokens_snap, ragged)


@pytest.mark.usefixtures("accelerator_state")
def test_dispatch_passes_fixed_shapes(table_snap: snapstore.Snapshot) -> None:
    batches = dispatched_batches(table_snap, "list")
    assert flat([b["id"].tolist() for b in batches]) == flat(planned(table_snap, BATCH, 0, 0, 1))


# ---- the page's fragments ---------------------------------------------------------------------


def fragment(name: str, snap: snapstore.Snapshot) -> dict[str, Any]:
    """Run the page's code block ``name`` with ``snap`` defined; its names."""
    names: dict[str, Any] = {
        "snap": snap,
        "torch": torch,
        "DataLoader": torch.utils.data.DataLoader,
        "SnapshotIterableDataset": SnapshotIterableDataset,
    }
    exec(compile(recipes()[name], f"frameworks.md:{name}", "exec"), names)
    return names


def test_transform_fragment(table_snap: snapstore.Snapshot) -> None:
    loader = fragment("transform", table_snap)["loader"]
    flips = []
    for batch in loader:
        image = batch["image"]
        assert image.dtype == torch.float32 and image.shape[1:] == (3, 8, 8)
        ramp = image[:, 0, 0, :] * 255  # the first channel's first row: 0..7 or 7..0
        flipped = ramp[:, 0] > ramp[:, -1]
        unflipped = torch.where(flipped[:, None], ramp.flip(1), ramp)
        assert torch.allclose(unflipped, torch.arange(8.0).expand_as(unflipped))
        flips.extend(flipped.tolist())
    assert len(flips) == N and 0 < sum(flips) < N  # some flipped, some not


def test_per_sample_fragment(tokens_snap: snapstore.Snapshot) -> None:
    loader = fragment("per-sample", tokens_snap)["loader"]
    seen = []
    for batch in loader:
        assert len(batch["id"]) <= 32
        for i, row, length in zip(batch["id"], batch["tokens"], batch["tokens_lengths"]):
            assert row[:length].tolist() == list(range(int(i), int(i) + 1 + int(i) % 5))
            assert not row[length:].any()
        seen.extend(batch["id"].tolist())
    assert sorted(seen) == list(range(N))


def test_every_marked_recipe_is_run() -> None:
    """A recipe marked on the page but run by no test would rot unseen."""
    source = Path(__file__).read_text()
    for name in recipes():
        assert f'"{name}"' in source, f"no test runs the page's recipe {name!r}"
