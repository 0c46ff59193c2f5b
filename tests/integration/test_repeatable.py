"""The same decision gives the same probabilities whatever llama-server's caches hold
(proxy/kv.py, docs/repeatability.md): read cold, warm, after an unrelated request, after
every slot was filled with other prompts, with the state cached by another question, as
the second question of a request; and a labelled set sent twice on a fresh stack.
The prompts are a few hundred tokens: long enough for cold and warm reads of one prompt
to differ by up to 0.07 in llama-server itself."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import httpx
import pytest

from scripts.stack import stop
from tests.conftest import launch_llama, launch_proxy

WORDS = (
    "the parcel arrived late and the box was damaged so I want a refund for order "
    "number 1182 which I paid twice with my card last week"
).split()
STATE = " ".join(itertools.islice(itertools.cycle(WORDS), 300))  # about 340 tokens
TEAM = {
    "type": "choice",
    "instructions": "Which team should handle this?",
    "criteria": {"billing": None, "shipping": None, "technical": None},
}
REFUND = {"type": "noul", "instructions": "Does the customer want money back?"}
DATA = Path(__file__).resolve().parents[1] / "data"


def _ask(url: str, questions: dict, state: str = STATE) -> dict:
    resp = httpx.post(
        url + "/v1/systemone", json={"state": state, "questions": questions}, timeout=120
    )
    assert resp.status_code == 200, resp.text
    return resp.json()["answers"]


def _probs(answer: dict) -> dict[str, float]:
    return answer.get("probabilities") or {"noul": answer["noul"]}


def _moved(a: dict[str, float], b: dict[str, float]) -> float:
    assert a.keys() == b.keys()
    return max(abs(a[k] - b[k]) for k in a)


def test_one_decision_reads_the_same_whatever_the_caches_hold(proxy_url, llama):
    slots = httpx.get(llama.url + "/props").json()["total_slots"]
    seen = {"cold": _probs(_ask(proxy_url, {"q": TEAM})["q"])}
    seen["warm"] = _probs(_ask(proxy_url, {"q": TEAM})["q"])
    _ask(proxy_url, {"o": REFUND}, state="An unrelated short message about a login problem.")
    seen["after an unrelated request"] = _probs(_ask(proxy_url, {"q": TEAM})["q"])
    for i in range(slots + 2):  # more other prompts than there are slots
        _ask(proxy_url, {"o": REFUND}, state=f"Filler {i}: " + STATE[: 300 + 41 * i])
    seen["after filling every slot"] = _probs(_ask(proxy_url, {"q": TEAM})["q"])
    _ask(proxy_url, {"o": REFUND})  # the state now cached by another question
    seen["state cached by another question"] = _probs(_ask(proxy_url, {"q": TEAM})["q"])
    seen["second of two questions"] = _probs(_ask(proxy_url, {"o": REFUND, "q": TEAM})["q"])
    moved = {case: _moved(seen["cold"], probs) for case, probs in seen.items()}
    assert all(dp <= 1e-6 for dp in moved.values()), moved


def test_a_chat_decision_reads_the_same_cold_and_warm(proxy_url, llama):
    body = {
        "messages": [{"role": "user", "content": STATE + " Fresh chat, unseen before."}],
        "semif": {"options": ["billing", "shipping", "technical"]},
    }
    reads = [
        httpx.post(proxy_url + "/v1/chat/completions", json=body, timeout=120).json()
        for _ in range(2)
    ]
    first, second = (r["semif"]["probabilities"] for r in reads)
    assert reads[0]["usage"]["prompt_tokens"] > 300
    assert _moved(first, second) <= 1e-6


def _labelled(per_file: int) -> list[dict]:
    items = []
    for path in sorted(DATA.glob("*.jsonl")):
        lines = path.read_text().splitlines()[:per_file]
        items += [json.loads(line) for line in lines]
    return items


@pytest.fixture(scope="module")
def fresh_stack(logs_dir):
    proc, server, log = launch_llama(logs_dir, "llama-fresh")
    try:
        proxy, url, proxy_log = launch_proxy(logs_dir, server.url)
        try:
            yield url
        finally:
            stop(proxy)
            proxy_log.close()
    finally:
        stop(proc)
        log.close()


def test_a_labelled_set_sent_twice_on_a_fresh_stack_answers_identically(fresh_stack):
    items = _labelled(per_file=20)
    passes = [
        [_ask(fresh_stack, item["questions"], item["state"]) for item in items] for _ in range(2)
    ]
    assert len(items) == 60
    # the answers, less the server's self-check status (absent until the check has run)
    # and each answer's own decision id
    for answers in (a for run in passes for a in run):
        for answer in answers.values():
            answer.pop("x_repeatable", None)
            answer.pop("x_decision_id", None)
    assert passes[0] == passes[1]
