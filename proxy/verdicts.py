"""Self-check verdicts kept across restarts, keyed by what decides them.

A verdict (``decision/selfcheck.py``) says whether one llama.cpp build's kernels give
bit-identical reads on one model, with one set of server flags, on one CPU, for one
read scheme and check prompt. Its cost is fixed in tokens (about 1,100), so on a slow
model it takes tens of seconds; a verdict already reached for the same key is kept:

    key = SHA-256 of {llama-server's identity (build, model, flags: ``Upstream.identity``),
                      the GGUF file's size and mtime when the proxy can see it,
                      this CPU's feature flags, the read scheme, the slots leased,
                      the check's own version}

With a verdict it keeps what the check's reads taught the cost model (``proxy/cost.py``):
they were the many timed steps, short and long, that admission's first estimates rested on.

The store is one JSON file (``--check-verdicts``), read at start and rewritten whole on
each new verdict (a temporary file renamed over it, so a reader never sees half of
one). Proxies that share it (replicas on one host) each add their verdicts to what the
file holds. Only a verdict that reads held is kept: a failed check may come from reads of
other processes batched with it (a relayed generation, a request sent to llama-server
directly), so it is
made again at the next start, and one that could not run decides nothing.

What the key cannot see: llama-server's flags that ``/props`` does not report (``-fa``,
``-ctk``/``-ctv``, ``-b``, threads, GPU offload; ``-ub`` is the proxy's
``--upstream-ubatch``, part of the scheme) and, where llama-server runs on another host
than the proxy, that host's CPU. After changing those, delete the file.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from .decision.selfcheck import CHECK_OPTIONS, CHECK_TEXT, OTHER_TEXT, Check

__all__ = [
    "CHECK_VERSION",
    "MAX_KEPT",
    "Verdicts",
    "cpu_features",
    "file_stamp",
    "this_cpu",
    "verdict_key",
]

log = logging.getLogger(__name__)

MAX_KEPT = 64  # verdicts a file holds; the oldest go first
# The check's prompt and options: another check is another verdict.
CHECK_VERSION = hashlib.sha256(
    orjson.dumps([CHECK_TEXT, OTHER_TEXT, list(CHECK_OPTIONS)])
).hexdigest()[:16]


def cpu_features(cpuinfo: str) -> str:
    """The CPU's feature flags (the first ``flags`` line of ``/proc/cpuinfo``), sorted and
    space-separated: which kernels llama.cpp's CPU backend may pick. "" when absent."""
    for line in cpuinfo.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() in ("flags", "Features"):  # x86, arm64
            return " ".join(sorted(set(value.split())))
    return ""


def this_cpu() -> str:
    """This machine's CPU feature flags (``cpu_features``), "" where /proc is not Linux's."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return cpu_features(f.read())
    except OSError:
        return ""


def file_stamp(path: str) -> dict[str, int]:
    """The GGUF file's size and modification time when this process can see it (``make
    run``, one container with both), else nothing: llama-server's own description of the
    model (its build and ``meta``) identifies it then."""
    if not path:
        return {}
    try:
        stat = os.stat(path)
    except OSError:
        return {}
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def verdict_key(
    identity: Mapping[str, Any],
    *,
    model_file: Mapping[str, int],
    cpu: str,
    scheme: str,
    slots: int,
) -> str:
    """The SHA-256 (hex) of everything that decides a verdict, as the module says."""
    parts = {
        "check": CHECK_VERSION,
        "cpu": cpu,
        "llama_server": identity,
        "model_file": model_file,
        "scheme": scheme,
        "slots": slots,
    }
    return hashlib.sha256(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)).hexdigest()


class Verdicts:
    """The kept verdicts: in memory, and in ``path`` when one is given (None: this process
    keeps them for llama-server's restarts only). ``cpu``: this machine's feature flags
    (``this_cpu``), part of every key."""

    def __init__(self, path: Path | None, cpu: str = ""):
        self._path = path
        self.cpu = cpu
        self._kept: dict[str, dict[str, Any]] = self._read()

    def get(self, key: str) -> Check | None:
        entry = self._kept.get(key) or self._read().get(key)
        if entry is None:
            return None
        return Check(
            str(entry["scheme"]),
            True,
            f"{entry['detail']} (kept from the check at {entry['checked_at']:.0f})",
            float(entry["checked_at"]),
        )

    def costs(self, key: str) -> Mapping[str, Any] | None:
        """What the check's reads taught the cost model (``CostModel.state``), kept with the
        verdict: a start that reads no check has it to estimate with."""
        entry = self._kept.get(key) or self._read().get(key)
        costs = entry.get("costs") if entry else None
        return costs if isinstance(costs, dict) else None

    def put(self, key: str, check: Check, costs: Mapping[str, Any] | None = None) -> None:
        if check.repeatable is not True:
            return
        self._kept = {**self._read(), **self._kept}
        self._kept[key] = {
            "scheme": check.scheme,
            "repeatable": check.repeatable,
            "detail": check.detail,
            "checked_at": check.checked_at,
            **({"costs": dict(costs)} if costs else {}),
        }
        newest = sorted(self._kept.items(), key=lambda kv: kv[1]["checked_at"])[-MAX_KEPT:]
        self._kept = dict(newest)
        if self._path is not None:
            self._write()

    def _read(self) -> dict[str, dict[str, Any]]:
        if self._path is None:
            return {}
        try:
            data = orjson.loads(self._path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, orjson.JSONDecodeError) as exc:
            log.warning("the kept self-check verdicts at %s are unreadable (%s)", self._path, exc)
            return {}
        if not isinstance(data, dict):
            return {}
        return {k: v for k, v in data.items() if _valid(v)}

    def _write(self) -> None:
        assert self._path is not None
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self._path.parent, prefix=".verdicts.")
            with os.fdopen(fd, "wb") as out:
                out.write(orjson.dumps(self._kept, option=orjson.OPT_INDENT_2))
            os.replace(tmp, self._path)
        except OSError as exc:  # a read-only file system keeps them in memory only
            log.warning("could not keep the self-check verdict at %s (%s)", self._path, exc)


def _valid(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("scheme"), str)
        and entry.get("repeatable") is True
        and isinstance(entry.get("detail"), str)
        and isinstance(entry.get("checked_at"), int | float)
    )
