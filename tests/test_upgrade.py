"""Upgrades keep what is materialized: a stage call whose own fingerprint is not committed reads
the snapshot that an earlier release (format version 1, 2 or 3; fingerprint scheme 2) wrote for
it, and computes nothing.

tests/golden/stages/<naming>/ holds the snapshots of ``golden_rows(24, "<naming in words>")`` and
of ``golden_pairs`` over it (tests/golden_stages.py), written by the release of that naming
(``scheme3-format3`` by this one, for the next release to find); ``scheme2-script`` holds
``golden_script_rows(12)`` written by ``python tests/golden_script.py`` under scheme 2. The
directories are copied before use: readers write pins into the root.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from golden_stages import GOLDEN_ROWS, expected_rows, golden_pairs, golden_rows

import snapstore
from snapstore.fingerprint.digest import FINGERPRINT_SCHEME, combine_parts
from snapstore.fingerprint.earlier import Naming, earlier_namings, renamed
from snapstore.format.layout import FORMAT_VERSION
from snapstore.storage import claims
from snapstore.storage.simulate import simulated_store
from snapstore.storage.store import Store
from snapstore.write.writer import SnapshotWriter

GOLDEN = Path(__file__).with_name("golden") / "stages"

# directory: the naming of the release that wrote it, the rows' and the pairs' fingerprints
GOLDENS: dict[str, tuple[Naming, str, str]] = {
    "scheme2-format1": (
        Naming(2, 1),
        "7e527f0d2ca41385bceb52c97c1495db",
        "77d5cdfc3dbb6cb6f1eb07c8a7fec8fd",
    ),
    "scheme3-format1": (
        Naming(3, 1),
        "1bb28f210ca06d3d4e7938d176ce430c",
        "ec000d497f44b4d2af07f26912d42c10",
    ),
    "scheme3-format2": (
        Naming(3, 2),
        "43e14039a9084889e80cf63cd399c438",
        "ea6623910107e68c6516638cf48ac576",
    ),
    "scheme3-format3": (
        Naming(3, 3),
        "b909381fd83c534c81b6c0c3ef6b5b45",
        "184516ccc40ef945a6476bb3e075ae58",
    ),
}
SCRIPT_GOLDEN = "79f9202ee661590d4af5493867c79a89"
LOGGER = "snapstore"


def prefix(name: str) -> str:
    """The ``prefix`` argument the golden of directory ``name`` was written with."""
    return name.replace("scheme", "scheme ").replace("-format", " format ")


def golden_root(tmp_path: Path, *names: str) -> Path:
    root = tmp_path / "root"
    for name in names:
        shutil.copytree(GOLDEN / name, root, dirs_exist_ok=True)
    return root


def snapshots_in(root: Path) -> set[str]:
    return {p.name for p in root.iterdir()}


@contextmanager
def stages_never_run() -> Iterator[None]:
    """Fails if the body of a golden stage runs, in any thread, other than for the test's own
    expected values (:func:`golden_stages.expected_rows`)."""
    codes = {golden_rows.__code__, golden_pairs.__code__}
    ran: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        caller = frame.f_back.f_code if frame.f_back is not None else None
        if event == "call" and frame.f_code in codes and caller is not expected_rows.__code__:
            ran.append(frame.f_code.co_name)

    sys.setprofile(profile)
    threading.setprofile(profile)  # type: ignore[arg-type]
    try:
        yield
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    assert ran == [], f"stages ran: {ran}"


def rows_and_pairs(root: Path | Store, name: str, **settings: Any) -> tuple[Any, Any]:
    rows = snapstore.snapshot(golden_rows, root=root, **settings)(GOLDEN_ROWS, prefix(name))
    pairs = snapstore.snapshot(golden_pairs, root=root, **settings)(rows)
    return rows, pairs


def expected_pairs(name: str) -> list[dict[str, Any]]:
    return [
        {"i": row["i"] // 2, "text": row["text"]}
        for row in expected_rows(prefix(name))
        if row["i"] % 2 == 0
    ]


def check_found(snap: Any, fingerprint: str, expected: list[dict[str, Any]]) -> None:
    assert [dict(sample) for sample in snap] == expected  # reading materializes
    assert snap.fingerprint == fingerprint
    assert combine_parts(snap.fingerprint_parts) == fingerprint  # the parts of the one read


def test_golden_snapshots_of_versions_1_2_and_3_are_read_computing_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = golden_root(tmp_path, *GOLDENS)
    before = snapshots_in(root)
    with stages_never_run(), caplog.at_level(logging.INFO, logger=LOGGER):
        for name, (naming, rows_fp, pairs_fp) in GOLDENS.items():
            rows, pairs = rows_and_pairs(root, name)
            pairs.materialize()  # the chain is found from its end, the rows not yet read
            check_found(pairs, pairs_fp, expected_pairs(name))
            check_found(rows, rows_fp, expected_rows(prefix(name)))
            current = naming == Naming(FINGERPRINT_SCHEME, FORMAT_VERSION)
            assert (rows.call_fingerprint == rows_fp) is current
            rows.close()
            pairs.close()
    assert snapshots_in(root) == before  # nothing written
    lines = [r.getMessage() for r in caplog.records if r.name.startswith(LOGGER)]
    for naming, rows_fp, pairs_fp in GOLDENS.values():
        for fingerprint in (rows_fp, pairs_fp):
            (line,) = [line for line in lines if f"found snapshot {fingerprint} " in line]
            if naming != Naming(FINGERPRINT_SCHEME, FORMAT_VERSION):
                assert f"written by {naming} for this call" in line, line
                assert "nothing is computed" in line and "upgrade=True" in line, line
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name.startswith(LOGGER))


@pytest.mark.parametrize("name", list(GOLDENS))
def test_each_golden_alone_is_found(tmp_path: Path, name: str) -> None:
    naming, rows_fp, pairs_fp = GOLDENS[name]
    root = golden_root(tmp_path, name)
    with stages_never_run():
        rows, pairs = rows_and_pairs(root, name)
        check_found(rows.materialize(), rows_fp, expected_rows(prefix(name)))
        check_found(pairs, pairs_fp, expected_pairs(name))
    record = json.loads((root / rows_fp / "COMMIT").read_bytes())
    assert record["format_version"] == naming.format_version
    assert rows.manifest["fingerprint_details"]["scheme"] == naming.scheme
    rows.close()
    pairs.close()


def test_a_script_stage_that_scheme_2_named_main_is_found(tmp_path: Path) -> None:
    """Scheme 3 renamed a script's code (``__main__.f`` became ``golden_script.f``): the call,
    run as the same script, finds what scheme 2 wrote under the old name."""
    root = golden_root(tmp_path, "scheme2-script")
    script = Path(__file__).with_name("golden_script.py")
    done = subprocess.run(
        [sys.executable, str(script), str(root)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found == {"fingerprint": SCRIPT_GOLDEN, "texts": [f"script {i}" for i in range(12)]}
    assert "written by format version 1 (fingerprint scheme 2) for this call" in done.stderr
    assert snapshots_in(root) == {SCRIPT_GOLDEN}


def test_upgrade_rewrites_the_earlier_snapshot_in_the_current_format(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    name = "scheme3-format2"
    _, rows_fp, pairs_fp = GOLDENS[name]
    root = golden_root(tmp_path, name)
    with stages_never_run(), caplog.at_level(logging.INFO, logger=LOGGER):
        rows, pairs = rows_and_pairs(root, name, upgrade=True)
        rows.materialize()
        assert rows.fingerprint == rows.call_fingerprint != rows_fp
        assert rows.manifest["format_version"] == FORMAT_VERSION
        assert rows.manifest["rewritten_from"] == {
            "fingerprint": rows_fp,
            "format_version": 2,
            "scheme": 3,
        }
        assert rows.manifest["fingerprint_parts"] == rows.fingerprint_parts
        assert [dict(s) for s in rows] == expected_rows(prefix(name))
        # Downstream, the pairs that release wrote are found still (named as it named them).
        plain = snapstore.snapshot(golden_pairs, root=root)(rows)
        check_found(plain, pairs_fp, expected_pairs(name))
        again = snapstore.snapshot(golden_rows, root=root)(GOLDEN_ROWS, prefix(name))
        assert again.materialize().fingerprint == rows.fingerprint  # found as it is now
    assert snapshots_in(root) == {rows_fp, pairs_fp, rows.fingerprint}  # the old one stays
    (line,) = [r.getMessage() for r in caplog.records if "rewritten in format" in r.getMessage()]
    assert f"from snapshot {rows_fp}, which format version 2 (fingerprint scheme 3)" in line
    for snap in (rows, pairs, plain, again):
        snap.close()


def test_upgrade_reads_the_earlier_snapshot_while_another_job_holds_the_claim(
    tmp_path: Path,
) -> None:
    name = "scheme3-format1"
    _, rows_fp, _ = GOLDENS[name]
    root = golden_root(tmp_path, name)
    rows, _ = rows_and_pairs(root, name, upgrade=True)
    holder, _ = claims.acquire(rows.store, rows.call_fingerprint, lease=60.0, owner="holder")
    assert holder is not None
    with stages_never_run():
        check_found(rows.materialize(), rows_fp, expected_rows(prefix(name)))
    assert not (root / rows.call_fingerprint / "runs").exists()  # left to the holder
    holder.release()
    rows.close()


def test_the_jobs_of_a_sweep_all_read_the_earlier_snapshot(tmp_path: Path) -> None:
    name = "scheme2-format1"
    _, rows_fp, _ = GOLDENS[name]
    root = golden_root(tmp_path, name)
    before = snapshots_in(root)
    found: list[str] = []

    def job() -> None:
        rows, _ = rows_and_pairs(root, name)
        found.append(rows.materialize().fingerprint)
        assert len(rows) == GOLDEN_ROWS
        rows.close()

    with stages_never_run():
        threads = [threading.Thread(target=job) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert found == [rows_fp] * 4
    assert snapshots_in(root) == before  # no claim taken, nothing written


def tiny(n: int) -> Iterator[dict[str, int]]:
    for i in range(n):
        yield {"x": i}


def write_as(store: Store, fingerprint: str, values: list[int]) -> None:
    """A snapshot of ``values`` under ``fingerprint``, standing for an earlier release's."""
    writer = SnapshotWriter(store, fingerprint, {"stage": "test_upgrade.tiny"})
    for value in values:
        writer.add({"x": value})
    writer.commit()


