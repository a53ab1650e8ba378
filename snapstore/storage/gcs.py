"""GCS through gcsfs, each request retried by snapstore's rules instead of gcsfs' own.

gcsfs retries every request up to 6 times, sleeping 1-2 s before the second try, then 2-3 s,
4-5 s... (its ``retry_request`` decorator; nothing can set it per filesystem). Against a bucket
that drops 1 request in 20, one such sleep makes a one-second job take three. These classes
run the undecorated request instead, retried here:

- the same failures gcsfs retries (HTTP 408, 429, 5xx, dropped connections, checksum
  mismatches), never a 404 or another answer;
- up to :data:`REQUEST_ATTEMPTS` tries, after full-jitter waits that grow four-fold from the
  store's :class:`~snapstore.storage.retry.RetryPolicy` ``base`` (0.05 s: 0.05, 0.2, 0.8,
  3.2, 12.8 s at most, so a lone fault costs milliseconds and a throttling bucket is still
  left alone for seconds);
- within a :class:`~snapstore.storage.retry.RetryBudget` of this filesystem's (one per process
  and set of options, as fsspec caches instances), so that readers do not retry in lockstep;
- 429 and 503 answers retried here counted in :attr:`throttles`, which the store adds to its
  own (the last, given to the store, it counts itself) so that the prefetcher slows down
  (gcsfs' retries hid them).

What is still failing after the last try goes to the store, which retries the whole operation
under its policy (:meth:`~snapstore.storage.fsspec_store.FsspecStore._call`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from typing import Any

import aiohttp
import gcsfs.core  # type: ignore[import-untyped]
import google.auth.exceptions
import requests
from gcsfs.extended_gcsfs import ExtendedGcsFileSystem  # type: ignore[import-untyped]
from gcsfs.retry import ChecksumError, HttpError, is_retriable  # type: ignore[import-untyped]

from ..oldpaths import historic_name
from .retry import RetryPolicy, is_throttled

__all__ = ["REQUEST_ATTEMPTS", "ExtendedGCSFileSystem", "GCSFileSystem", "gcs_filesystem"]

log = logging.getLogger(historic_name(__name__))

REQUEST_ATTEMPTS = 6
"""Tries of one request, the first included (gcsfs' own count)."""
_GROWTH = 4.0  # each wait's bound is this many times the one before
_LONGEST = 32.0  # seconds: the longest wait (gcsfs' and Google's guidance)
_FAILURES = (
    HttpError,
    ChecksumError,
    aiohttp.ClientError,
    requests.exceptions.RequestException,
    google.auth.exceptions.GoogleAuthError,
)
_once = gcsfs.core.GCSFileSystem._request.__wrapped__  # one try, without gcsfs' retries


class _Retried:
    """The request method of a gcsfs filesystem, retried by snapstore's rules (see module)."""

    def __init__(self, *args: Any, snapstore_retry: RetryPolicy | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.request_policy = snapstore_retry if snapstore_retry is not None else RetryPolicy()
        self.request_budget = self.request_policy.new_budget()
        self.throttles = 0
        """429 and 503 answers retried here (the store counts those it is given)."""

    def request_wait(self, attempt: int) -> float:
        """Seconds before try ``attempt + 1`` (``attempt`` >= 1 tries failed)."""
        bound = min(_LONGEST, self.request_policy.base * _GROWTH ** (attempt - 1))
        return random.uniform(0.0, bound)

    async def _request(self, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        for attempt in itertools.count(1):
            try:
                result = await _once(self, method, path, *args, **kwargs)
            except _FAILURES as exc:
                if isinstance(exc, HttpError) and exc.code == 400 and "requester pays" in str(exc):
                    raise ValueError(
                        f"bucket of {path} is requester pays: open the store with "
                        "requester_pays=True (a storage option) to be billed for its requests"
                    ) from exc
                if not self._retry(exc, attempt):
                    raise  # the store counts it, if a throttle, and may try again
                if is_throttled(exc):
                    self.throttles += 1
                wait = self.request_wait(attempt)
                log.debug("snapstore: %s %s failed (%r); try %d in %.3f s", method, path, exc,
                          attempt + 1, wait)  # fmt: skip
                await asyncio.sleep(wait)
                continue
            if self.request_budget is not None:
                self.request_budget.deposit()
            return result
        raise AssertionError("unreachable: the loop returns or raises")

    def _retry(self, exc: BaseException, attempt: int) -> bool:
        """Whether a failed try is tried again."""
        if attempt >= REQUEST_ATTEMPTS or not is_retriable(exc):
            return False
        if getattr(exc, "code", None) == 404 or getattr(exc, "status", None) == 404:
            return False
        return self.request_budget is None or self.request_budget.withdraw()


class GCSFileSystem(_Retried, gcsfs.core.GCSFileSystem):  # type: ignore[misc]
    """``gcsfs.core.GCSFileSystem`` with snapstore's request retries (an emulator, or any
    ``endpoint_url``)."""


class ExtendedGCSFileSystem(_Retried, ExtendedGcsFileSystem):  # type: ignore[misc]
    """gcsfs' default class (zonal and hierarchical buckets) with snapstore's request
    retries."""


def gcs_filesystem(options: dict[str, Any], policy: RetryPolicy, *, extended: bool) -> Any:
    """A gcsfs filesystem with ``options`` whose requests are retried under ``policy``:
    gcsfs' default class if ``extended``, else the plain one (an emulator or ``endpoint_url``:
    the extended class first asks over gRPC for the bucket's layout, which they never answer)."""
    cls = ExtendedGCSFileSystem if extended else GCSFileSystem
    return cls(**options, snapstore_retry=policy)
