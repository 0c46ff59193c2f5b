"""Golden replay: does another checkout's proxy answer every decision exactly as this one?

    .venv/bin/python bench/golden.py --before /path/to/other/checkout [--n 400]
    .venv/bin/python bench/golden.py --before HEAD~3      # a commit: checked out for the run
    .venv/bin/python bench/golden.py                      # this checkout against itself
    .venv/bin/python bench/golden.py --before C --save F  # only C's run, kept in F ...
    .venv/bin/python bench/golden.py --against F          # ... and this checkout against it
    .venv/bin/python bench/golden.py --compare F G        # two runs --save kept

For each checkout (``--before`` first, then this one) a fresh llama-server starts as
`make run` starts it, and that checkout's proxy before it, with decision records written
to a file (``--decision-records-inputs`` on). The same ``--n`` requests (400: 520 decisions) are
sent one at a time: System One, chat completions with ``semif`` (every kind, each debias
mode on the kinds that allow one, both prompt layouts, streamed and not), the OpenAI
Decisions API, rerank, and ``/invocations`` with each body shape and a jsonlines
mini-batch. They are built from the questions of tests/data, in a fixed order. Pride needs a
fitted profile and is left out.

It prints, per route, how many answers are byte-identical once ids, ``created`` and
timings are removed, then the same for the decision records, and the first differences.
Exit status 1 when anything differs. This is issue 55's check that a refactoring changed
no answer; it is not a speed benchmark.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from _machine import command_line, describe
from _servers import ROOT, llama_server, proxy_process

DATA = ROOT / "tests" / "data"
DEBIAS: tuple[Any, ...] = (
    None,
    "cyclic",
    {"method": "cyclic", "rotations": 2},
    "contextual",
)
LAYOUTS = ("conversation_first", "options_first")
# Volatile fields: they differ between any two runs by design.
VOLATILE = frozenset(
    {"id", "created", "created_at", "timing", "timings", "duration_ms", "latency_ms", "time",
     "ts", "timestamp", "decision_id", "request_id", "system_fingerprint", "seconds", "queued_ms",
     "read_ms", "waited_ms", "x_decision_id"}
)  # fmt: skip


def items() -> list[dict]:
    return [
        json.loads(line)
        for name in ("tickets", "sentiment", "yesno")
        for line in (DATA / f"{name}.jsonl").read_text().splitlines()
        if line.strip()
    ]


def _semif(question: dict, k: int) -> dict:
    semif: dict[str, Any] = {"type": question["type"], "layout": LAYOUTS[k % 2]}
    if question["type"] != "noul":
        semif["options"] = question["criteria"]
    if question["type"] != "score":
        debias = DEBIAS[(k // 2) % len(DEBIAS)]
        if debias is not None:
            semif["debias"] = debias
    return semif


def _chat(item: dict, k: int) -> dict:
    question = next(iter(item["questions"].values()))
    return {
        "model": "smollm2",
        "messages": [
            {"role": "system", "content": question.get("instructions") or "Decide."},
            {"role": "user", "content": item["state"]},
        ],
        "semif": _semif(question, k),
        **({"stream": True} if k % 7 == 3 else {}),
    }


def _decisions(item: dict) -> dict:
    questions = []
    for qid, q in item["questions"].items():
        if q["type"] == "noul":
            questions.append(
                {
                    "type": "predicate",
                    "name": qid,
                    "instructions": q.get("instructions") or "Decide.",
                }
            )
        elif q["type"] == "score":
            levels = [{"label": c} for c in q["criteria"]]
            questions.append(
                {
                    "type": "score",
                    "name": qid,
                    "instructions": q.get("instructions") or "Decide.",
                    "levels": levels,
                }
            )
        else:
            choices = [
                {"value": v, **({"description": d} if d else {})} for v, d in q["criteria"].items()
            ]
            questions.append(
                {
                    "type": "choice",
                    "instructions": q.get("instructions") or "Decide.",
                    "choices": choices,
                }
            )
    return {"model": "jev-latest", "input": item["state"], "questions": questions}


def _system_one(item: dict) -> dict:
    return {"state": item["state"], "questions": item["questions"]}


def requests(n: int) -> list[tuple[str, str, dict | bytes]]:
    """``n`` (route label, path, body) in a fixed order; bytes: a jsonlines body."""
    data = items()
    reranks = [json.loads(x) for x in (DATA / "rerank" / "support.jsonl").read_text().splitlines()]
    out: list[tuple[str, str, dict | bytes]] = []
    k = 0
    while len(out) < n:
        item = data[k % len(data)]
        which = k % 10
        if which in (0, 1, 2, 3):
            out.append(("chat", "/v1/chat/completions", _chat(item, k // 10 * 4 + which)))
        elif which in (4, 5):
            out.append(("systemone", "/v1/systemone", _system_one(item)))
        elif which == 6:
            out.append(("decisions", "/v1/decisions", _decisions(item)))
        elif which == 7:
            body = (_chat(item, k), _system_one(item), _decisions(item))[k // 10 % 3]
            body.pop("stream", None)
            out.append(("invocations", "/invocations", body))
        elif which == 8:
            lines = [_system_one(data[(k + j) % len(data)]) for j in range(3)]
            lines.append(_chat(data[(k + 3) % len(data)], k // 10))
            lines[-1].pop("stream", None)
            out.append(("invocations-jsonl", "/invocations", b"\n".join(map(_dumps, lines))))
        else:
            r = reranks[k // 10 % len(reranks)]
            out.append(("rerank", "/v1/rerank", {"query": r["query"], "documents": r["documents"]}))
        k += 1
    return out


def _dumps(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True).encode()


def scrub(value: Any) -> Any:
    """``value`` without the fields that differ between any two runs."""
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def _answer(resp: httpx.Response) -> Any:
    kind = resp.headers.get("content-type", "")
    if "event-stream" in kind:
        events = [line[6:] for line in resp.text.splitlines() if line.startswith("data: ")]
        return [e if e == "[DONE]" else scrub(json.loads(e)) for e in events]
    if "jsonlines" in kind:  # lines read at once: which slot's cache each meets varies
        return [
            {k: v for k, v in scrub(json.loads(line)).items() if k != "usage"}
            for line in resp.text.splitlines()
            if line.strip()
        ]
    return scrub(resp.json())


def replay(checkout: Path, asked: list[tuple[str, str, dict | bytes]]) -> tuple[list, list]:
    """The scrubbed answers and records of ``checkout``'s proxy before a fresh llama-server."""
    with tempfile.TemporaryDirectory() as tmp, llama_server() as upstream:
        records, key = Path(tmp) / "records.jsonl", Path(tmp) / "key"
        key.write_bytes(b"golden replay key, the same for every run")  # comparable prompt_hash
        extra = ["--decision-records", str(records), "--decision-records-inputs"]
        extra += ["--decision-records-key-file", str(key)]
        # a loaded machine answers later, never otherwise: no answer is a 504 for the load
        extra += ["--decision-deadline-s", "900", "--invocations-timeout-s", "1800"]
        with _proxy_of(checkout, upstream, extra) as url, httpx.Client(timeout=600) as client:
            answers, began = [], time.monotonic()
            for route, path, body in asked:
                if isinstance(body, bytes):
                    resp = client.post(
                        url + path, content=body, headers={"Content-Type": "application/jsonlines"}
                    )
                else:
                    resp = client.post(url + path, json=body)
                answers.append({"route": route, "status": resp.status_code, "body": _answer(resp)})
        print(f"{checkout}: {len(asked)} requests in {time.monotonic() - began:.0f} s")
        lines = records.read_text().splitlines() if records.exists() else []
        return answers, sorted(json.dumps(scrub(json.loads(x)), sort_keys=True) for x in lines)


