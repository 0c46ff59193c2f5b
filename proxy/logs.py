"""Logging for the proxy's processes: one format, aiohttp's parse errors in one line."""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

__all__ = ["setup_logging"]


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("aiohttp.server").addFilter(_bad_requests_in_one_line)


def _bad_requests_in_one_line(record: logging.LogRecord) -> bool:
    """aiohttp logs a request it cannot parse (answered 400) as an ERROR with a traceback:
    it is the client's mistake, so one WARNING line, the parser's reason cut short."""
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, HttpProcessingError) and exc.code == 400:
        reason = " ".join(str(exc.message).split())[:160]
        record.msg, record.args = "bad HTTP request (answered 400): %s", (reason,)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = record.exc_text = None
    return True
