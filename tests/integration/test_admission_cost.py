"""Admission by cost, shared work done once, and work that survives a deadline, with the
real llama-server: what the decision reads cost is counted from llama-server's own
``/metrics`` and the answers' usage, never from the wall clock."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator

import httpx
import pytest

from scripts.stack import stop
from tests.conftest import launch_proxy, wait_for_self_check

ROUTE = {"options": ["billing", "shipping", "technical"]}
SENTENCE = (
    "The customer writes that order {n} arrived late, the box was open and one of the "
    "three items is missing, so they want the rest refunded or sent again. "
)


def _long(n: int, sentences: int) -> str:
    return "".join(SENTENCE.format(n=n * 1000 + i) for i in range(sentences))


def _evaluated(llama) -> int:
    text = httpx.get(llama.url + "/metrics", timeout=120).text
    return int(float(re.search(r"^llamacpp:prompt_tokens_total (\S+)$", text, re.M).group(1)))


def _settled(url: str) -> None:
    """A first decision, then the self-check it starts: the costs are known after it."""
    for _ in range(10):  # a short deadline may cut the first (it verifies the labels)
        resp = httpx.post(
            url + "/v1/chat/completions",
            timeout=300,
            json={
                "model": "m",
                "messages": [{"role": "user", "content": "warm up"}],
                "semif": ROUTE,
            },
        )
        if resp.status_code != 504:
            break
    assert resp.status_code == 200, resp.text
    wait_for_self_check(url)


def _settled_proxy(llama, logs_dir, *flags: str) -> Iterator[str]:
    """A proxy of its own with ``flags``, settled (``_settled``), stopped after."""
    proc, url, log = launch_proxy(logs_dir, llama.url, *flags)
    try:
        _settled(url)
        yield url
    finally:
        stop(proc)
        log.close()


@pytest.fixture(scope="module")
def short_deadline(llama, logs_dir) -> Iterator[str]:
    yield from _settled_proxy(llama, logs_dir, "--decision-deadline-s", "3")


def test_a_decision_no_server_could_read_in_time_is_refused_at_once_naming_the_estimate(
    short_deadline,
):
    body = {"model": "m", "messages": [{"role": "user", "content": _long(1, 160)}], "semif": ROUTE}
    started = time.monotonic()
    resp = httpx.post(short_deadline + "/v1/chat/completions", json=body, timeout=120)
    waited = time.monotonic() - started
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "exceeds_deadline"
    assert re.match(
        r"this request needs about [\d,]+ prompt tokens, about \d+ s on this "
        r"server; the deadline is 3 s",
        error["message"],
    ), error["message"]
    tokens = int(re.search(r"about ([\d,]+) prompt", error["message"]).group(1).replace(",", ""))
    assert tokens > 5000  # the conversation's tokens, as planned: none of it is held
    assert waited < 3  # told at once, not after the deadline


def test_system_one_refuses_it_with_a_422_detail(short_deadline):
    resp = httpx.post(
        short_deadline + "/v1/systemone",
        timeout=120,
        json={
            "model": "jev-latest",
            "state": _long(2, 160),
            "questions": {
                "team": {
                    "type": "choice",
                    "instructions": "Which team?",
                    "criteria": {"billing": None, "shipping": None},
                }
            },
        },
    )
    assert resp.status_code == 422, resp.text
    assert "the deadline is 3 s" in str(resp.json()["detail"])


@pytest.fixture(scope="module")
def segment_scheme(llama, logs_dir) -> Iterator[str]:
    """A proxy told nothing of llama-server's -ub: the segment scheme (proxy/kv.py)."""
    yield from _settled_proxy(llama, logs_dir, "--upstream-ubatch", "0")


@pytest.mark.parametrize("scheme", ["prefix-63", "segment"])
def test_questions_sent_at_once_about_one_state_evaluate_it_once(scheme, request, llama):
    url = request.getfixturevalue("proxy_url" if scheme == "prefix-63" else "segment_scheme")
    _settled(url)
    state = _long(3 if scheme == "prefix-63" else 5, 12)  # about 500 tokens, new to both
    tokens = len(httpx.post(llama.url + "/tokenize", json={"content": state}).json()["tokens"])
    questions = [
        {
            "q": {
                "type": "choice",
                "instructions": f"Is this about topic {i}?",
                "criteria": {"yes": None, "no": None},
            }
        }
        for i in range(8)
    ]
    llama.wait_idle()
    before = _evaluated(llama)

    async def ask_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=300) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        url + "/v1/systemone",
                        json={"model": "jev-latest", "state": state, "questions": q},
                    )
                    for q in questions
                )
            )

    answers = asyncio.run(ask_all())
    assert [r.status_code for r in answers] == [200] * 8, [r.text for r in answers]
    assert {r.json()["answers"]["q"]["x_read_scheme"] for r in answers} == {scheme}
    spent = _evaluated(llama) - before
    # once the state, then each question's own part (under 100 tokens each): four slots
    # each evaluating the state would be about 4 x 500
    assert spent < tokens + 8 * 100, (spent, tokens)
    # and admission estimated it so: the state counted once, not once per request
    estimated = [_estimated_tokens(r) for r in answers]
    assert sum(estimated) < tokens + 8 * 100, (estimated, tokens)
    assert max(estimated) > tokens  # the first to be costed reads it


