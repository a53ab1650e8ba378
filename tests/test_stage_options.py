"""StageOptions: the settings of snapshot()/Stage as one frozen, validated object, and the write
layer's jobs (snapstore.write.jobs) driven without a Snapshot."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import snapstore
from snapstore import Schema, StageOptions, WriteOptions
from snapstore.fingerprint.partition import members
from snapstore.storage import claims
from snapstore.storage.store import LocalStore, Store
from snapstore.write import jobs
from snapstore.write.boundaries import content_boundaries
from snapstore.write.stageoptions import stage_options


def squares(n: int) -> Iterator[dict[str, int]]:
    for i in range(n):
        yield {"x": i * i}


def squares_of(items: list[int], scale: int = 1) -> Iterator[dict[str, int]]:
    for i in items:
        yield {"x": i * i * scale}


def test_defaults_and_normal_forms() -> None:
    options = StageOptions()
    assert options.options == WriteOptions() and options.on_busy == "wait"
    assert options.lease == 60.0 and options.partition_size == 1
    # The forms the keywords of snapshot() take are accepted here too (typed: Schema, WriteOptions).
    made = StageOptions(ignore=["verbose"], schema={"x": int}, options=None, lease=5)  # type: ignore[arg-type]
    assert made.ignore == ("verbose",) and made.ignore_globals == ()
    assert isinstance(made.schema, Schema) and made.options == WriteOptions()
    assert made.lease == 5.0 and isinstance(made.lease, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.lease = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("settings", "error", "match"),
    [
        ({"key": "args"}, TypeError, "key: expected a callable"),
        ({"ignore": "verbose"}, TypeError, r"write ignore=\('verbose',\) for one name"),
        ({"ignore_globals": 3}, TypeError, "ignore_globals: expected a collection of names"),
        ({"options": {"threads": 1}}, TypeError, "options: expected a snapstore.WriteOptions"),
        ({"on_busy": "maybe"}, ValueError, r"on_busy: expected one of \('wait', 'pass'"),
        ({"lease": 0}, ValueError, "lease: expected a positive number of seconds, found 0"),
        ({"lease": "60"}, ValueError, "lease: expected a positive number of seconds"),
        ({"partition_by": 3}, TypeError, "partition_by: expected the name of a parameter"),
        ({"partition_size": True}, TypeError, "partition_size: expected an int, found True"),
        ({"partition_size": 0}, ValueError, "partition_size: expected an int >= 1, found 0"),
        ({"engine": "gpu"}, ValueError, "engine: expected one of"),
    ],
)
def test_bad_settings_say_what_was_expected(
    settings: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        StageOptions(**settings)
    with pytest.raises(error, match=match):  # the same check through the keywords
        snapstore.snapshot(squares, **settings)


def test_replace_validates_and_knows_the_names() -> None:
    options = StageOptions(version="1")
    assert options.replace(version="2").version == "2" and options.version == "1"
    with pytest.raises(ValueError, match="lease"):
        options.replace(lease=-1)
    with pytest.raises(TypeError, match=r"unexpected settings \['leese'\]; expected some of root"):
        options.replace(leese=1)


def test_keywords_override_the_config_and_make_the_same_stage(tmp_path: Path) -> None:
    shared = StageOptions(root=str(tmp_path), version="1", lease=30)
    by_config = snapstore.snapshot(squares, config=shared, version="2")
    by_keywords = snapstore.snapshot(squares, root=str(tmp_path), version="2", lease=30)
    assert by_config.config == by_keywords.config
    assert by_config.fingerprint(3) == by_keywords.fingerprint(3)
    assert snapstore.Stage(squares, shared).config is shared  # nothing to override
    decorated = snapstore.snapshot(config=shared)(squares)
    assert [s["x"] for s in decorated(4)] == [0, 1, 4, 9]


def test_unknown_settings_and_a_wrong_config_fail_before_the_function_is_given() -> None:
    with pytest.raises(TypeError, match=r"snapshot\(\) got unexpected settings \['roots'\]"):
        snapstore.snapshot(roots="/tmp")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"Stage\(\) got unexpected settings \['roots'\]"):
        snapstore.Stage(squares, roots="/tmp")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"config: expected a snapstore\.StageOptions, found dict"):
        stage_options({"root": "/tmp"}, {})  # type: ignore[arg-type]


def test_one_config_with_an_engine_serves_stages_that_name_their_partitions() -> None:
    """``engine`` needs ``partition_by``, which is each function's own: it is checked with the
    function, not in the shared object."""
    shared = StageOptions(engine="thread", workers=2)
    stage = snapstore.snapshot(squares_of, config=shared, partition_by="items")
    assert stage.config.engine == "thread" and stage.config.partition_by == "items"
    with pytest.raises(ValueError, match=r"apply to partitioned stages; .*squares has no"):
        snapstore.snapshot(squares, config=shared)
    with pytest.raises(ValueError, match="partition_by='paths' is not a parameter of"):
        snapstore.snapshot(squares_of, config=shared, partition_by="paths")


def test_partition_calls_split_the_named_argument() -> None:
    items = [1, 2, 3, 4, 5]
    calls = jobs.partition_calls(squares_of, (items,), {"scale": 2}, "items", 2)
    # At the boundaries the inputs choose (about 2 per partition), bound, in order.
    spans = content_boundaries([name for name, _ in members(items)], 2)
    assert 1 < len(spans) < 5
    assert calls == [((items[s.start : s.stop], 2), {}) for s in spans]
    with pytest.raises(TypeError, match=r"or a sequence .* found str"):
        jobs.partition_calls(squares_of, ("abc",), {}, "items", 1)


@dataclass
class Target:
    """A stand-in for a Snapshot: what a job needs, nothing more."""

    store: Store
    fingerprint: str
    miss_explanation: dict[str, Any] | None = None
    explained: list[str] = field(default_factory=list)

    @property
    def committed(self) -> bool:
        return self.store.exists(f"{self.fingerprint}/COMMIT")


def job_for(target: Target, settings: StageOptions, n: int) -> jobs.StageJob:
    def explain(doing: str) -> dict[str, Any]:
        target.explained.append(doing)
        return {"doing": doing}

    manifest: dict[str, Any] = {"stage": "test.squares", "fingerprint_parts": {}, "version": None}
    return jobs.StageJob(
        target, squares, "test.squares", (n,), {}, settings, claims.SystemClock(), manifest, explain
    )


def test_a_job_writes_without_a_snapshot(tmp_path: Path) -> None:
    target = Target(LocalStore(str(tmp_path)), "f" * 64)
    jobs.run_job(job_for(target, StageOptions(), 5), progress=False)
    assert target.committed and target.explained == ["computing it"]
    with snapstore.open("f" * 64, root=str(tmp_path)) as snap:
        assert [s["x"] for s in snap] == [0, 1, 4, 9, 16]
        assert snap.manifest["stage"] == "test.squares"


def test_a_busy_job_passes_through_into_its_own_directory(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    target = Target(store, "e" * 64)
    held, _ = claims.acquire(store, target.fingerprint, lease=60.0, owner="other")
    assert held is not None
    jobs.run_job(job_for(target, StageOptions(on_busy="pass"), 3), progress=False)
    assert target.store is not store and "snapstore-pass-" in target.store.url
    assert target.committed and not store.exists(f"{target.fingerprint}/COMMIT")
    assert target.explained and "without storing it" in target.explained[0]
    directory = target.store.url.removeprefix("file://")
    assert os.path.isdir(directory)
    del target  # the finalizer removes the private directory with its target
    assert not os.path.isdir(directory)
    held.release()


def test_a_busy_job_raises_with_on_busy_error(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    target = Target(store, "d" * 64)
    held, _ = claims.acquire(store, target.fingerprint, lease=60.0, owner="other")
    assert held is not None
    with pytest.raises(snapstore.BusyError, match="on_busy='wait'"):
        jobs.run_job(job_for(target, StageOptions(on_busy="error"), 3), progress=False)
    held.release()