def test_the_newest_earlier_snapshot_is_read(store: Store) -> None:
    stage = snapstore.snapshot(tiny, root=store)
    snap = stage(3)
    namings = earlier_namings(FORMAT_VERSION)
    write_as(store, stage.fingerprint_as(snap, namings[1]).digest, [10, 11, 12])
    write_as(store, stage.fingerprint_as(snap, namings[0]).digest, [0, 1, 2])
    assert [s["x"] for s in snap] == [0, 1, 2]
    assert snap.fingerprint == stage.fingerprint_as(snap, namings[0]).digest
    assert (
        snap.fingerprint_parts["format"] == stage.fingerprint_as(snap, namings[0]).parts["format"]
    )
    snap.close()


def test_a_miss_looks_for_each_earlier_naming_once_and_a_hit_for_none(tmp_path: Path) -> None:
    store = simulated_store(tmp_path / "root", ttfb=0.0, record=True)
    stage = snapstore.snapshot(tiny, root=store)
    snap = stage(3)
    earlier = {stage.fingerprint_as(snap, n).digest for n in earlier_namings(FORMAT_VERSION)}

    def lookups() -> list[str]:
        names = [r.path.rsplit("/", 2)[-2] for r in store.fs.trace if r.path.endswith("/COMMIT")]
        return sorted(n for n in names if n in earlier)

    snap.materialize()  # nothing anywhere: computed
    assert lookups() == sorted(earlier)
    store.fs.trace.clear()
    stage(3).materialize()
    assert lookups() == []
    snap.close()


