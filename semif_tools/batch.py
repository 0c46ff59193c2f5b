"""``python -m semif_tools batch IN.jsonl OUT.jsonl``: a file of decisions through a running proxy.

Each input line is a System One request (``state`` + ``questions{}``), an OpenAI
Decisions request (``input`` + ``questions[]``) or a chat request (``messages``,
usually with ``semif``), with an optional ``id`` (the line number, from 1, when
absent; ids must be unique). Each output line is ``{"id", "status", "answer"}`` or
``{"id", "status", "error"}``: one bad line never stops the job. OUT is appended
line by line (locked against a second job), so ``--resume`` skips the ids already
settled in it: answered (200), or refused for good (a 4xx other than 429, a line
that is not a request); lines that failed for a passing reason (429, 5xx, the
proxy unreachable) are asked again, and the last record of an id is the one that
counts. A torn last line left by a kill is cut off first. Each request goes through
the tools' retry policy (``client.py``: 429, 502, 503 and 504 and the proxy
unreachable are retried, after their ``Retry-After`` when longer than the back-off);
a timeout is recorded, not retried. Each request asks the proxy for a deadline
(``X-Semif-Deadline``, ``--deadline``: 90% of ``--timeout`` unless given), so a line
on a slow model is not held to the proxy's real-time default (50 s), and the proxy's
504 (retried) comes before the client gives up (recorded); the proxy cuts it to its
maximum. A progress bar (rate, time left) goes to stderr
(``progress.py``) and a summary at the end: outcomes, latency p50/p95, label mass and
routes. The exit status is 0 when every line's last record is a 200.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx
import orjson

from .calibrate.stats import quantile
from .client import async_client, send_async
from .progress import Bar

__all__ = [
    "Job",
    "Line",
    "read_lines",
    "done_ids",
    "settled",
    "last_records",
    "answer_facts",
    "summary_lines",
    "run",
    "main",
]

_DEFAULT_CONCURRENCY = 4
_JSON = {"Content-Type": "application/json"}
DEADLINE_HEADER = "X-Semif-Deadline"  # proxy/deadlines.py
_DEADLINE_SHARE = 0.9  # of --timeout: the deadline asked for when --deadline is not given


@dataclass(frozen=True)
class Line:
    id: Any
    path: str  # the proxy route it goes to
    body: bytes | None  # None: the line could not be read; ``error`` says why
    error: str = ""


def _key(value: Any) -> str:
    return orjson.dumps(value).decode()


def read_lines(path: Path) -> Iterator[Line]:
    """The input's requests, in order; blank lines skipped, unreadable ones as errors."""
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                yield Line(number, "", None, f"line {number} is not JSON: {exc}")
                continue
            if not isinstance(body, dict):
                yield Line(number, "", None, f"line {number} is not a JSON object")
                continue
            ident = body.pop("id", number)
            if "messages" in body:
                route = "/v1/chat/completions"
            elif "state" in body and isinstance(body.get("questions"), dict):
                route = "/v1/systemone"
            elif "input" in body and isinstance(body.get("questions"), list):
                route = "/v1/decisions"
            else:
                yield Line(
                    ident,
                    "",
                    None,
                    f"line {number} is neither a System One request "
                    "(state, questions{}), a Decisions request (input, questions[]) nor "
                    "a chat request (messages)",
                )
                continue
            yield Line(ident, route, orjson.dumps(body))


def settled(record: dict[str, Any]) -> bool:
    """Whether asking again would not change a record: answered, or refused for good."""
    status = record.get("status")
    if status == 200:
        return True
    if isinstance(status, int):
        return 400 <= status < 500 and status != 429
    return (record.get("error") or {}).get("code") == "invalid_line"


def last_records(out: Path) -> dict[str, dict[str, Any]]:
    """Each id's last record in OUT (ids as their JSON text), after cutting off a torn
    last line (a line without its newline, left by a kill mid-write)."""
    if not out.exists():
        return {}
    data = out.read_bytes()
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        with out.open("r+b") as f:
            f.truncate(keep)
        data = data[:keep]
    records: dict[str, dict[str, Any]] = {}
    for raw in data.splitlines():
        try:
            record = orjson.loads(raw)
            records[_key(record["id"])] = record
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue  # not one of ours: left as it is
    return records


