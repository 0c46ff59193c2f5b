"""At a real model's speed (tests/realspeed/conftest.py): start-up and the self-check, the
decisions after start and after restarts, concurrency, deadlines, a long state, the
255-option question, a batch job and widening reads. Bounds are generous (2x, not the
benchmarks' 1.1x) so that a loaded CI machine cannot fail them by its noise alone."""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from proxy.decision.labels import gbnf_alternatives
from proxy.decision.prompt import lay_out, options_block
from proxy.decision.question import choice_question
from scripts.stack import ROOT, stop
from tests.conftest import launch_llama, launch_proxy, slow_model

from .conftest import FIGURES, Slow

OPTIONS = ["billing", "shipping", "technical"]
WAIT_S = 900  # a client's patience here: nothing below should come near it


def ticket(n: int) -> dict:
    """A new ticket of one shape: the same words, a number no earlier request had."""
    text = f"Ticket {n}: since the last update the app closes when I open my order history."
    return {"messages": [{"role": "user", "content": text}], "semif": {"options": OPTIONS}}


def direct(n: int, labels: list[str]) -> dict:
    """The same read straight from llama-server's chat endpoint: the prompt text the proxy
    builds (its options block, the labels it verified), one token, a grammar of the labels,
    the top log-probabilities (as bench/fresh.py's ``chat`` target reads it)."""
    block = options_block(choice_question(OPTIONS), labels)
    return {
        "messages": lay_out(ticket(n)["messages"], block, "conversation_first"),
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 16,
        "grammar": gbnf_alternatives(labels),
        "cache_prompt": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }


def timed(url: str, body: dict, headers: dict | None = None) -> tuple[float, httpx.Response]:
    started = time.monotonic()
    resp = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=WAIT_S)
    return time.monotonic() - started, resp


def decision_s(url: str, n: int) -> float:
    seconds, resp = timed(url, ticket(n))
    assert resp.status_code == 200, resp.text
    assert resp.json()["semif"]["choice"] in OPTIONS
    return seconds


def ready_s(url: str, since: float) -> float:
    """Seconds from ``since`` until the proxy's ``/health`` says ok."""
    while httpx.get(url + "/health", timeout=30).status_code != 200:
        assert time.monotonic() - since < WAIT_S, "the proxy never became ready"
        time.sleep(0.05)
    return time.monotonic() - since


def lane_env(verdicts: Path) -> dict[str, str]:
    """The proxy as a deployment on a slow model runs it: verdicts kept, and each
    llama-server call allowed as long as the longest read here (the 255-option question:
    about 2,000 tokens, over a minute on a slow CPU; docs/operations.md)."""
    return {"PROXY_CHECK_VERDICTS": str(verdicts), "PROXY_REQUEST_TIMEOUT": str(WAIT_S)}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("verdicts") / "self-check.json"


@pytest.fixture(scope="module")
def proxy(slow: Slow, logs_dir: Path, verdicts: Path):
    proc, url, log = launch_proxy(logs_dir, slow.url, env=lane_env(verdicts))
    ready_s(url, time.monotonic())
    decision_s(url, 99)  # one read timed: the cost model that admission's estimates use
    yield url
    stop(proc)
    log.close()


def test_no_decision_waits_for_the_self_check_after_start_or_restarts(
    slow: Slow, logs_dir: Path, verdicts: Path
):
    env = lane_env(verdicts)
    started = time.monotonic()
    proc, url, log = launch_proxy(logs_dir, slow.url, env=env)
    try:
        to_ready = ready_s(url, started)
        found = re.search(r"self-check on \S+: (.+?) in ([\d.]+)s", Path(log.name).read_text())
        assert found, "the self-check's time is logged"
        first, second = decision_s(url, 1), decision_s(url, 2)
        warm = statistics.median(decision_s(url, n) for n in range(3, 6))
        FIGURES["first start: to ready / self-check"] = f"{to_ready:.1f} s / {found[2]} s"
        FIGURES["first, second decision after start / warm (median of 3)"] = (
            f"{first:.2f} s, {second:.2f} s / {warm:.2f} s"
        )
        assert first < 2 * warm and second < 2 * warm

        slow.restart()  # returns once llama-server's own /health is 200
        back = ready_s(url, time.monotonic())
        after = [decision_s(url, n) for n in (6, 7)]
        FIGURES["llama-server restart: ready after its /health"] = f"{back:.2f} s"
        FIGURES["first, second decision after it"] = f"{after[0]:.2f} s, {after[1]:.2f} s"
        assert back < 15 and max(after) < 2 * warm
    finally:
        stop(proc)
        log.close()

    started = time.monotonic()
    proc, url, log = launch_proxy(logs_dir, slow.url, env=env)
    try:
        again = ready_s(url, started)  # the kept verdict: no check's reads
        [check] = httpx.get(url + "/v1/models", timeout=60).json()["x_repeatable"].values()
        assert "kept from the check" in check["detail"]
        later = decision_s(url, 8)
        FIGURES["proxy restart with the kept verdict: start to ready"] = f"{again:.2f} s"
        FIGURES["first decision after it"] = f"{later:.2f} s"
        assert again < 15 and later < 2 * warm
    finally:
        stop(proc)
        log.close()


