"""The prefix scheme on the real llama-server (-ub 63, proxy/kv.py): a new conversation
is read in one request (two past 256 tokens), whatever prefix its slot holds, and gives
the same probabilities bit for bit read cold, after another conversation with the same
opening, after someone else's request or a relayed chat request used the slot, and after
a llama-server restart;
the self-check reads a known prompt four ways and reports the result."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from scripts.stack import stop
from tests.conftest import launch_llama, launch_proxy

OPTIONS = {
    "billing": "charges, refunds, invoices",
    "shipping": "parcels and delivery",
    "technical": None,
}
SHORT = "I was charged twice for order 1182 and want one of the payments back."
LONG = " ".join([SHORT] * 18)  # about 350 tokens with the options: past 256


def _decide(url: str, number: int, text: str) -> dict:
    body = {
        "messages": [{"role": "user", "content": f"Ticket {number}: {text}"}],
        "semif": {"options": OPTIONS},
    }
    resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _decide_when_up(url: str, number: int, text: str) -> dict:
    """A decision once the proxy has seen llama-server back (503 until then)."""
    deadline = time.monotonic() + 60
    while True:
        body = {
            "messages": [{"role": "user", "content": f"Ticket {number}: {text}"}],
            "semif": {"options": OPTIONS},
        }
        resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
        if resp.status_code != 503 or time.monotonic() > deadline:
            assert resp.status_code == 200, resp.text
            return resp.json()
        time.sleep(0.5)


def _wait_checked(url: str) -> dict:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        checks = httpx.get(url + "/v1/models", timeout=60).json()["x_repeatable"]
        (check,) = checks.values()
        if check["repeatable"] is not None:
            return check
        time.sleep(0.5)
    raise AssertionError("the self-check did not finish")


def test_the_self_check_passes_here_and_answers_say_so(proxy_url):
    _decide(proxy_url, 1, SHORT)
    check = _wait_checked(proxy_url)  # settled before ready: read, or kept from the session's
    assert (check["read_scheme"], check["repeatable"]) == ("prefix-63", True), check
    assert re.fullmatch(r"4 reads identical( \(kept from the check at \d+\))?", check["detail"])
    answer = _decide(proxy_url, 2, SHORT)["semif"]
    assert (answer["read_scheme"], answer["repeatable"]) == ("prefix-63", True)
    metrics = httpx.get(proxy_url + "/metrics", timeout=30).text
    assert 'semif_read_repeatable{model="SmolLM2-135M-Instruct.Q4_1"} 1.0' in metrics


@pytest.fixture(scope="module")
def own_stack(logs_dir):
    """A llama-server and a proxy of this module's own, so a restart harms no other test."""
    proc, server, log = launch_llama(logs_dir, "llama-prefix")
    proxy, url, proxy_log = launch_proxy(logs_dir, server.url)
    state = {"proc": proc, "log": log}
    try:
        yield url, server, state
    finally:
        stop(proxy)
        proxy_log.close()
        stop(state["proc"])
        state["log"].close()


@pytest.mark.parametrize("text", [SHORT, LONG], ids=["short", "past-256-tokens"])
def test_a_new_conversation_reads_the_same_whatever_its_slot_held(own_stack, logs_dir, text):
    url, server, state = own_stack
    cold = _decide(url, 1001, text)
    seen = {
        "cold": cold["semif"]["probabilities"],
        "as a replay": _decide(url, 1001, text)["semif"]["probabilities"],
    }
    # another conversation with the same opening ("Ticket 100..."), then ours again
    _decide(url, 1002, text[::-1])
    again = _decide(url, 1001, text)
    seen["after another conversation"] = again["semif"]["probabilities"]
    # someone else's request straight to llama-server in every slot, sharing the opening
    # (within the first 256 cells): a long read goes on from what its request left there
    slots = httpx.get(server.url + "/props", timeout=30).json()["total_slots"]
    for slot in range(slots):
        other = {
            "messages": [{"role": "user", "content": f"Ticket 1001: {SHORT[::-1]}"}],
            "max_tokens": 1,
            "id_slot": slot,
        }
        resp = httpx.post(server.url + "/v1/chat/completions", json=other, timeout=120)
        assert resp.status_code == 200, resp.text
    found = _decide(url, 1001, text)
    seen["after someone else's request"] = found["semif"]["probabilities"]
    # its opening reused, the rest evaluated once: not again from position 0 (0 cached),
    # and not a replay of what the slot held before (all but the last token cached)
    assert 0 < found["usage"]["prompt_tokens_details"]["cached_tokens"] <= 256, found["usage"]
    # a relayed chat request that starts like ours and generates into a slot
    relayed = {
        "messages": [{"role": "user", "content": f"Ticket 1001: {text}"}],
        "max_tokens": 8,
        "temperature": 0,
    }
    assert httpx.post(url + "/v1/chat/completions", json=relayed, timeout=120).status_code == 200
    seen["after a relayed chat request"] = _decide(url, 1001, text)["semif"]["probabilities"]
    # llama-server restarted on the same port: every slot empty
    stop(state["proc"])
    state["log"].close()
    state["proc"], _, state["log"] = launch_llama(logs_dir, "llama-prefix", server.port)
    seen["after a restart"] = _decide_when_up(url, 1001, text)["semif"]["probabilities"]
    assert all(probs == seen["cold"] for probs in seen.values()), seen
    assert cold["usage"]["prompt_tokens"] > (256 if text is LONG else 100)


def test_a_conversation_with_the_same_opening_reuses_it(own_stack):
    url, _, _ = own_stack
    _decide(url, 2001, SHORT)
    other = _decide(url, 2002, "The parcel never arrived.")
    cached = other["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 20  # the template's opening and "Ticket 200", from the slot


ROUTER = {
    "billing": "charges, refunds, invoices and payment methods",
    "shipping": "parcels, delivery times, tracking and returns",
    "technical": "log-in problems, crashes and error messages",
    "account": "profile changes, addresses and closing an account",
    "other": None,
}


def _route(url: str, ticket: str, layout: str) -> dict:
    body = {
        "messages": [{"role": "user", "content": ticket}],
        "semif": {"options": ROUTER, "layout": layout},
    }
    resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_options_first_keeps_the_classifiers_fixed_part_and_reads_repeatably(own_stack):
    url, _, _ = own_stack
    _decide(url, 3000, SHORT)
    _wait_checked(url)  # the self-check (after the first decision) has used two slots
    first = _route(url, "Ticket 3001: my card was charged twice.", "options_first")
    second = _route(url, "Ticket 3002: the parcel is late.", "options_first")
    conventional = _route(url, "Ticket 3003: the app crashes at log-in.", "conversation_first")
    fixed = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    # the instructions and five options come from the slot: only the ticket is new
    assert fixed >= 60 and second["usage"]["prompt_tokens"] - fixed < 40, second["usage"]
    # the conventional layout evaluates the options again after every ticket
    usage = conventional["usage"]
    assert usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"] >= 60
    semif = second["semif"]
    assert (semif["layout"], semif["prompt_format_version"]) == ("options_first", "semif-3")
    assert conventional["semif"]["prompt_format_version"] == "semif-1"
    again = _route(url, "Ticket 3001: my card was charged twice.", "options_first")
    assert again["semif"]["probabilities"] == first["semif"]["probabilities"]