def done_ids(out: Path) -> set[str]:
    """The ids OUT has settled (``settled``): what ``--resume`` skips."""
    return {key for key, record in last_records(out).items() if settled(record)}


def answer_facts(route: str, answer: dict[str, Any]) -> tuple[list[float], list[str]]:
    """The label masses and routes an answer reports (System One: per question)."""
    if route == "/v1/systemone":
        answers = list((answer.get("answers") or {}).values())
        return (
            [a["x_label_mass"] for a in answers if "x_label_mass" in a],
            [a["x_route"] for a in answers if a.get("x_route")],
        )
    semif = answer.get("semif") or {}
    return (
        [semif["label_mass"]] if "label_mass" in semif else [],
        [semif["route"]] if semif.get("route") else [],
    )


@dataclass
class Job:
    """What the job has done so far: the facts its summary sums up."""

    total: int
    done: int = 0
    outcomes: Counter = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    masses: list[float] = field(default_factory=list)
    routes: Counter = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)
    skipped: int = 0  # lines OUT already answered (--resume)

    def record(
        self, status: int | None, latency: float | None, route: str, answer: dict[str, Any] | None
    ) -> None:
        self.done += 1
        self.outcomes["ok" if status == 200 else f"status {status}" if status else "error"] += 1
        if latency is not None:
            self.latencies.append(latency)
        if answer is not None:
            masses, routes = answer_facts(route, answer)
            self.masses += masses
            self.routes.update(routes)


def summary_lines(job: Job) -> list[str]:
    """The end-of-job lines: outcomes, latency, label mass and routes."""
    spent = time.monotonic() - job.started
    lines = [
        f"{job.done} lines in {spent:.1f}s ({job.done / max(spent, 1e-9):.1f}/s)"
        + (f", {job.skipped} already done (--resume)" if job.skipped else "")
        + ": "
        + ", ".join(f"{k} {v}" for k, v in sorted(job.outcomes.items()))
    ]
    if job.latencies:
        lines.append(
            f"latency p50 {1e3 * quantile(job.latencies, 0.5):.0f} ms, "
            f"p95 {1e3 * quantile(job.latencies, 0.95):.0f} ms"
        )
    if job.masses:
        lines.append(
            "label mass p5 / p50 / p95: "
            + " / ".join(f"{quantile(job.masses, q):.3f}" for q in (0.05, 0.5, 0.95))
        )
    if job.routes:
        lines.append("routes: " + ", ".join(f"{k} {v}" for k, v in sorted(job.routes.items())))
    return lines


async def _send(
    http: httpx.AsyncClient, line: Line, headers: dict[str, str] = _JSON
) -> tuple[dict[str, Any], int | None, float | None, dict[str, Any] | None]:
    """The output record for one line, its status, latency (of the last attempt) and answer."""
    if line.body is None:
        return (
            {
                "id": line.id,
                "status": None,
                "error": {"code": "invalid_line", "message": line.error},
            },
            None,
            None,
            None,
        )
    try:
        resp = await send_async(http, "POST", line.path, content=line.body, headers=headers)
    except httpx.TimeoutException:
        return (
            {
                "id": line.id,
                "status": None,
                "error": {"code": "timeout", "message": "no answer within the timeout"},
            },
            None,
            None,
            None,
        )
    except httpx.RequestError as exc:  # after the retry policy's last attempt; a broken body too
        return (
            {
                "id": line.id,
                "status": None,
                "error": {
                    "code": "unreachable",
                    "message": f"no answer could be read from the proxy: {exc!r}",
                },
            },
            None,
            None,
            None,
        )
    status, raw, latency = resp.status_code, resp.content, resp.elapsed.total_seconds()
    try:
        body = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        body = {"message": raw[:500].decode("utf-8", "replace")}
    if status == 200:
        return {"id": line.id, "status": status, "answer": body}, status, latency, body
    return {"id": line.id, "status": status, "error": body}, status, latency, None