def test_earlier_namings_newest_first() -> None:
    assert earlier_namings(3) == (Naming(3, 2), Naming(3, 1), Naming(2, 1))
    assert earlier_namings(4)[:2] == (Naming(3, 3), Naming(3, 2))  # the next format version
    assert str(Naming(3, 2)) == "format version 2 (fingerprint scheme 3)"


def test_renamed_to_the_current_naming_is_the_fingerprint_itself(tmp_path: Path) -> None:
    rows = snapstore.snapshot(tiny, root=tmp_path)(4)
    pairs = snapstore.snapshot(golden_pairs, root=tmp_path)(rows)
    now = Naming(FINGERPRINT_SCHEME, FORMAT_VERSION)
    upstream = {"rows": rows.call_fingerprint}
    assert pairs._call_fp is not None
    assert renamed(pairs._call_fp, now, upstream) == pairs._call_fp
    assert pairs._stage is not None and pairs._stage.fingerprint_as(pairs, now) == pairs._call_fp
    older = renamed(pairs._call_fp, Naming(3, 1), {"rows": "0" * 32})
    assert older.details["upstream"] == {"rows": "0" * 32}
    assert older.details["format_version"] == 1 and combine_parts(older.parts) == older.digest


def test_upgrade_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="upgrade: expected True or False, found 'yes'"):
        snapstore.StageOptions(upgrade="yes")  # type: ignore[arg-type]
