"""Cyclic debiasing: an option's probability stops depending on where it is shown."""

import json
from collections import Counter
from pathlib import Path

import httpx
import pytest

STATE = "The user wants a colour for the new logo and has no preference at all."
QUESTION = "Pick a colour for the logo; any of them is equally fine."


def _probs(proxy_url, criteria, **extra):
    body = {"state": STATE, "questions": {"q": {"type": "choice", "instructions": QUESTION,
                                                  "criteria": criteria}}, **extra}
    resp = httpx.post(proxy_url + "/v1/systemone", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()["answers"]["q"]


@pytest.mark.parametrize("names", [["red", "blue"], ["red", "blue", "green"]])
def test_probabilities_do_not_depend_on_position_once_debiased(proxy_url, names):
    orders = [names[i:] + names[:i] for i in range(len(names))]
    plain = [_probs(proxy_url, dict.fromkeys(order))["probabilities"] for order in orders]
    debiased = [_probs(proxy_url, dict.fromkeys(order), x_debias="cyclic") for order in orders]
    # without debiasing the tiny model follows the position, not the colour
    spread_plain = max(max(p[n] for p in plain) - min(p[n] for p in plain) for n in names)
    assert spread_plain > 0.1
    for answer in debiased:
        assert answer["x_reads"] == len(names)
        for n in names:
            assert answer["probabilities"][n] == pytest.approx(
                debiased[0]["probabilities"][n], abs=0.02)


def test_chat_semif_debias_reports_its_reads(proxy_url):
    body = {"messages": [{"role": "user", "content": QUESTION}],
            "semif": {"options": ["red", "blue", "green", "black"], "debias":
                      {"method": "cyclic", "rotations": 2}}}
    semif = httpx.post(proxy_url + "/v1/chat/completions", json=body, timeout=60).json()["semif"]
    assert semif["reads"] == 2
    assert sum(semif["probabilities"].values()) == pytest.approx(1, abs=1e-9)


def test_position_preference_falls_on_the_labelled_tickets(proxy_url):
    """SmolLM2 picks one position (B, in this layout) for nearly every ticket; the
    share of answers at the most favoured position must fall once debiased."""
    lines = (Path(__file__).resolve().parents[1] / "data" / "tickets.jsonl").read_text().splitlines()
    items = [json.loads(line) for line in lines[:12]]
    picks = {"plain": Counter(), "cyclic": Counter()}
    for item in items:
        (qid, question), = item["questions"].items()
        order = list(question["criteria"])
        for mode, extra in (("plain", {}), ("cyclic", {"x_debias": "cyclic"})):
            body = {"state": item["state"], "questions": item["questions"], **extra}
            answer = httpx.post(proxy_url + "/v1/systemone", json=body, timeout=120).json()["answers"][qid]
            picks[mode][order.index(answer["choice"])] += 1
    top_plain = max(picks["plain"].values()) / len(items)
    top_cyclic = max(picks["cyclic"].values()) / len(items)
    assert top_plain >= 0.75, picks  # the bias is there to remove
    assert top_cyclic < top_plain, picks
