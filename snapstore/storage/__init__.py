"""Where bytes live: stores, retries, caches, and the leases kept in a store.

The :class:`~snapstore.storage.base.Store` contract (:mod:`~snapstore.storage.base`), its local
(:mod:`~snapstore.storage.local`), fsspec (:mod:`~snapstore.storage.fsspec_store`) and WebHDFS
(:mod:`~snapstore.storage.webhdfs`) implementations, :func:`~snapstore.storage.store.open_store`
that picks one for a root (WebHDFS through a registry, like fsspec's
``known_implementations``), retry and error
translation (:mod:`~snapstore.storage.retry`), the read-through block cache
(:mod:`~snapstore.storage.cache`), simulated latency (:mod:`~snapstore.storage.simulate`),
listing at scale (:mod:`~snapstore.storage.listing`), the per-host block index
(:mod:`~snapstore.storage.hostindex`), carrying a store to another process
(:mod:`~snapstore.storage.travel`), and the leases kept as files in a store: writers' claims
(:mod:`~snapstore.storage.claims`) and readers' pins (:mod:`~snapstore.storage.pins`).

Layer: above :mod:`snapstore.format`; imports only it and :mod:`snapstore.errors`.
"""

from .cache import CachedStore, cached_store
from .pins import ReadGuard, list_pins, live_pins
from .retry import RetryPolicy
from .roots import default_root
from .simulate import simulated_store
from .store import FsspecStore, LocalStore, Store, open_store

__all__ = [
    "CachedStore",
    "FsspecStore",
    "LocalStore",
    "ReadGuard",
    "RetryPolicy",
    "Store",
    "cached_store",
    "default_root",
    "list_pins",
    "live_pins",
    "open_store",
    "simulated_store",
]
