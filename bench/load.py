"""Load and soak on loopback: decisions and plain chat through the proxy, and the
same one-token read sent straight to llama-server, with an asyncio client.

    .venv/bin/python bench/load.py [--duration 10 | --requests N] [--concurrency 1,4,16,64]
    .venv/bin/python bench/load.py --soak 600 [--soak-concurrency 4]

Scenarios: ``systemone`` (one-question System One requests, states taken in
turn from tests/data/tickets.jsonl), ``semif`` (a chat completion with
``semif``), ``direct`` (the same one-token read for that ``semif`` request,
straight to llama-server's chat endpoint; the proxy itself reads through
``/completion``: bench/overhead.py compares both) and ``chat`` (plain chat relayed
untouched, ``max_tokens`` 8). Each reports throughput, p50/p95/p99 of the
successful requests, answers by status, errors (any other status than 200 and
429, and client-side failures), 429s (the proxy's backpressure) on their own,
and the proxy's RSS before and after. Results go to bench/out/load.json (soak: bench/out/soak.json).

The soak runs ``systemone``, ``semif`` and ``chat`` mixed at moderate
concurrency, samples the proxy's RSS every 10 s and compares its growth after
warm-up with ``SOAK_BOUND_MB``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import shlex
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
from _machine import command_line, describe, rss_kb
from _servers import ROOT, llama_server, proxy_process
from overhead import MESSAGES, OPTIONS, direct_body

__all__ = ["Tally", "drive", "summarise", "SOAK_BOUND_MB", "main"]

OUT = ROOT / "bench" / "out"
CHAT = "/v1/chat/completions"
JSON = {"Content-Type": "application/json"}
# A leak of one request or response body (>= ~2 KB) per request passes this
# bound within a few thousand requests; allocator and arena steps do not.
SOAK_BOUND_MB = 20
SOAK_SAMPLE_S = 10


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)  # seconds, status 200 only
    statuses: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)  # client-side exceptions by class


Pick = Callable[[int], tuple[str, bytes, Tally]]


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, tally: Tally) -> None:
    t0 = time.perf_counter()
    try:
        async with session.post(url, data=body, headers=JSON) as r:
            await r.read()
            status = r.status
    except (TimeoutError, aiohttp.ClientError) as exc:
        tally.errors[type(exc).__name__] += 1
        return
    tally.statuses[str(status)] += 1
    if status == 200:
        tally.latencies.append(time.perf_counter() - t0)


async def drive(
    session,
    pick: Pick,
    concurrency: int,
    *,
    duration_s: float | None = None,
    requests: int | None = None,
) -> float:
    """``concurrency`` workers send ``pick(i)`` for i = 0, 1, ... until ``requests``
    are sent or ``duration_s`` has passed (requests in flight then finish).
    Returns the wall time."""
    counter = itertools.count()
    started = time.perf_counter()
    deadline = started + duration_s if duration_s is not None else None

    async def worker() -> None:
        for i in counter:
            if requests is not None and i >= requests:
                return
            if deadline is not None and time.perf_counter() >= deadline:
                return
            await _one(session, *pick(i))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started


def _pct(values: list[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0] * 1e3
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1e3


def summarise(tally: Tally, wall_s: float) -> dict:
    ok = len(tally.latencies)
    return {
        "requests": sum(tally.statuses.values()) + sum(tally.errors.values()),
        "ok": ok,
        "wall_s": round(wall_s, 3),
        "throughput_rps": round(ok / wall_s, 2),
        "p50_ms": _pct(tally.latencies, 50),
        "p95_ms": _pct(tally.latencies, 95),
        "p99_ms": _pct(tally.latencies, 99),
        "statuses": dict(tally.statuses),
        "rejected_429": tally.statuses.get("429", 0),
        "errors": sum(n for s, n in tally.statuses.items() if s not in ("200", "429"))
        + sum(tally.errors.values()),
        "client_errors": dict(tally.errors),
    }


def _bodies(path: Path) -> list[bytes]:
    """System One request bodies from a labelled set, without their ``gold``."""
    rows = [orjson.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [orjson.dumps({k: v for k, v in row.items() if k != "gold"}) for row in rows]


async def _targets(session, proxy_url: str, llama_url: str) -> dict[str, tuple[str, list[bytes]]]:
    semif = orjson.dumps({"messages": MESSAGES, "semif": {"options": OPTIONS}})
    async with session.post(proxy_url + CHAT, data=semif, headers=JSON) as r:
        labels = list((await r.json())["semif"]["labels"].values())
    chat = orjson.dumps(
        {
            "messages": [{"role": "user", "content": "Say something about the sea."}],
            "max_tokens": 8,
            "temperature": 0,
        }
    )
    return {
        "systemone": (proxy_url + "/v1/systemone", _bodies(ROOT / "tests/data/tickets.jsonl")),
        "semif": (proxy_url + CHAT, [semif]),
        "direct": (llama_url + CHAT, [direct_body(labels)]),
        "chat": (proxy_url + CHAT, [chat]),
    }


def _picker(url: str, bodies: list[bytes], tally: Tally) -> Pick:
    return lambda i: (url, bodies[i % len(bodies)], tally)


async def load(proxy_url, llama_url, pid, levels, duration_s, requests) -> list[dict]:
    rows = []
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as s:
        targets = await _targets(s, proxy_url, llama_url)
        for n, concurrency in enumerate(levels):
            names = (
                ["systemone", "semif", "direct", "chat"]
                if n % 2 == 0
                else ["chat", "direct", "semif", "systemone"]
            )
            for name in names:
                url, bodies = targets[name]
                await drive(s, _picker(url, bodies, Tally()), concurrency, requests=2 * concurrency)
                tally, before = Tally(), rss_kb(pid)
                wall = await drive(
                    s,
                    _picker(url, bodies, tally),
                    concurrency,
                    duration_s=duration_s,
                    requests=requests,
                )
                rows.append(
                    {
                        "scenario": name,
                        "concurrency": concurrency,
                        **summarise(tally, wall),
                        "rss_before_kb": before,
                        "rss_after_kb": rss_kb(pid),
                    }
                )
                _print_row(rows[-1])
    return rows


def ratios(rows: list[dict]) -> list[dict]:
    """Proxy (``semif``) over direct llama-server, per concurrency."""
    by = {(r["scenario"], r["concurrency"]): r for r in rows}
    out = []
    for (name, c), p in by.items():
        d = by.get(("direct", c))
        if name != "semif" or d is None or not p["ok"] or not d["ok"]:
            continue
        out.append(
            {
                "concurrency": c,
                "p50": p["p50_ms"] / d["p50_ms"],
                "p99": p["p99_ms"] / d["p99_ms"],
                "throughput": p["throughput_rps"] / d["throughput_rps"],
            }
        )
    return sorted(out, key=lambda r: r["concurrency"])


async def soak(proxy_url, llama_url, pid, duration_s, concurrency, warmup_s) -> dict:
    samples: list[tuple[float, int]] = []
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as s:
        targets = await _targets(s, proxy_url, llama_url)
        mix = ["systemone", "semif", "chat"]
        tallies = {name: Tally() for name in mix}

        def pick(i: int) -> tuple[str, bytes, Tally]:
            url, bodies = targets[mix[i % len(mix)]]
            return url, bodies[(i // len(mix)) % len(bodies)], tallies[mix[i % len(mix)]]

        started = time.perf_counter()

        async def sample() -> None:
            while True:
                samples.append((round(time.perf_counter() - started, 1), rss_kb(pid)))
                await asyncio.sleep(SOAK_SAMPLE_S)

        sampler = asyncio.create_task(sample())
        wall = await drive(s, pick, concurrency, duration_s=duration_s)
        sampler.cancel()
        samples.append((round(time.perf_counter() - started, 1), rss_kb(pid)))
    per = {name: summarise(t, wall) for name, t in tallies.items()}
    return {
        "duration_s": duration_s,
        "concurrency": concurrency,
        "mix": mix,
        "warmup_s": warmup_s,
        "scenarios": per,
        "errors": sum(p["errors"] + p["rejected_429"] for p in per.values()),
        "requests": sum(p["requests"] for p in per.values()),
        "rss_samples": samples,
        **memory_growth(samples, warmup_s),
    }


def memory_growth(samples: list[tuple[float, int]], warmup_s: float) -> dict:
    """RSS growth after warm-up: last sample minus the first sample at or after
    ``warmup_s``; also the peak minus that baseline and a least-squares slope."""
    after = [(t, kb) for t, kb in samples if t >= warmup_s] or samples[-1:]
    base = after[0][1]
    growth_mb = (after[-1][1] - base) / 1024
    slope = (
        statistics.linear_regression([t for t, _ in after], [kb for _, kb in after]).slope
        if len(after) > 2
        else 0.0
    )
    return {
        "rss_baseline_mb": base / 1024,
        "rss_growth_mb": growth_mb,
        "rss_peak_growth_mb": (max(kb for _, kb in after) - base) / 1024,
        "rss_slope_mb_per_min": slope * 60 / 1024,
        "bound_mb": SOAK_BOUND_MB,
        "within_bound": growth_mb < SOAK_BOUND_MB,
    }


def _fmt(v: float | None, width: int = 9) -> str:
    return f"{v:{width}.1f}" if v is not None else f"{'-':>{width}}"


def _print_row(r: dict) -> None:
    print(
        f"{r['scenario']:10}{r['concurrency']:5}{r['requests']:8}{r['throughput_rps']:9.1f}"
        f"{_fmt(r['p50_ms'])}{_fmt(r['p95_ms'])}{_fmt(r['p99_ms'])}{r['errors']:7}"
        f"{r['rejected_429']:6}{r['rss_before_kb'] / 1024:9.1f}{r['rss_after_kb'] / 1024:9.1f}",
        flush=True,
    )


def _print_soak(result: dict) -> None:
    print(
        f"soak {result['duration_s']} s at concurrency {result['concurrency']}, "
        f"{result['requests']} requests, {result['errors']} errors"
    )
    for name, p in result["scenarios"].items():
        print(
            f"  {name:10}{p['requests']:7} req {p['throughput_rps']:7.1f} req/s  p50 "
            f"{_fmt(p['p50_ms'], 0)} p99 {_fmt(p['p99_ms'], 0)} ms  statuses {p['statuses']}"
            f"  client errors {p['client_errors']}"
        )
    print(
        f"  proxy RSS {result['rss_baseline_mb']:.1f} MB after {result['warmup_s']} s warm-up;"
        f" growth {result['rss_growth_mb']:+.2f} MB (peak {result['rss_peak_growth_mb']:+.2f},"
        f" slope {result['rss_slope_mb_per_min']:+.3f} MB/min); bound {SOAK_BOUND_MB} MB:"
        f" {'within' if result['within_bound'] else 'OVER'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per scenario")
    parser.add_argument("--requests", type=int, help="requests per scenario (ends first)")
    parser.add_argument("--concurrency", default="1,4,16,64", help="comma-separated levels")
    parser.add_argument("--soak", type=float, metavar="SECONDS", help="run the soak instead")
    parser.add_argument("--soak-concurrency", type=int, default=4)
    parser.add_argument("--proxy-args", default="", help="extra proxy flags, one string")
    parser.add_argument("--out", help="file name in bench/out (default load.json, soak.json)")
    args = parser.parse_args()
    machine = describe()
    OUT.mkdir(parents=True, exist_ok=True)
    with (
        llama_server() as llama_url,
        proxy_process(llama_url, shlex.split(args.proxy_args)) as (proxy_url, proc),
    ):
        start_kb = rss_kb(proc.pid)
        if args.soak:
            warmup = min(60.0, args.soak / 10)
            result = asyncio.run(
                soak(proxy_url, llama_url, proc.pid, args.soak, args.soak_concurrency, warmup)
            )
            _print_soak(result)
            path = OUT / (args.out or "soak.json")
        else:
            levels = [int(c) for c in args.concurrency.split(",")]
            print(
                f"{'scenario':10}{'conc':>5}{'reqs':>8}{'req/s':>9}{'p50 ms':>9}{'p95 ms':>9}"
                f"{'p99 ms':>9}{'errors':>7}{'429':>6}{'RSS MB':>9}{'->':>9}"
            )
            rows = asyncio.run(
                load(
                    proxy_url,
                    llama_url,
                    proc.pid,
                    levels,
                    None if args.requests else args.duration,
                    args.requests,
                )
            )
            result = {"results": rows, "ratios": ratios(rows)}
            for r in result["ratios"]:
                print(
                    f"proxy/direct at {r['concurrency']:2}: p50 {r['p50']:.3f}"
                    f"  p99 {r['p99']:.3f}"
                    f"  throughput {r['throughput']:.3f}"
                )
            path = OUT / (args.out or "load.json")
        result.update(
            machine=machine,
            command=command_line(),
            proxy_args=args.proxy_args,
            proxy_rss_kb={"start": start_kb, "end": rss_kb(proc.pid)},
        )
    path.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