@pytest.fixture(scope="module")
def segment_fanout(llama, logs_dir) -> Iterator[str]:
    """The segment scheme with a request's questions read one per slot (meant for a GPU)."""
    yield from _settled_proxy(llama, logs_dir, "--upstream-ubatch", "0", "--question-fanout", "0")


def test_on_the_segment_scheme_a_requests_fan_out_reads_its_state_in_every_slot(
    segment_fanout, llama
):
    state = _long(6, 12)  # about 500 tokens
    tokens = len(httpx.post(llama.url + "/tokenize", json={"content": state}).json()["tokens"])
    questions = {
        f"q{i}": {"type": "noul", "instructions": f"Is this about topic {i}?"} for i in range(5)
    }
    llama.wait_idle()
    before = _evaluated(llama)
    resp = httpx.post(
        segment_fanout + "/v1/systemone",
        json={"model": "jev-latest", "state": state, "questions": questions},
        timeout=300,
    )
    assert resp.status_code == 200, resp.text
    spent = _evaluated(llama) - before
    # the first question reads the state; the other four go one per slot, as
    # --question-fanout 0 asks: one finds the state where the first left it, the others
    # evaluate it again rather than wait for that slot (separate requests would wait)
    assert spent > 3 * tokens, (spent, tokens)


def _estimated_tokens(resp: httpx.Response) -> int:
    timing = resp.headers["Server-Timing"]
    found = re.search(r'semif-estimate;dur=\d+;desc="(\d+) prompt tokens', timing)
    assert found, timing
    return int(found.group(1))


def test_a_retry_after_a_client_left_continues_from_what_the_slot_kept(proxy_url, llama, logs_dir):
    _settled(proxy_url)
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": _long(4, 30)}],
        "semif": ROUTE,
    }  # about 900 tokens, one batch of llama-server's
    llama.wait_idle()
    with pytest.raises(httpx.TimeoutException):  # leaves while llama-server works
        httpx.post(proxy_url + "/v1/chat/completions", json=body, timeout=0.5)
    llama.wait_idle(timeout_s=300)
    resumed = httpx.post(proxy_url + "/v1/chat/completions", json=body, timeout=300)
    assert resumed.status_code == 200, resumed.text
    usage = resumed.json()["usage"]
    n = usage["prompt_tokens"] // resumed.json()["semif"]["reads"]
    evaluated = usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]
    # llama-server finishes the batch it was evaluating when the client left (here the
    # whole prompt): the retry evaluates what follows it, the last token again and, when
    # that went with others, once more alone, per read
    assert evaluated <= 2 * resumed.json()["semif"]["reads"], (evaluated, n)
    # the same read uninterrupted, in a proxy that knows nothing of the slots: it reads
    # from position 0, and the numbers are the same to the last bit
    proc, other, log = launch_proxy(logs_dir, llama.url)
    try:
        _settled(other)
        llama.wait_idle()
        whole = httpx.post(other + "/v1/chat/completions", json=body, timeout=300)
    finally:
        stop(proc)
        log.close()
    assert whole.status_code == 200, whole.text
    assert whole.json()["semif"]["probabilities"] == resumed.json()["semif"]["probabilities"]


def test_a_relayed_chat_that_names_no_length_is_not_refused_for_the_cap_it_gets(proxy_url):
    _settled(proxy_url)  # the costs are known: the cap's 2,048 tokens would take minutes
    resp = httpx.post(
        proxy_url + "/v1/chat/completions",
        timeout=300,
        json={
            "model": "m",
            "messages": [{"role": "user", "content": "Say hello."}],
            "stop": [".", "!", "\n"],
            "temperature": 0,
        },
    )
    assert resp.status_code == 200, resp.text
