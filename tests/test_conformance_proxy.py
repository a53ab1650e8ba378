"""The store contract under faults met on the wire (issue 29): every test of
:class:`StoreConformance` on fake-gcs-server (gcsfs) and moto (s3fs) through tests/faultproxy.py,
at the rates of tests/test_fault_proxy.py (5% of requests failing: 3% 503, 1% 429, 1% reset
before; 1% acted-then-reset; 1% bodies cut short), with its ``RetryPolicy(attempts=10)``.

Each test's faults are seeded by its name; the proxy draws per request path, and each test's
paths are under a fresh prefix, so the faults met differ from run to run. The processes racing
creates open the store from the URL and options (the proxy's endpoint), so they meet the faults
too, under the default retry policy. The faults met are counted per store; the last test checks
that the class's tests did meet some, and meets some itself.

Both run in CI: GCS requests are retried by snapstore's rules (snapstore/storage/gcs.py), not
after gcsfs' 1-2 s sleeps, which made the GCS variants take 37 s.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Iterator

import pytest
from conftest import FaultyRoot
from faultproxy import ProxyFaults
from test_fault_proxy import POLICY, RATES
from test_store_conformance import DATA, Backend, StoreConformance

import snapstore

STORES = ["gcs", "s3"]
MET: Counter[str] = Counter()  # faults injected per store over the class's tests
RAN: Counter[str] = Counter()  # the class's tests run per store


def _faulty(request: pytest.FixtureRequest, where: str) -> FaultyRoot:
    faulty: FaultyRoot = request.getfixturevalue(f"{where}_faulty")
    return faulty


@pytest.fixture(params=STORES)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    where = request.param
    faulty = _faulty(request, where)
    seed = zlib.crc32(request.node.name.encode()) & 0xFFFF  # stable across runs, unlike hash()
    faulty.proxy.faults = ProxyFaults(seed=seed, **RATES)
    store = snapstore.open_store(faulty.url, **faulty.storage_options, retry=POLICY)
    yield Backend(store, faulty.url, faulty.storage_options)
    store.close()
    faulty.proxy.faults = ProxyFaults()
    MET[where] += sum(faulty.proxy.injected.values())
    RAN[where] += 1


class TestStoresThroughTheFaultProxy(StoreConformance):
    """Every test of the contract, on GCS and S3 through the fault proxy."""


@pytest.mark.parametrize("where", STORES)
def test_faults_were_met(where: str, request: pytest.FixtureRequest) -> None:
    """Runs last in the file: the class's tests on this store met faults (when they ran in this
    session), and a few contract operations here meet them and come out exact."""
    if RAN[where]:
        print(f"\n{where}: {RAN[where]} contract tests met {MET[where]} faults")
        assert MET[where] > 0, f"the contract tests on {where} met no fault"
    faulty = _faulty(request, where)
    faulty.proxy.faults = ProxyFaults(seed=29, **RATES)
    store = snapstore.open_store(faulty.url, **faulty.storage_options, retry=POLICY)
    try:
        # Rounds of about 40 requests until faults were met (about 6% of requests meet one):
        # at most 25 rounds, so that a run meeting none fails rather than loops.
        rounds = 0
        while rounds < 25 and (rounds < 2 or not faulty.proxy.injected):
            top = f"met/{rounds}"
            for k in range(10):
                store.write_bytes(f"{top}/{k}", DATA[k:])
            assert store.list_dir(top) == sorted(str(k) for k in range(10))
            for k in range(10):
                assert bytes(store.read_bytes(f"{top}/{k}")) == DATA[k:]
                assert bytes(store.read_range(f"{top}/{k}", 3, 50)) == DATA[k + 3 : k + 53]
            assert store.create_if_absent(f"{top}/COMMIT", b"mine") is True
            assert store.create_if_absent(f"{top}/COMMIT", b"theirs") is False
            store.remove_tree(top)
            assert not store.exists(f"{top}/0") and store.list_dir(top) == []
            rounds += 1
    finally:
        store.close()
        faulty.proxy.faults = ProxyFaults()
    print(f"{where}: {faulty.proxy.requests} requests, faults {dict(faulty.proxy.injected)}")
    assert sum(faulty.proxy.injected.values()) > 0, "no fault was injected"
