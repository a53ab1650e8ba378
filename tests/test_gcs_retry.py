"""GCS requests retried by snapstore's rules, not gcsfs' fixed 1-2 s, 2 s, 4 s... sleeps
(snapstore/storage/gcs.py): through the fault proxy on fake-gcs-server."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from conftest import FaultyRoot
from faultproxy import ProxyFaults

import snapstore
from snapstore.errors import StoreError
from snapstore.storage import gcs
from snapstore.storage.retry import RetryPolicy
from snapstore.storage.store import FsspecStore

pytest.importorskip("gcsfs")


def _store(faulty: FaultyRoot, name: str, **policy: Any) -> FsspecStore:
    policy = {"base": 0.001, "cap": 0.01, **policy}
    store = snapstore.open_store(
        f"{faulty.url}/{name}", **faulty.storage_options, retry=RetryPolicy(**policy)
    )
    assert isinstance(store, FsspecStore) and isinstance(store.fs, gcs.GCSFileSystem)
    return store


def _waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits snapstore takes between a request's tries (gcsfs' own sleeps never run)."""
    waits: list[float] = []
    wait = gcs._Retried.request_wait

    def recorded(self: Any, attempt: int) -> float:
        waits.append(wait(self, attempt))
        return waits[-1]

    monkeypatch.setattr(gcs._Retried, "request_wait", recorded)
    return waits


def test_a_failed_request_is_retried_quickly_and_throttles_are_counted(
    gcs_faulty: FaultyRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(gcs_faulty, "quick")
    store.write_bytes("a", b"hello")
    waits = _waits(monkeypatch)
    before = store.throttles
    gcs_faulty.proxy.faults = ProxyFaults(seed=3, throttle_rate=0.5, retry_after=0.0)
    for _ in range(30):
        assert store.read_bytes("a") == b"hello"
    met = gcs_faulty.proxy.injected["429"]
    # Each 429 is retried by snapstore, after a wait: by the filesystem, unless it was a
    # request's last try (then the store tries the read again, without this wait).
    assert 0 < met - met // gcs.REQUEST_ATTEMPTS <= len(waits) <= met
    assert all(w <= 0.001 * gcs._GROWTH ** (gcs.REQUEST_ATTEMPTS - 1) for w in waits)
    assert store.throttles - before == met  # the prefetcher sees them


def test_a_missing_file_is_asked_for_once(
    gcs_faulty: FaultyRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(gcs_faulty, "missing")
    waits = _waits(monkeypatch)
    before = gcs_faulty.proxy.requests
    with pytest.raises(FileNotFoundError):
        store.read_bytes("nothing-here")
    assert waits == [] and gcs_faulty.proxy.requests - before == 1


def test_a_store_that_keeps_failing_gives_up_naming_it(
    gcs_faulty: FaultyRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(gcs_faulty, "down", attempts=2)
    store.write_bytes("a", b"x")
    waits = _waits(monkeypatch)
    gcs_faulty.proxy.faults = ProxyFaults(error_rate=1.0)
    before = gcs_faulty.proxy.requests
    with pytest.raises(StoreError, match=r"gs://.*down/a.*503"):
        store.read_bytes("a")
    # REQUEST_ATTEMPTS tries of the request, for each of the store's 2 tries of the read
    assert gcs_faulty.proxy.requests - before == 2 * gcs.REQUEST_ATTEMPTS
    assert len(waits) == 2 * (gcs.REQUEST_ATTEMPTS - 1)
    # the waits grow, from the policy's base
    bounds = [0.001 * gcs._GROWTH**k for k in range(gcs.REQUEST_ATTEMPTS - 1)]
    assert all(w <= b for w, b in zip(waits, bounds * 2, strict=True))


def test_a_spent_budget_stops_the_request_retries(
    gcs_faulty: FaultyRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(gcs_faulty, "budget", attempts=1, budget=2.0, refill=0.0)
    store.write_bytes("a", b"x")
    waits = _waits(monkeypatch)
    gcs_faulty.proxy.faults = ProxyFaults(error_rate=1.0)
    with pytest.raises(StoreError):
        store.read_bytes("a")
    with pytest.raises(StoreError):
        store.read_bytes("a")
    assert len(waits) == 2  # the filesystem's budget held two retries, then none


def test_the_filesystem_travels_with_its_policy(gcs_faulty: FaultyRoot) -> None:
    store = _store(gcs_faulty, "travel", attempts=3)
    fs = pickle.loads(pickle.dumps(store.fs))
    assert type(fs) is gcs.GCSFileSystem and fs.request_policy.attempts == 3
