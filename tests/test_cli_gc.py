"""`snapstore gc`, `rm` and `ls` filters: policies with a fake clock, pins, the GCS emulator."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import snapstore
from snapstore.cli.main import main
from snapstore.manage.gc import Policy, last_used, select_snapshots
from snapstore.storage.store import LocalStore, Store

DAY = 86400.0
NOW = 1_800_000_000.0


def info(fp: str, stage: str, created_days_ago: float, read_days_ago: float | None, size: int,
         readers: int = 0) -> dict:  # fmt: skip
    def iso(days: float) -> str:
        import datetime as dt

        return dt.datetime.fromtimestamp(NOW - days * DAY, dt.UTC).isoformat(timespec="seconds")

    return {
        "fingerprint": fp,
        "stage": stage,
        "state": "committed",
        "created_at": iso(created_days_ago),
        "last_read": iso(read_days_ago) if read_days_ago is not None else None,
        "bytes": size,
        "readers": readers,
    }


INFOS = [
    info("a" * 32, "prep.tok", 30, 1, 100),  # old but read yesterday
    info("b" * 32, "prep.tok", 20, None, 200),  # never read, 20 days old
    info("c" * 32, "prep.tok", 10, 9, 300),
    info("d" * 32, "prep.img", 40, None, 400, readers=1),  # old, but open right now
    info("e" * 32, "prep.img", 2, 2, 500),
]


def chosen(policy: Policy) -> list[str]:
    return [i["fingerprint"][0] for i, _ in select_snapshots(INFOS, policy, now=NOW)]


def test_older_than_counts_reads_and_never_takes_an_open_snapshot() -> None:
    assert chosen(Policy(older_than=7 * DAY)) == ["b", "c"]  # least recently used first
    assert chosen(Policy(older_than=0)) == ["b", "c", "e", "a"]


def test_keep_last_per_stage_keeps_the_most_recently_used() -> None:
    # tok keeps a: the oldest, but read yesterday (a rollback), before the newer c and b that
    # nobody reads any more; img keeps e (d is open).
    assert chosen(Policy(keep_last=1)) == ["b", "c"]
    assert chosen(Policy(keep_last=2)) == ["b"]
    assert chosen(Policy(keep_last=0)) == ["b", "c", "e", "a"]
    reasons = dict((i["fingerprint"][0], r) for i, r in select_snapshots(INFOS, Policy(
        keep_last=1), now=NOW))  # fmt: skip
    assert reasons["c"] == "not among the 1 most recently used of stage prep.tok"


def test_last_used_is_the_later_of_the_last_read_and_the_creation() -> None:
    a, b = INFOS[:2]
    assert last_used(a) == NOW - 1 * DAY  # read after it was created
    assert last_used(b) == NOW - 20 * DAY  # never read: created
    assert last_used({"fingerprint": "x"}) == 0.0
    # Reads in the same hour: the more recently created is kept.
    twins = [info("f" * 32, "s", 3, 1, 1), info("g" * 32, "s", 2, 1, 1)]
    assert [i["fingerprint"][0] for i, _ in select_snapshots(twins, Policy(keep_last=1),
                                                            now=NOW)] == ["f"]  # fmt: skip


def test_max_size_removes_least_recently_used_until_it_fits() -> None:
    # 1100 bytes not open; d (400, open) is kept and not counted as removable.
    assert chosen(Policy(max_size=600)) == ["b", "c"]
    assert chosen(Policy(max_size=10_000)) == []
    reasons = dict((i["fingerprint"][0], r) for i, r in select_snapshots(INFOS, Policy(
        older_than=7 * DAY, keep_last=2), now=NOW))  # fmt: skip
    assert reasons["b"].startswith("not used for 20.0 days")


def test_policy_rejects_negative_values() -> None:
    with pytest.raises(ValueError, match="max_size: expected a value >= 0, found -1"):
        Policy(max_size=-1)


def stage(n: int):
    for i in range(n):
        yield {"x": i}


def other(n: int):
    for i in range(n):
        yield {"y": float(i)}


def populate(root: Store) -> tuple[str, str, str]:
    fps = []
    for fn, n in ((stage, 10), (stage, 20), (other, 5)):
        snap = snapstore.snapshot(fn, root=root)(n)
        snap.materialize()
        snap.close()
        fps.append(snap.fingerprint)
    return fps[0], fps[1], fps[2]


def cli(root: Store | str, *args: str, options: dict | None = None) -> tuple[int, str]:
    url = root.url if isinstance(root, Store) else root
    extra = [f"-o{k}={v}" for k, v in (options or {}).items()]
    result = CliRunner().invoke(main, ["--root", url, *extra, *args])
    return result.exit_code, result.output


def test_gc_removes_garbage_and_snapshots_by_policy(store: Store) -> None:
    a, b, c = populate(store)
    crashed = f"{a}/runs/20200101T000000-host-1-00000001"
    store.write_bytes(f"{crashed}/shard-00000.snap", b"x" * 1000)
    code, out = cli(store, "gc", "--dry-run")
    assert code == 0 and f"would remove run       {crashed}" in out
    assert store.exists(crashed)
    code, out = cli(store, "gc", "--older-than", "0s", "--dry-run", "--json")
    planned = json.loads(out)
    assert planned["dry_run"] is True and {s["fingerprint"] for s in planned["snapshots"]} == {
        a,
        b,
        c,
    }
    assert set(planned) == {"root", "dry_run", "garbage", "snapshots", "freed_bytes"}
    assert set(planned["snapshots"][0]) == {"fingerprint", "stage", "bytes", "reason",
                                            "removed", "error"}  # fmt: skip
    # A reader holds b open: gc keeps it, removes the rest.
    reader = snapstore.open(b, root=store)
    assert len(reader) == 20
    code, out = cli(store, "gc", "--older-than", "0s", "--json")
    result = json.loads(out)
    removed = {s["fingerprint"] for s in result["snapshots"] if s["removed"]}
    assert code == 0 and removed == {a, c} and not store.exists(crashed)
    assert [s["x"] for s in reader][-1] == 19  # still readable
    reader.close()
    code, out = cli(store, "ls", "--json")
    assert [s["fingerprint"] for s in json.loads(out)["snapshots"]] == [b]


def test_rm_keeps_an_open_snapshot_unless_forced(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    a, _, _ = populate(store)
    reader = snapstore.open(a, root=store)
    len(reader)
    code, out = cli(store, "rm", a[:10])
    assert code == 1 and "is in use by reader" in out
    code, out = cli(store, "rm", "--dry-run", a[:10])
    assert "would keep (in use)" in out
    code, out = cli(store, "rm", "--force", a[:10])
    assert code == 0 and f"removed {a}" in out
    reader.close()


def test_ls_filters_and_sorts(store: Store) -> None:
    _a, b, c = populate(store)
    code, out = cli(store, "ls", "--stage", "other", "--json")
    assert [s["fingerprint"] for s in json.loads(out)["snapshots"]] == [c]
    code, out = cli(store, "ls", "--sort", "samples", "--json")
    assert [s["samples"] for s in json.loads(out)["snapshots"]] == [5, 10, 20]
    code, out = cli(store, "ls", "--sort", "samples", "--reverse")
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["FINGERPRINT", "STAGE"] and "LAST READ" in lines[0]
    assert lines[1].startswith(b[:12]) and "3 snapshot(s)" in lines[-1]
    code, out = cli(store, "ls", "--larger-than", "1GiB")
    assert code == 0 and "no snapshots" in out
    code, out = cli(store, "ls", "--older-than", "1d", "--json")
    assert json.loads(out)["snapshots"] == []
    code, out = cli(store, "ls", "--larger-than", "lots")
    assert code == 2 and "expected a size such as 500MB" in out
    code, out = cli(store, "gc", "--older-than", "soon")
    assert code == 2 and "expected a duration such as 7d" in out


def test_gc_keep_last_and_ls_sort_by_last_use_after_a_rollback(tmp_path: Path) -> None:
    """v1, then v2 of a stage; then the job goes back to v1 (a read in a later hour): gc keeps
    v1, which is read, and removes v2, the newer one nobody reads; `ls --sort last-used` lists
    them in that order."""
    store = LocalStore(tmp_path)
    v1, v2 = (
        snapstore.snapshot(stage, root=store, version=v)(10).materialize().fingerprint
        for v in ("1", "2")
    )
    code, out = cli(store, "ls", "--sort", "last-used", "--json")
    assert [s["fingerprint"] for s in json.loads(out)["snapshots"]] == [v1, v2]
    # A reader opening v1 records the hour; the next hour stands for a read after v2 was made
    # (reads are recorded to the hour, and v2 was created in this one).
    hour = dt.datetime.fromtimestamp(time.time() + 3600, dt.UTC).strftime("%Y%m%dT%H")
    store.write_bytes(f"{v1}/pins/read-{hour}", b"")
    code, out = cli(store, "ls", "--sort", "last-used", "--json")
    assert [s["fingerprint"] for s in json.loads(out)["snapshots"]] == [v2, v1]
    code, out = cli(store, "gc", "--keep-last", "1", "--json")
    assert code == 0, out
    removed = json.loads(out)["snapshots"]
    assert [s["fingerprint"] for s in removed] == [v2] and removed[0]["removed"]
    assert removed[0]["reason"] == "not among the 1 most recently used of stage test_cli_gc.stage"
    code, out = cli(store, "ls", "--json")
    assert [s["fingerprint"] for s in json.loads(out)["snapshots"]] == [v1]


def test_ls_gc_on_the_gcs_emulator(gcs_root: tuple[str, dict]) -> None:
    url, options = gcs_root
    store = snapstore.open_store(url, **options)
    a, b, c = populate(store)
    code, out = cli(url, "ls", "--json", options=options)
    assert code == 0, out
    assert {s["fingerprint"] for s in json.loads(out)["snapshots"]} == {a, b, c}
    code, out = cli(url, "gc", "--keep-last", "1", "--json", options=options)
    assert code == 0, out
    removed = [s for s in json.loads(out)["snapshots"] if s["removed"]]
    assert len(removed) == 1 and removed[0]["fingerprint"] in (a, b)
    code, out = cli(url, "ls", "--json", options=options)
    assert len(json.loads(out)["snapshots"]) == 2


def test_gc_dry_run_frees_what_the_real_run_frees(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    a, _, _ = populate(store)
    store.write_bytes(f"{a}/runs/20200101T000000-host-1-00000001/shard-00000.snap", b"x" * 999)
    store.write_bytes("notes/todo.txt", b"not a snapshot")
    store.remove_tree("notes/todo.txt")  # an empty folder that is not ours
    _, out = cli(store, "gc", "--keep-last", "1", "--dry-run", "--json")
    planned = json.loads(out)["freed_bytes"]
    _, out = cli(store, "gc", "--keep-last", "1", "--json")
    assert json.loads(out)["freed_bytes"] == planned
    assert store.is_dir("notes")  # gc judges snapshot directories only


def test_info_verify_fails_on_a_damaged_block(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    a, _, _ = populate(store)
    code, out = cli(store, "info", a[:10], "--verify")
    assert code == 0 and "every block verified" in out
    reader = snapstore.open(a, root=store)._open()
    shard = tmp_path / reader.shard_paths[0]
    data = bytearray(shard.read_bytes())
    data[int(reader.index[0]["offset"]) + 3] ^= 0xFF
    shard.write_bytes(bytes(data))
    code, out = cli(store, "info", a[:10], "--verify")
    assert code == 1 and "integrity    FAILED" in out


def test_a_partitioned_snapshot_part_written_is_listed_and_removable(tmp_path: Path) -> None:
    from snapstore.storage import claims
    from snapstore.write.partitions import partition_dir, write_partition

    store = LocalStore(tmp_path)
    fp = "a" * 32
    for p in range(3):  # 3 of its partitions committed, then the job was killed
        write_partition(store, fp, p, lambda p=p: ({"x": i} for i in range(p, p + 2)))

    def ls() -> tuple[str, dict]:
        text = CliRunner().invoke(main, ["--root", str(tmp_path), "ls"])
        data = CliRunner().invoke(main, ["--root", str(tmp_path), "ls", "--json"])
        assert text.exit_code == 0 and data.exit_code == 0, text.output + data.output
        return text.output, json.loads(data.output)["snapshots"][0]

    text, entry = ls()
    assert "incomplete (3 partition(s) committed)" in text
    assert entry["state"] == "incomplete" and entry["partitions_committed"] == 3
    claim, _ = claims.acquire(store, partition_dir(fp, 3), lease=60.0)
    assert claim is not None  # a job is computing partition 3
    text, entry = ls()
    assert entry["state"] == "writing" and "3 partition(s) committed)" in text, text
    claim.release()
    removed = CliRunner().invoke(main, ["--root", str(tmp_path), "rm", fp[:8]])
    assert removed.exit_code == 0, removed.output
    assert not (tmp_path / fp).exists()
