"""The other workers' metrics (``--workers``): each serves its own registry on a Unix
socket in a private folder (proxy/workers.py), and the worker a scrape lands on reads
them here to answer the sum."""

from __future__ import annotations

import asyncio
import logging

import aiohttp

__all__ = ["peer_metrics"]

log = logging.getLogger("proxy")
_PEER_TIMEOUT_S = 2.0


async def peer_metrics(sockets: tuple[str, ...]) -> list[str]:
    """The other workers' expositions; a worker that does not answer (it is starting
    again) is left out, and ``semif_worker_processes`` shows it."""

    async def one(path: str) -> str | None:
        try:
            async with (
                aiohttp.ClientSession(
                    connector=aiohttp.UnixConnector(path=path),
                    timeout=aiohttp.ClientTimeout(total=_PEER_TIMEOUT_S),
                ) as session,
                session.get("http://worker/metrics") as resp,
            ):
                return await resp.text() if resp.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            log.warning("worker metrics at %s not read: %s", path, exc)
            return None

    found = await asyncio.gather(*(one(path) for path in sockets))
    return [text for text in found if text is not None]
