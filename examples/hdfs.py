"""HDFS: jobs of a sweep share one snapshot on a Hadoop cluster, through WebHDFS.

Run:  python examples/hdfs.py [--root webhdfs://namenode:9870/user/me/snaps] [--user me]
                              [--jobs 3] [--samples 5000]

With ``--root`` it uses that NameNode's WebHDFS (or an HttpFS gateway's; ``swebhdfs://`` for
HTTPS); ``--user`` is the HDFS user for a cluster without Kerberos. Without it, it starts the
small WebHDFS server of snapstore's tests (``tests/webhdfs_server.py``, over a temporary
directory, on a free port) and stops it at exit. Several processes start the same stage at
once: ``CREATE`` with ``overwrite=false`` lets exactly one of them claim and commit it, and the
others wait and read the winner's snapshot.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

import snapstore

TESTS = Path(__file__).resolve().parent.parent / "tests"

JOB = """
import json, sys, time
import numpy as np
import snapstore

root, options, samples = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
store = snapstore.open_store(root, **options)
calls = 0

@snapstore.snapshot(root=store)
def features(n):
    global calls
    calls += 1
    for i in range(n):
        yield {"id": i, "x": np.full(8, i, np.float32)}

while time.time() < float(sys.argv[4]):
    time.sleep(0.001)
snap = features(samples)
total = sum(int(s["id"]) for s in snap)
print(json.dumps({"fingerprint": snap.fingerprint, "computed": calls, "sum": total}))
snap.close()
"""


@contextlib.contextmanager
def local_webhdfs_server() -> Iterator[str]:
    """The tests' WebHDFS server on 127.0.0.1; yields its ``webhdfs://`` URL."""
    sys.path.insert(0, str(TESTS))
    from webhdfs_server import running_webhdfs

    with running_webhdfs() as server:
        yield server.url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", help="webhdfs://namenode:9870/path (default: a test server)")
    parser.add_argument("--user", help="the HDFS user (clusters without Kerberos)")
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=5000)
    args = parser.parse_args()
    options = {"user": args.user} if args.user else {}
    with contextlib.ExitStack() as stack:
        base = args.root or f"{stack.enter_context(local_webhdfs_server())}/snaps"
        root = f"{base.rstrip('/')}/example-{int(time.time())}"
        store = snapstore.open_store(root, **options)
        print(f"root {store.url}: atomic create-if-absent: {store.atomic_create}")
        script = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "job.py"
        script.write_text(JOB)  # a file, so that the stage's source is fingerprinted
        start = time.time() + 2.0  # the jobs start together, once all are up
        cmd = [
            sys.executable,
            str(script),
            root,
            json.dumps(options),
            str(args.samples),
            str(start),
        ]
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(args.jobs)]
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=300)
            if proc.returncode != 0:
                sys.exit(f"hdfs.py: a job failed (exit {proc.returncode})")
            results.append(json.loads(out))
        computed = sum(r["computed"] for r in results)
        print(f"{args.jobs} jobs started the stage at once; it ran {computed} time(s)")
        fingerprints = {r["fingerprint"] for r in results}
        sums = {r["sum"] for r in results}
        if len(fingerprints) != 1 or len(sums) != 1 or computed != 1:
            print(f"UNEXPECTED: {results}")
        fingerprint = fingerprints.pop()
        with snapstore.open(fingerprint, root=store) as snap:
            began = time.perf_counter()
            with snap.batches(256, shuffle=True, seed=0) as reader:
                rows = sum(len(batch["id"]) for batch in reader)
            took = time.perf_counter() - began
            first = np.asarray(snap[0]["x"]).tolist()
        print(f"fingerprint {fingerprint[:12]}: {rows} samples read shuffled in {took:.2f} s")
        print(f"sample 0: x = {first}")
        store.remove_tree("")  # the example cleans up after itself


if __name__ == "__main__":
    main()
