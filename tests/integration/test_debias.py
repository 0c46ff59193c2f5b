"""Cyclic debiasing: an option's probability stops depending on where it is shown."""

import json
from collections import Counter
from pathlib import Path

import httpx
import pytest

STATE = "The user wants a colour for the new logo and has no preference at all."
QUESTION = "Pick a colour for the logo; any of them is equally fine."


def _probs(proxy_url, criteria, **extra):
    body = {
        "state": STATE,
        "questions": {"q": {"type": "choice", "instructions": QUESTION, "criteria": criteria}},
        **extra,
    }
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
                debiased[0]["probabilities"][n], abs=0.02
            )


def test_chat_semif_debias_reports_its_reads(proxy_url):
    body = {
        "messages": [{"role": "user", "content": QUESTION}],
        "semif": {
            "options": ["red", "blue", "green", "black"],
            "debias": {"method": "cyclic", "rotations": 2},
        },
    }
    semif = httpx.post(proxy_url + "/v1/chat/completions", json=body, timeout=60).json()["semif"]
    assert semif["reads"] == 2
    assert sum(semif["probabilities"].values()) == pytest.approx(1, abs=1e-9)


def test_position_preference_falls_on_the_labelled_tickets(proxy_url):
    """SmolLM2 picks one position (B, in this layout) for nearly every ticket; the
    share of answers at the most favoured position must fall once debiased."""
    lines = (
        (Path(__file__).resolve().parents[1] / "data" / "tickets.jsonl").read_text().splitlines()
    )
    items = [json.loads(line) for line in lines[:12]]
    picks = {"plain": Counter(), "cyclic": Counter()}
    for item in items:
        ((qid, question),) = item["questions"].items()
        order = list(question["criteria"])
        for mode, extra in (("plain", {}), ("cyclic", {"x_debias": "cyclic"})):
            body = {"state": item["state"], "questions": item["questions"], **extra}
            answer = httpx.post(proxy_url + "/v1/systemone", json=body, timeout=120).json()[
                "answers"
            ][qid]
            picks[mode][order.index(answer["choice"])] += 1
    top_plain = max(picks["plain"].values()) / len(items)
    top_cyclic = max(picks["cyclic"].values()) / len(items)
    assert top_plain >= 0.75, picks  # the bias is there to remove
    assert top_cyclic < top_plain, picks


def _divided(probs, weights):
    raw = [p / w for p, w in zip(probs, weights)]
    return [r / sum(raw) for r in raw]


COLOURS = {"red": None, "blue": None, "green": None}


def test_cyclic_answers_carry_each_rotation_by_position(proxy_url):
    plain = _probs(proxy_url, COLOURS)
    cyclic = _probs(proxy_url, COLOURS, x_debias="cyclic")
    assert [r["shift"] for r in cyclic["x_rotations"]] == [0, 1, 2]
    # shift 0 shows the options in the caller's order: it is the plain read, exactly
    assert cyclic["x_rotations"][0]["by_position"] == pytest.approx(
        [plain["probabilities"][n] for n in COLOURS], rel=1e-12
    )
    shown_second = cyclic["x_rotations"][1]["by_position"]  # blue, green, red
    mean_red = (
        plain["probabilities"]["red"] + shown_second[2] + cyclic["x_rotations"][2]["by_position"][1]
    ) / 3
    assert cyclic["probabilities"]["red"] == pytest.approx(mean_red, rel=1e-9)
    assert cyclic["x_debias"] == "cyclic" and "x_rotations" not in plain


def test_contextual_calibration_divides_out_the_content_free_answer_read_once(proxy_url):
    criteria = {"sky": None, "sea": None, "forest": None}
    free = httpx.post(
        proxy_url + "/v1/systemone",
        timeout=120,
        json={
            "state": "N/A",
            "questions": {"q": {"type": "choice", "instructions": QUESTION, "criteria": criteria}},
        },
    ).json()["answers"]["q"]
    plain = _probs(proxy_url, criteria)
    first = _probs(proxy_url, criteria, x_debias="contextual")
    names = list(criteria)
    expected = _divided(
        [plain["probabilities"][n] for n in names], [free["probabilities"][n] for n in names]
    )
    assert [first["probabilities"][n] for n in names] == pytest.approx(expected, rel=1e-9)
    assert first["x_debias"] == "contextual" and first["x_reads"] == plain["x_reads"] + 1
    # another state, the same question template: the content-free answer is remembered
    body = {
        "state": "Our logo should look calm.",
        "x_debias": "contextual",
        "questions": {"q": {"type": "choice", "instructions": QUESTION, "criteria": criteria}},
    }
    again = httpx.post(proxy_url + "/v1/systemone", json=body, timeout=120).json()["answers"]["q"]
    assert again["x_reads"] == plain["x_reads"]
    assert first["x_label_mass"] == pytest.approx(plain["x_label_mass"], rel=1e-12)


def test_chat_semif_takes_contextual_calibration(proxy_url):
    body = {
        "messages": [{"role": "user", "content": "Which colour calms people most?"}],
        "semif": {"options": ["violet", "orange"], "debias": "contextual"},
    }
    semif = httpx.post(proxy_url + "/v1/chat/completions", json=body, timeout=60).json()["semif"]
    assert semif["debias"] == "contextual" and semif["reads"] == 2
    assert sum(semif["probabilities"].values()) == pytest.approx(1, abs=1e-9)


@pytest.mark.parametrize(
    ("where", "body", "status"),
    [
        (
            "/v1/systemone",
            {
                "state": "s",
                "x_debias": "pride",
                "questions": {"q": {"type": "choice", "criteria": ["a", "b"]}},
            },
            422,
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "q"}],
                "semif": {"options": ["a", "b"], "debias": "pride"},
            },
            400,
        ),
    ],
)
def test_pride_without_a_profile_is_refused_with_what_to_do(proxy_url, where, body, status):
    resp = httpx.post(proxy_url + where, json=body, timeout=60)
    assert resp.status_code == status, resp.text
    assert "--debias pride" in resp.text