@contextlib.contextmanager
def _proxy_of(checkout: Path, upstream: str, extra: list[str]) -> Iterator[str]:
    with proxy_process(upstream, extra, cwd=checkout) as (url, _):
        yield url


@contextlib.contextmanager
def _checkout(before: str) -> Iterator[Path]:
    """``before`` as a folder: a checkout's path as it is, else a commit checked out in a
    temporary worktree for the run."""
    if Path(before).is_dir():
        yield Path(before).resolve()
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "before"
        git = ["git", "-C", str(ROOT), "worktree"]
        subprocess.run(
            [*git, "add", "--detach", str(path), before], check=True, capture_output=True
        )
        try:
            yield path
        finally:
            subprocess.run([*git, "remove", "--force", str(path)], check=True, capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", default=str(ROOT), help="a checkout's folder or a commit")
    parser.add_argument("--n", type=int, default=400, help="requests (default 400: 520 decisions)")
    parser.add_argument("--save", type=Path, help="only replay --before, into this file")
    parser.add_argument("--against", type=Path, help="a file --save wrote, in place of a run")
    parser.add_argument("--compare", type=Path, nargs=2, help="two files --save wrote: no run")
    args = parser.parse_args()
    print(describe())
    print(command_line())
    asked = requests(args.n)
    if args.compare:
        old, new = (json.loads(path.read_text()) for path in args.compare)
        print(
            f"before: {old['checkout']} ({old['head']}); after: {new['checkout']} ({new['head']})"
        )
        return _compare(old["answers"], old["records"], new["answers"], new["records"])
    if args.against:
        old = json.loads(args.against.read_text())
        print(f"before: {old['checkout']} ({old['head']}), saved in {args.against}")
        if old["n"] != args.n:
            raise SystemExit(f"{args.against} holds {old['n']} requests, not --n {args.n}")
    else:
        with _checkout(args.before) as before:
            old = {"checkout": str(before), "head": _head(before), "n": args.n}
            old["answers"], old["records"] = replay(before, asked)
        if args.save:
            args.save.write_text(json.dumps(old))
            print(f"saved in {args.save}: compare with --against {args.save}")
            return 0
    new_answers, new_records = replay(ROOT, asked)
    print(f"before: {old['checkout']} ({old['head']}); after: {ROOT} ({_head(ROOT)})")
    return _compare(old["answers"], old["records"], new_answers, new_records)


def _compare(old_answers: list, old_records: list, new_answers: list, new_records: list) -> int:
    same: Counter[str] = Counter()
    total: Counter[str] = Counter()
    shown = 0
    for i, (a, b) in enumerate(zip(old_answers, new_answers, strict=True)):
        total[a["route"], a["status"]] += 1
        if a == b:
            same[a["route"], a["status"]] += 1
        elif shown < 3:
            shown += 1
            print(f"request {i} ({a['route']}) differs:\n  before {_dumps(a)[:600]!r}\n"
                  f"  after  {_dumps(b)[:600]!r}")  # fmt: skip
    for route, status in sorted(total):
        print(
            f"{route:18s} {status}  {same[route, status]:4d} / {total[route, status]:4d} identical"
        )
    records_same = (Counter(old_records) & Counter(new_records)).total()
    print(
        f"answers: {sum(same.values())} / {len(new_answers)} identical; records: {records_same} / "
        f"{len(new_records)} identical (before wrote {len(old_records)})"
    )
    identical = sum(same.values()) == len(new_answers) and old_records == new_records
    return 0 if identical else 1


def _head(path: Path) -> str:
    found = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    )
    return found.stdout.strip() + (" + changes" if dirty.stdout.strip() else "")


if __name__ == "__main__":
    sys.exit(main())
