"""System One through the proxy vs asking the same model for a JSON answer through
plain chat, item by item in one run: latency and accuracy on the labelled sets.

    .venv/bin/python bench/investigations/json_vs_decision.py [--items 150]

Each item of tests/data/*.jsonl is one System One request with one question and
a top-level ``gold``. The JSON way sends the same state and question, the
options listed by what they mean, to ``/v1/chat/completions`` through the proxy
(relayed untouched) with ``temperature`` 0 and a ``response_format`` JSON schema
whose ``answer`` is an enum of the options. Both run at concurrency 1, their
order alternating per item so neither always finds the state in llama-server's
prompt cache. Results go to bench/out/json_vs_decision.json.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: the shared helpers

from _machine import command_line, describe  # noqa: E402
from _servers import ROOT, llama_server, proxy  # noqa: E402

from proxy.decision.prompt import append_to_conversation, state_messages  # noqa: E402
from proxy.decision.question import Question  # noqa: E402
from proxy.protocol.systemone import parse_request  # noqa: E402

__all__ = ["json_body", "json_prediction", "systemone_prediction", "gold_name", "main"]

OUT = ROOT / "bench" / "out"
_YES_NO = {"true": "yes", "false": "no"}


def _enum(q: Question) -> list[str]:
    """What the JSON answer may say: option names, level texts, or yes/no."""
    if q.kind == "choice":
        return list(q.names)
    if q.kind == "score":
        return list(q.shown)
    return [_YES_NO[n] for n in q.names]


def json_body(state_text: str, q: Question) -> dict:
    """A plain chat request asking for ``{"answer": <one of _enum(q)>}``."""
    lines = [f"- {' '.join(shown.split())}" for shown in q.shown]
    enum = _enum(q)
    block = "\n".join(
        [
            q.instructions or "Which option fits best?",
            "",
            "Options:",
            *lines,
            "",
            'Answer in JSON as {"answer": "<option>"}, where <option> is exactly one of: '
            + ", ".join(orjson.dumps(e).decode() for e in enum)
            + ".",
        ]
    )
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": enum}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    return {
        "messages": append_to_conversation(state_messages(state_text), block),
        "temperature": 0,
        "max_tokens": 64,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "answer", "strict": True, "schema": schema},
        },
        "chat_template_kwargs": {"enable_thinking": False},
    }


def json_prediction(q: Question, content: str) -> str | None:
    """The option name a JSON answer chose, or None if it is not valid."""
    try:
        said = orjson.loads(content)["answer"]
        return q.names[_enum(q).index(said)]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def systemone_prediction(q: Question, answer: dict) -> str:
    """The option name a System One answer chose (score: the most probable level)."""
    if q.kind == "choice":
        return answer["choice"]
    if q.kind == "score":
        probs = answer["probabilities"]
        return max(probs, key=probs.get)
    return "true" if answer["noul"] >= 0.5 else "false"


def gold_name(gold: object) -> str:
    if isinstance(gold, bool):
        return "true" if gold else "false"
    return str(gold)


def _items(n: int) -> list[tuple[str, dict]]:
    """Up to ``n`` items, as evenly as possible from each set, seeded."""
    sets = sorted((ROOT / "tests" / "data").glob("*.jsonl"))
    rows = {
        p.stem: [orjson.loads(x) for x in p.read_text().splitlines() if x.strip()] for p in sets
    }
    per = -(-n // max(1, len(rows)))
    picked = [
        (name, row)
        for name, all_rows in rows.items()
        for row in random.Random(0).sample(all_rows, min(per, len(all_rows)))
    ]
    return picked[:n]


async def _timed_post(session, url: str, body: dict) -> tuple[float, int, dict]:
    t0 = time.perf_counter()
    async with session.post(
        url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
    ) as r:
        raw = await r.read()
    return time.perf_counter() - t0, r.status, orjson.loads(raw) if raw else {}


async def compare(proxy_url: str, items: list[tuple[str, dict]]) -> list[dict]:
    out = []
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for i, (set_name, row) in enumerate(items):
            request = {k: v for k, v in row.items() if k != "gold"}
            call = parse_request(request)
            ((qid, q),) = call.questions.items()
            ways = {
                "systemone": (proxy_url + "/v1/systemone", request),
                "json": (proxy_url + "/v1/chat/completions", json_body(call.state_text, q)),
            }
            record = {"set": set_name, "kind": q.kind, "gold": gold_name(row["gold"])}
            for way in list(ways) if i % 2 == 0 else list(ways)[::-1]:
                latency, status, body = await _timed_post(session, *ways[way])
                pred = None
                if status == 200 and way == "systemone":
                    pred = systemone_prediction(q, body["answers"][qid])
                elif status == 200:
                    pred = json_prediction(q, body["choices"][0]["message"]["content"] or "")
                record[way] = {"status": status, "latency_s": latency, "prediction": pred}
            out.append(record)
    return out


def summarise(records: list[dict], way: str) -> dict:
    lat = [r[way]["latency_s"] * 1e3 for r in records]
    q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else lat * 99
    correct = sum(r[way]["prediction"] == r["gold"] for r in records)
    by_set = {}
    for name in sorted({r["set"] for r in records}):
        rs = [r for r in records if r["set"] == name]
        by_set[name] = sum(r[way]["prediction"] == r["gold"] for r in rs) / len(rs)
    return {
        "items": len(records),
        "correct": correct,
        "accuracy": correct / len(records),
        "invalid": sum(r[way]["prediction"] is None for r in records),
        "non_200": sum(r[way]["status"] != 200 for r in records),
        "p50_ms": q[49],
        "p95_ms": q[94],
        "mean_ms": statistics.fmean(lat),
        "total_s": sum(lat) / 1e3,
        "accuracy_by_set": by_set,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=150)
    args = parser.parse_args()
    machine = describe()
    items = _items(args.items)
    with llama_server() as llama_url, proxy(llama_url) as proxy_url:
        records = asyncio.run(compare(proxy_url, items))
    result = {
        "ways": {w: summarise(records, w) for w in ("systemone", "json")},
        "records": records,
        "machine": machine,
        "command": command_line(),
    }
    print(f"{len(records)} items from {sorted({r['set'] for r in records})}, concurrency 1")
    print(f"  {'':10}{'accuracy':>9}{'invalid':>8}{'p50 ms':>9}{'p95 ms':>9}{'total s':>9}  by set")
    for way, s in result["ways"].items():
        sets = "  ".join(f"{k} {v:.2f}" for k, v in s["accuracy_by_set"].items())
        print(
            f"  {way:10}{s['accuracy']:9.3f}{s['invalid']:8}{s['p50_ms']:9.1f}{s['p95_ms']:9.1f}"
            f"{s['total_s']:9.1f}  {sets}"
        )
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "json_vs_decision.json"
    path.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
