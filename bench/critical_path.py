"""Where a decision's time goes at concurrency 1: the proxy beside the bare hop.

    .venv/bin/python bench/critical_path.py [--requests 600]

Runs the proxy and bench/_relay.py's ``protocol`` hop with clock stamps added
at their seams (wrappers set up before serving; nothing in proxy/ changes),
sends the same decision through each and straight to llama-server, one at a
time in blocks whose order rotates, and prints the median microseconds of each stage of
a request: from the client's send to the server's first byte, through the
server's own work before and after llama-server's answer, to the client's last
byte; beside llama-server's stage, its own ``timings.prompt_ms`` (for direct,
the client's total and that are all there is). Stamps share one clock
(``time.perf_counter``, CLOCK_MONOTONIC) across processes.

Why: bench/overhead.py says how much the proxy costs; this says where.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _servers import ROOT, _serving, llama_server  # noqa: E402
from overhead import PATH, PROXY_BODY, decision_labels, direct_body, rotated  # noqa: E402

# (stage, from stamp, to stamp); "sent" and "received" are the client's.
STAGES = [
    ("client to server", "sent", "request_in"),
    ("  head, body, plan", "request_in", "planned"),
    ("  task started", "planned", "task"),
    ("  to the upstream call", "task", "read_called"),
    ("  request built, written", "read_called", "upstream_write"),
    ("server: request in, upstream written", "request_in", "upstream_write"),
    ("llama-server (and both wake-ups)", "upstream_write", "answer_in"),
    ("  of which its prompt_ms (timings)", None, None),
    ("answer framed (proxy/http1.py)", "answer_in", "answer_done"),
    ("  task resumed", "answer_done", "resumed"),
    ("  read parsed", "resumed", "read_done"),
    ("  readout, answer built", "read_done", "answered"),
    ("  answer serialised, written", "answered", "reply_written"),
    ("server: answer framed, client written", "answer_done", "reply_written"),
    ("server to client", "reply_written", "received"),
    ("total", "sent", "received"),
]


def serve(kind: str, out: str, argv: list[str]) -> None:
    """Run the proxy (``kind`` "proxy") or the bare hop ("hop") with stamps,
    written to ``out`` as JSON when the process is told to stop."""
    stamps: list[tuple[str, float]] = []
    clock = time.perf_counter
    answers: list[tuple[float, bytes]] = []  # upstream bodies, read when stopping

    def dump(*_: object) -> None:
        computed = [(at, prompt_ms(body)) for at, body in answers]
        Path(out).write_text(json.dumps({"stamps": stamps, "computed": computed}))
        os._exit(0)

    def before(cls, name: str, label: str) -> None:
        inner = getattr(cls, name)

        def wrapped(*args, **kwargs):
            stamps.append((label, clock()))
            return inner(*args, **kwargs)
        setattr(cls, name, wrapped)

    def after(cls, name: str, label: str) -> None:
        inner = getattr(cls, name)

        def wrapped(*args, **kwargs):
            result = inner(*args, **kwargs)
            stamps.append((label, clock()))
            return result
        setattr(cls, name, wrapped)

    def around(cls, name: str, label_in: str | None, label_out: str | None) -> None:
        inner = getattr(cls, name)

        async def wrapped(*args, **kwargs):
            if label_in:
                stamps.append((label_in, clock()))
            result = await inner(*args, **kwargs)
            if label_out:
                stamps.append((label_out, clock()))
            return result
        setattr(cls, name, wrapped)

    from proxy import http1
    after(http1._Connection, "_send", "upstream_write")  # the write included
    before(http1._Connection, "data_received", "answer_in")
    inner_finish = http1._Connection._finish

    def finish(self, body: bytes) -> None:
        stamps.append(("answer_done", clock()))
        inner_finish(self, body)
        answers.append((clock(), body))
    http1._Connection._finish = finish
    around(http1._Connection, "exchange", None, "resumed")
    signal.signal(signal.SIGTERM, dump)
    if kind == "hop":
        import _relay
        before(_relay._Hop, "data_received", "request_in")
        around(_relay._Hop, "reply", None, "reply_written")
        sys.argv = ["_relay.py", *argv]
        _relay.main()
        return
    from proxy import front, front_http, upstream
    from proxy.__main__ import main as proxy_main
    before(front_http.Connection, "data_received", "request_in")
    after(front_http.Connection, "reply", "reply_written")
    inner_plan = front.Front.plan

    def plan(self, path, raw):
        planned = inner_plan(self, path, raw)
        stamps.append(("planned", clock()))
        if planned is None:
            return None
        api, answer = planned

        async def answered():
            result = await answer()
            stamps.append(("answered", clock()))
            return result
        return api, answered

    front.Front.plan = plan
    around(front.Front, "serve", "task", None)
    around(upstream.Upstream, "next_token", "read_called", "read_done")
    proxy_main(argv)
    dump()


def prompt_ms(body: bytes) -> float | None:
    """llama-server's own account of a read's compute (``timings.prompt_ms``)."""
    try:
        return json.loads(body).get("timings", {}).get("prompt_ms")
    except (ValueError, AttributeError):
        return None  # not a JSON object


async def drive(urls: dict[str, tuple[str, bytes]], requests: int
                ) -> dict[str, list[tuple[float, float, bytes]]]:
    """Each target's (sent, received, answer), in blocks of 50 whose order rotates,
    one request at a time."""
    sent: dict[str, list[tuple[float, float, bytes]]] = {name: [] for name in urls}
    names = list(urls)
    async with aiohttp.ClientSession() as session:
        for i in range(requests // 50):
            for name in rotated(names, i):
                url, body = urls[name]
                for _ in range(50):
                    t0 = time.perf_counter()
                    async with session.post(url + PATH, data=body) as r:
                        answer = await r.read()
                        assert r.status == 200, r.status
                    sent[name].append((t0, time.perf_counter(), answer))
    return sent


def stages(recorded: dict, sent: list[tuple[float, float, bytes]]) -> dict[str, float]:
    """Median microseconds of each stage over the requests that have its stamps."""
    stamps = recorded["stamps"] + [("compute", t) for t, ms in recorded["computed"]
                                   if ms is not None]
    compute = {t: ms for t, ms in recorded["computed"] if ms is not None}
    stamps.sort(key=lambda s: s[1])
    times, i = [], 0
    for t0, t1, _ in sent:
        seen = {"sent": t0, "received": t1}
        while i < len(stamps) and stamps[i][1] < t0:
            i += 1
        while i < len(stamps) and stamps[i][1] <= t1:
            seen.setdefault(*stamps[i])  # the first of each: one upstream segment, one answer
            i += 1
        times.append(seen)
    out = {}
    for name, start, end in STAGES:
        if start is None:  # llama-server's own account of its compute
            spans = [compute[t["compute"]] * 1e3 for t in times if "compute" in t]
        else:
            spans = [(t[end] - t[start]) * 1e6 for t in times if start in t and end in t]
        if spans:
            out[name] = statistics.median(spans)
    return out


def main() -> None:
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], sys.argv[3], sys.argv[4:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600, help="per target")
    parser.add_argument("--llama-args", default="", help="extra llama-server flags, one string")
    args = parser.parse_args()
    me = str(Path(__file__).resolve())
    with (llama_server(extra=args.llama_args.split()) as llama_url,
          tempfile.TemporaryDirectory() as tmp):
        out = {name: str(Path(tmp) / f"{name}.json") for name in ("proxy", "hop")}
        proxy = _serving(lambda port, log: subprocess.Popen(
            [sys.executable, me, "serve", "proxy", out["proxy"], "--port", str(port),
             "--upstream-url", llama_url], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True), timeout_s=30)
        with proxy as (proxy_url, _):
            body_file = Path(tmp) / "read.json"
            body_file.write_bytes(direct_body(asyncio.run(decision_labels(proxy_url))))
            hop = _serving(lambda port, log: subprocess.Popen(
                [sys.executable, me, "serve", "hop", out["hop"], "protocol", llama_url, str(port),
                 str(body_file)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True), timeout_s=30)
            with hop as (hop_url, _):
                urls = {"proxy": (proxy_url, PROXY_BODY), "hop": (hop_url, b"{}"),
                        "direct": (llama_url, body_file.read_bytes())}
                asyncio.run(drive(urls, 100))  # warm every path
                sent = asyncio.run(drive(urls, args.requests))
        # both servers have stopped and written their stamps; direct has only the client's
        results = {name: stages(json.loads(Path(out[name]).read_text()), sent[name])
                   for name in out}
        results["direct"] = stages({"stamps": [], "computed": [
            (t1, prompt_ms(answer)) for _, t1, answer in sent["direct"]]}, sent["direct"])
    print(f"median microseconds per stage, concurrency 1, {len(sent['proxy'])} requests each; "
          "the stamps add a few µs, more to the proxy (more of them)")
    print(f"  {'':42}{'proxy':>8}{'hop':>8}{'direct':>8}")
    for name, _, _ in STAGES:
        row = [results[t].get(name) for t in ("proxy", "hop", "direct")]
        print(f"  {name:42}" + "".join(f"{v:8.0f}" if v is not None else f"{'':8}" for v in row))


if __name__ == "__main__":
    main()
