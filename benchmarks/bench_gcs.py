"""Read a snapshot through gcsfs from fake-gcs-server behind a real 50 ms time-to-first-byte.

The whole HTTP stack is real: gcsfs (aiohttp) -> a TCP proxy on 127.0.0.1 that holds the first
byte of every response for ``--ttfb`` -> fake-gcs-server (in memory). Each workload is written
once to the emulator and once to a local directory, then one shuffled epoch is read from each:
the local read, gcsfs with no added latency, and gcsfs behind the proxy. Figures are ratios
within one run (the machine is shared; the client, the proxy and the server share 2 cores).

    python benchmarks/bench_gcs.py                 # scale 0.25 of bench_format's sizes
    python benchmarks/bench_gcs.py --scale 0.02    # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from bench_format import BATCH, SIZES, WORKLOADS  # noqa: E402
from servers import free_port, running_fake_gcs  # noqa: E402

import snapstore  # noqa: E402


class FirstByteProxy:
    """A TCP proxy that delays the first byte of each response by ``delay`` seconds.

    A response is what the server sends after the client last sent something; HTTP/1.1 clients
    wait for a response before reusing a connection, so this is one delay per request.
    """

    def __init__(self, upstream_port: int, delay: float) -> None:
        self.upstream_port = upstream_port
        self.delay = delay
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ttfb-proxy", daemon=True)

    def __enter__(self) -> FirstByteProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port, backlog=512)
        )
        self._ready.set()
        self._loop.run_forever()
        server.close()
        for task in asyncio.all_tasks(self._loop):
            task.cancel()
        self._loop.run_until_complete(asyncio.sleep(0))

    async def _serve(self, client_r: Any, client_w: Any) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.close()
            return
        asked = asyncio.Event()

        async def requests() -> None:
            while data := await client_r.read(1 << 16):
                asked.set()
                up_w.write(data)
                await up_w.drain()
            up_w.close()

        async def responses() -> None:
            while data := await up_r.read(1 << 16):
                if asked.is_set():
                    asked.clear()
                    await asyncio.sleep(self.delay)
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        await asyncio.gather(requests(), responses(), return_exceptions=True)


def epoch(root: Any, fingerprint: str, **options: Any) -> dict[str, Any]:
    """Read one shuffled epoch; samples/s and the reader's stats."""
    with snapstore.open(fingerprint, root=snapstore.open_store(root, **options)) as snap:
        reader = snap.batches(BATCH, shuffle=True)
        began = time.perf_counter()
        samples = sum(len(next(iter(b.values()))) for b in reader)
        seconds = time.perf_counter() - began
        return {"rate": samples / seconds, "seconds": seconds, "stats": reader.stats()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=0.25, help="multiply bench_format sizes")
    parser.add_argument("--ttfb", type=float, default=0.05, help="proxy delay in seconds")
    parser.add_argument("--tmp", default=None, help="scratch directory for the local copies")
    args = parser.parse_args()
    rows: dict[str, dict[str, str]] = {}
    with running_fake_gcs() as gcs, tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        port = int(gcs.endpoint.rsplit(":", 1)[1])
        with FirstByteProxy(port, args.ttfb) as proxy:
            for name, make in WORKLOADS.items():
                n = max(1000, int(SIZES[name] * args.scale))
                url, options = gcs.root(f"bench-{name}")

                def stage(n: int, make: Any = make) -> Iterator[dict[str, Any]]:
                    return make(n)  # type: ignore[no-any-return]

                stage.__qualname__ = f"bench_gcs.{name}"
                local = snapstore.snapshot(stage, root=Path(tmp) / name)(n)
                local.materialize()
                remote = snapstore.snapshot(stage, root=snapstore.open_store(url, **options))(n)
                began = time.perf_counter()
                remote.materialize()
                upload = time.perf_counter() - began
                fp = local.fingerprint
                slow = dict(options, endpoint_url=f"http://127.0.0.1:{proxy.port}")
                results = {
                    "local": epoch(Path(tmp) / name, fp),
                    "gcs": epoch(url, fp, **options),
                    "gcs+ttfb": epoch(url, fp, **slow),
                }
                stats = results["gcs+ttfb"]["stats"]
                rows[name] = {
                    "samples": f"{n:,}",
                    "write to the emulator (s)": f"{upload:.2f}",
                    "local epoch (samples/s)": f"{results['local']['rate']:,.0f}",
                    "gcsfs, no added latency (samples/s)": f"{results['gcs']['rate']:,.0f}",
                    f"gcsfs, {args.ttfb * 1e3:.0f} ms first byte (samples/s)": (
                        f"{results['gcs+ttfb']['rate']:,.0f}"
                    ),
                    "  ttfb / local": (
                        f"{results['gcs+ttfb']['rate'] / results['local']['rate']:.0%}"
                    ),
                    "  ttfb / gcsfs no latency": (
                        f"{results['gcs+ttfb']['rate'] / results['gcs']['rate']:.0%}"
                    ),
                    "  requests, mean latency (ms)": (
                        f"{stats.requests}, {stats.latency_mean * 1e3:.0f}"
                    ),
                    "  mean in flight": f"{stats.concurrency:.1f}",
                }
                local.close()
                remote.close()
    names = list(rows)
    labels = list(rows[names[0]])
    print(f"# gcsfs -> first-byte proxy -> fake-gcs-server, scale {args.scale}, batch {BATCH}\n")
    print(f"{'':44}" + "".join(f"{n:>14}" for n in names))
    for label in labels:
        print(f"{label:44}" + "".join(f"{rows[n].get(label, ''):>14}" for n in names))


if __name__ == "__main__":
    main()