async def _burst(url: str, bodies: list[dict]) -> tuple[float, list[float], list[int]]:
    # a batch caller's deadline: 8 at once on a slow CPU can pass 80% of the default 50 s,
    # and admission would refuse the last (429) where llama-server alone queues them
    headers = {"X-Semif-Deadline": str(WAIT_S)}
    async with httpx.AsyncClient(timeout=WAIT_S, headers=headers) as http:

        async def one(body: dict) -> tuple[float, int]:
            started = time.monotonic()
            resp = await http.post(url + "/v1/chat/completions", json=body)
            return time.monotonic() - started, resp.status_code

        started = time.monotonic()
        done = await asyncio.gather(*(one(b) for b in bodies))
        return time.monotonic() - started, [s for s, _ in done], [c for _, c in done]


async def test_eight_new_tickets_at_once_keep_up_with_llama_server(proxy: str, slow: Slow):
    _, answer = timed(proxy, ticket(99))
    labels = list(answer.json()["semif"]["labels"].values())
    through, lat_p, codes_p = await _burst(proxy, [ticket(100 + i) for i in range(8)])
    straight, lat_d, codes_d = await _burst(slow.url, [direct(200 + i, labels) for i in range(8)])
    assert codes_p == [200] * 8 and codes_d == [200] * 8
    ratio = straight / through
    FIGURES["8 new tickets at once: throughput / p50 against llama-server's chat"] = (
        f"{ratio:.2f} / {statistics.median(lat_p) / statistics.median(lat_d):.2f} "
        f"({through:.1f} s against {straight:.1f} s; one run, n = 8)"
    )
    assert ratio > 0.6


STATE = " ".join(
    json.loads(line)["state"]
    for line in (ROOT / "tests/data/tickets.jsonl").read_text().splitlines()
)


def system_one(state_chars: int, questions: int) -> dict:
    return {
        "state": STATE[:state_chars],
        "questions": {
            f"q{i}": {"type": "choice", "criteria": {o: f"about {o}" for o in OPTIONS}}
            for i in range(questions)
        },
    }


def test_a_long_state_fits_a_deadline_the_client_sets_and_is_refused_at_once_beyond(
    proxy: str,
):
    body = system_one(2_400, 4)  # about 600 tokens
    started = time.monotonic()
    refused = httpx.post(
        proxy + "/v1/systemone", json=body, headers={"X-Semif-Deadline": "3"}, timeout=WAIT_S
    )
    refused_s = time.monotonic() - started
    assert refused.status_code in (400, 422), refused.text  # exceeds_deadline
    assert "needs" in refused.text and "deadline" in refused.text and refused_s < 10
    started = time.monotonic()
    resp = httpx.post(
        proxy + "/v1/systemone", json=body, headers={"X-Semif-Deadline": "600"}, timeout=WAIT_S
    )
    seconds = time.monotonic() - started
    assert resp.status_code == 200, resp.text
    FIGURES["System One, ~600-token state, 4 questions"] = (
        f"{seconds:.1f} s; refused in {refused_s:.2f} s under a 3 s deadline"
    )


def test_the_255_option_question_is_refused_at_once_when_it_cannot_fit(proxy: str):
    # about 2,000 prompt tokens: minutes on this model (its read, with a deadline long
    # enough, is bench/real_speed.py's to time); under a 10 s deadline it is refused at
    # once, with its estimate, on any CPU this lane runs on
    options = [f"option {i}" for i in range(255)]
    body = {
        "messages": [{"role": "user", "content": "Ticket 9: the parcel arrived broken."}],
        "semif": {"options": options},
    }
    seconds, resp = timed(proxy, body, {"X-Semif-Deadline": "10"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "exceeds_deadline"
    assert "needs" in resp.text and seconds < 10, (seconds, resp.text)
    FIGURES["the 255-option question under a 10 s deadline"] = (
        f"refused in {seconds:.2f} s: {resp.json()['error']['message'][:160]}"
    )


def test_a_batch_job_with_long_deadlines(proxy: str, tmp_path: Path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = [{"id": f"t{i}", **system_one(400 + 40 * i, 1)} for i in range(4)]
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    started = time.monotonic()
    job = subprocess.run(
        [sys.executable, "-m", "semif_tools", "batch", str(src), str(out), "--url", proxy],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert job.returncode == 0, job.stderr
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(a["id"] for a in answers) == ["t0", "t1", "t2", "t3"]
    assert [a["status"] for a in answers] == [200] * 4, answers
    FIGURES["batch job, 4 lines"] = f"{time.monotonic() - started:.1f} s"


def test_widening_reads_are_made_once_per_label_set(logs_dir: Path):
    # the copy whose added blocks are not zeroed: garbage answers, the labels hold little
    # of the mass, so the first decision widens; the next ones start where it ended
    proc, server, log = launch_llama(logs_dir, "garbage", model=slow_model(2, zero=False))
    proxy_proc, url, proxy_log = launch_proxy(logs_dir, server.url)
    try:
        reads = []
        for n in range(4):
            _, resp = timed(url, ticket(300 + n))
            assert resp.status_code == 200, resp.text
            reads.append(resp.json()["semif"]["reads"])
        FIGURES["reads per decision where the labels hold little mass"] = str(reads)
        assert reads[0] >= 1 and reads[1:] == [1, 1, 1]
    finally:
        stop(proxy_proc)
        proxy_log.close()
        stop(proc)
        log.close()
