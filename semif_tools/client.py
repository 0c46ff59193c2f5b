"""The tools' one HTTP client (httpx) and their one retry policy (tenacity).

``client`` and ``async_client`` build the client every tool uses: the proxy's URL as
the base, its bearer key, one timeout, and no pool limit of httpx's own (each tool
bounds its requests in flight itself). ``send`` and ``send_async`` make one request
through the retry policy:

- retried: the answers that say the failure passes, 429 (admission: too many
  decisions in flight and queued) and 503 (llama-server unreachable or still loading),
  both of which the proxy sends with ``Retry-After``, and 502 and 504 (llama-server
  answered something unusable, or not within the deadline): the statuses a batch
  job's ``--resume`` also asks again. Not 500: an unexpected error in the proxy, which
  the same request would meet again. Also retried: the proxy unreachable (a transport
  error: refused, reset, closed), but not a timeout: the request's time is spent, and
  asking again would spend it again.
- waiting, before each new attempt, the longer of an exponential back-off (0.5 s,
  doubling, at most 30 s) and the answer's ``Retry-After`` (seconds or an HTTP date,
  at most 60 s);
- at most 6 attempts; then the last answer is returned (a 429 too: the caller records
  or reports it) or the last transport error raised.
"""

from __future__ import annotations

import email.utils
import time
from typing import Any

import httpx
import tenacity

__all__ = [
    "RETRY_STATUSES",
    "ATTEMPTS",
    "client",
    "async_client",
    "retry_after_s",
    "wait_s",
    "send",
    "send_async",
]

RETRY_STATUSES = frozenset({429, 502, 503, 504})
ATTEMPTS = 6
RETRY_AFTER_CAP_S = 60.0
_BACKOFF = tenacity.wait_exponential(multiplier=0.5, max=30)


def _options(url: str, api_key: str | None, timeout_s: float) -> dict[str, Any]:
    return {
        "base_url": url.rstrip("/"),
        "headers": {"Authorization": f"Bearer {api_key}"} if api_key else {},
        "timeout": timeout_s,
        "limits": httpx.Limits(max_connections=None, max_keepalive_connections=None),
    }


def client(url: str, *, api_key: str | None = None, timeout_s: float = 120.0) -> httpx.Client:
    """The client of a running proxy at ``url`` (use it as a context manager)."""
    return httpx.Client(**_options(url, api_key, timeout_s))


def async_client(
    url: str, *, api_key: str | None = None, timeout_s: float = 120.0
) -> httpx.AsyncClient:
    """The same, for asyncio."""
    return httpx.AsyncClient(**_options(url, api_key, timeout_s))


def retry_after_s(response: httpx.Response) -> float | None:
    """The answer's ``Retry-After`` in seconds (delta-seconds or an HTTP date), at most
    60; None when it has none that can be read."""
    value = response.headers.get("Retry-After", "").strip()
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = max(0.0, when.timestamp() - time.time())
    return min(seconds, RETRY_AFTER_CAP_S)


def wait_s(state: tenacity.RetryCallState) -> float:
    """Seconds before the next attempt: the back-off, or the answer's Retry-After when longer."""
    after = None
    if state.outcome is not None and not state.outcome.failed:
        after = retry_after_s(state.outcome.result())
    return max(_BACKOFF(state), after or 0.0)


def _passing(exc: BaseException) -> bool:
    return isinstance(exc, httpx.TransportError) and not isinstance(exc, httpx.TimeoutException)


def _last(state: tenacity.RetryCallState) -> Any:
    """After the last attempt: its answer, or its exception raised."""
    assert state.outcome is not None
    return state.outcome.result()


_policy = tenacity.retry(
    retry=(
        tenacity.retry_if_exception(_passing)
        | tenacity.retry_if_result(lambda r: r.status_code in RETRY_STATUSES)
    ),
    wait=wait_s,
    stop=tenacity.stop_after_attempt(ATTEMPTS),
    retry_error_callback=_last,
)


@_policy
def send(http: httpx.Client, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """``http.request(method, path, ...)`` through the retry policy."""
    return http.request(method, path, **kwargs)


@_policy
async def send_async(
    http: httpx.AsyncClient, method: str, path: str, **kwargs: Any
) -> httpx.Response:
    """The same, for asyncio."""
    return await http.request(method, path, **kwargs)