async def _server_slots(http: httpx.AsyncClient) -> int | None:
    """llama-server's parallel slots, from its ``/props`` (relayed by the proxy); asked
    once, not retried: without it the job runs at the default concurrency."""
    try:
        resp = await http.get("/props")
        if resp.status_code != 200:
            return None
        slots = resp.json().get("total_slots")
        return int(slots) if isinstance(slots, int) and slots > 0 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None


def _unique(lines: list[Line]) -> None:
    seen: set[str] = set()
    for line in lines:
        key = _key(line.id)
        if key in seen:
            raise ValueError(f"the id {key} is on more than one line: ids must be unique")
        seen.add(key)


async def run(
    source: Path,
    out: Path,
    url: str,
    *,
    concurrency: int | None = None,
    resume: bool = False,
    api_key: str | None = None,
    timeout_s: float = 600.0,
    deadline_s: float | None = None,
    stream: TextIO | None = None,
) -> tuple[Job, bool]:
    """Answer every line of ``source`` not yet settled in ``out`` (with ``resume``),
    appending; also whether every line's last record is now a 200. ``deadline_s``: asked
    of the proxy for each line (None: 90% of ``timeout_s``)."""
    deadline = _DEADLINE_SHARE * timeout_s if deadline_s is None else deadline_s
    headers = {**_JSON, DEADLINE_HEADER: f"{deadline:g}"}
    everything = list(read_lines(source))
    _unique(everything)
    if not resume and out.exists() and out.stat().st_size:
        raise FileExistsError(f"{out} exists: pass --resume to continue it, or remove it")
    with out.open("ab") as sink:
        try:
            fcntl.flock(sink, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FileExistsError(f"another batch job is writing {out}") from None
        done = done_ids(out) if resume else set()
        lines = [line for line in everything if _key(line.id) not in done]
        job = Job(len(lines), skipped=len(done))
        async with async_client(url, api_key=api_key, timeout_s=timeout_s) as http:
            width = concurrency or await _server_slots(http) or _DEFAULT_CONCURRENCY
            queue = iter(lines)

            with Bar(len(lines), "batch", unit="line", stream=stream) as bar:

                async def worker() -> None:
                    for line in queue:
                        record, status, latency, answer = await _send(http, line, headers)
                        sink.write(orjson.dumps(record) + b"\n")
                        sink.flush()  # a kill loses at most the line being written
                        job.record(status, latency, line.path, answer)
                        bar.update(1)

                await asyncio.gather(*(worker() for _ in range(width)))
    final = last_records(out)
    complete = all(final.get(_key(line.id), {}).get("status") == 200 for line in everything)
    return job, complete


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m semif_tools batch", description=__doc__.splitlines()[0]
    )
    p.add_argument("input", type=Path, help="JSONL: one System One or chat request per line")
    p.add_argument("output", type=Path, help="JSONL written line by line: id and answer or error")
    p.add_argument("--url", default="http://127.0.0.1:8080", help="the running proxy")
    p.add_argument(
        "--api-key",
        default=os.environ.get("PROXY_API_KEY") or None,
        help="bearer key for the proxy (default: PROXY_API_KEY)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="requests in flight (default: llama-server's slots, from /props)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="skip the ids OUT has settled (answered, or refused for good)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="seconds the proxy may take per line (X-Semif-Deadline; the proxy cuts it to its "
        "--max-decision-deadline-s); default: 90%% of --timeout",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.concurrency is not None and args.concurrency < 1:
        print("batch: --concurrency must be at least 1", file=sys.stderr)
        return 2
    if args.deadline is not None and not args.deadline > 0:
        print("batch: --deadline must be above 0", file=sys.stderr)
        return 2
    try:
        job, complete = asyncio.run(
            run(
                args.input,
                args.output,
                args.url,
                concurrency=args.concurrency,
                resume=args.resume,
                api_key=args.api_key,
                timeout_s=args.timeout,
                deadline_s=args.deadline,
            )
        )
    except (OSError, ValueError) as exc:  # FileExistsError too
        print(f"batch: {exc}", file=sys.stderr)
        return 2
    for line in summary_lines(job):
        print(line)
    return 0 if complete else 1
