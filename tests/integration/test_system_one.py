"""System One on a plain chat GGUF, through the real proxy and llama-server."""

import math

import httpx
import pytest
from typesafe_sdk import Choice, Noul, Score, TypeSafeClient

STATE = (
    "Subject: charged twice\n\n"
    "Hello, my card was charged twice for order 1182 and the parcel is late."
)
TEAM = {
    "type": "choice",
    "instructions": "Which team should handle this ticket?",
    "criteria": {
        "billing": "charges, refunds, invoices",
        "shipping": "delivery, parcels",
        "technical": None,
    },
}
URGENCY = {
    "type": "score",
    "instructions": "How urgent is it?",
    "criteria": ["can wait", "this week", "today"],
}
REFUND = {"type": "noul", "instructions": "Does the customer ask for money back?"}


def _ask(proxy_url, questions, state=STATE, **extra):
    resp = httpx.post(
        proxy_url + "/v1/systemone",
        timeout=120,
        json={"model": "jev-latest", "state": state, "questions": questions, **extra},
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_typesafe_sdk_parses_every_answer_type(proxy_url):
    with TypeSafeClient(base_url=proxy_url, api_key="any-key") as client:
        resp = client.system_one(
            STATE,
            {
                "team": Choice(instructions=TEAM["instructions"], criteria=TEAM["criteria"]),
                "urgency": Score(
                    instructions=URGENCY["instructions"], criteria=URGENCY["criteria"]
                ),
                "refund": Noul(instructions=REFUND["instructions"]),
            },
        )
    team, urgency, refund = resp.answers["team"], resp.answers["urgency"], resp.answers["refund"]
    assert team.choice in TEAM["criteria"]
    assert math.fsum(team.probabilities.values()) == pytest.approx(1, abs=1e-12)
    assert 0 <= team.confidence <= 1
    assert {str(k): v for k, v in urgency.legend.items()} == {
        "0": "can wait",
        "1": "this week",
        "2": "today",
    }
    expected = math.fsum(int(k) * p for k, p in urgency.probabilities.items())
    assert urgency.score == pytest.approx(expected, abs=1e-12)
    assert 0 < refund.noul < 1
    assert resp.usage.input_tokens > 0 and resp.usage.output_tokens == 3


def test_typesafe_sdk_lists_models(proxy_url):
    with TypeSafeClient(base_url=proxy_url, api_key="any-key") as client:
        names = [m.name for m in client.models.list().models]
    assert "jev-latest" in names


def test_models_list_has_both_shapes(proxy_url):
    body = httpx.get(proxy_url + "/v1/models").json()
    assert body["object"] == "list" and body["data"][0]["id"]
    assert {"name", "description", "release_date"} <= set(body["models"][0])


def test_models_show_no_file_paths_but_the_path_is_still_accepted(proxy_url, llama):
    body = httpx.get(proxy_url + "/v1/models").json()
    shown = [m["id"] for m in body["data"]] + [m["name"] for m in body["models"]]
    assert llama.model.stem in shown
    assert not [n for n in shown if "/" in n or n.endswith(".gguf")], shown
    assert body["x_llama_build"].startswith("b")
    for name in (llama.model.stem, str(llama.model)):  # the alias, and the path llama-server loaded
        resp = httpx.post(
            proxy_url + "/v1/systemone",
            timeout=60,
            json={"model": name, "state": "refund please", "questions": {"q": {"type": "noul"}}},
        )
        assert resp.status_code == 200, resp.text
        assert resp.json()["model"] == name
    other = httpx.post(
        proxy_url + "/v1/systemone",
        timeout=60,
        json={"model": "/elsewhere/other.gguf", "state": "x", "questions": {"q": {"type": "noul"}}},
    )
    assert other.status_code == 422
    assert str(llama.model) not in other.text  # the refusal lists names, not the path


def test_ids_and_names_are_echoed_byte_for_byte(proxy_url):
    qid = "route it 🚦 «now»"
    criteria = {" Billing ": None, "🚚 shipping & returns": "parcels", "tech\tsupport": None}
    answer = _ask(proxy_url, {qid: {"type": "choice", "criteria": criteria}})["answers"][qid]
    assert list(answer["probabilities"]) == list(criteria)


@pytest.mark.parametrize("n", [2, 26, 64, 128, 255])
def test_many_options_get_complete_distributions(proxy_url, n):
    criteria = {f"queue {i}": None for i in range(n)}
    answer = _ask(proxy_url, {"q": {"type": "choice", "criteria": criteria}})["answers"]["q"]
    assert list(answer["probabilities"]) == list(criteria)
    assert math.fsum(answer["probabilities"].values()) == pytest.approx(1, abs=1e-9)
    assert all(isinstance(p, float) and p >= 0 for p in answer["probabilities"].values())


@pytest.mark.parametrize("n", [2, 3, 5, 10])
def test_score_levels_get_complete_distributions(proxy_url, n):
    levels = [f"level {i}" for i in range(n)]
    answer = _ask(proxy_url, {"q": {"type": "score", "criteria": levels}})["answers"]["q"]
    assert list(answer["probabilities"]) == [str(i) for i in range(n)]
    assert math.fsum(answer["probabilities"].values()) == pytest.approx(1, abs=1e-9)
    assert 0 <= answer["score"] <= n - 1


def _close(a, b, tol=0.02):
    assert max(a["probabilities"], key=a["probabilities"].get) == max(
        b["probabilities"], key=b["probabilities"].get
    )
    for key in a["probabilities"]:
        assert a["probabilities"][key] == pytest.approx(b["probabilities"][key], abs=tol)


def test_answers_do_not_depend_on_other_questions_order_or_ids(proxy_url):
    alone = _ask(proxy_url, {"team": TEAM})["answers"]["team"]
    mixed = _ask(proxy_url, {"urgency": URGENCY, "refund": REFUND, "x": TEAM})["answers"]["x"]
    last = _ask(proxy_url, {"refund": REFUND, "other id": TEAM, "urgency": URGENCY})["answers"][
        "other id"
    ]
    for answer in (mixed, last):
        _close(alone, answer)


def test_same_request_five_times_is_stable(proxy_url):
    questions = {"team": TEAM, "urgency": URGENCY, "refund": REFUND}
    runs = [_ask(proxy_url, questions)["answers"] for _ in range(5)]
    for run in runs[1:]:
        for qid in ("team", "urgency"):
            _close(runs[0][qid], run[qid])
        assert run["refund"]["noul"] == pytest.approx(runs[0]["refund"]["noul"], abs=0.02)


def test_structured_state_and_instructions(proxy_url):
    state = {"subject": "charged twice", "messages": ["hello", "please refund"]}
    q = {
        "type": "noul",
        "instructions": {"task": "refund requested?"},
        "criteria": {"true": ["asks for money back"], "false": None},
    }
    answer = _ask(proxy_url, {"q": q}, state=state)["answers"]["q"]
    assert answer["type"] == "noul" and 0 < answer["noul"] < 1


def test_unknown_model_name_is_422(proxy_url):
    resp = httpx.post(
        proxy_url + "/v1/systemone",
        json={"model": "gpt-9", "state": "s", "questions": {"q": REFUND}},
    )
    assert resp.status_code == 422
    assert resp.json()["detail"][0]["loc"] == ["body", "model"]


@pytest.mark.parametrize(
    ("content", "loc"),
    [
        (b"not json", ["body"]),
        (b'{"questions": {"q": {"type": "noul"}}}', ["body", "state"]),
        (b'{"state": "s", "questions": {}}', ["body", "questions"]),
        (b'{"state": "s", "questions": {"q": {"type": "ranking"}}}', ["body", "questions", "q"]),
        (
            b'{"state": "s", "questions": {"q": {"type": "score", "criteria": {"a": 1}}}}',
            ["body", "questions", "q", "score", "criteria"],
        ),
    ],
)
def test_bad_requests_get_422_with_loc(proxy_url, content, loc):
    resp = httpx.post(
        proxy_url + "/v1/systemone", content=content, headers={"Content-Type": "application/json"}
    )
    assert resp.status_code == 422
    assert loc in [d["loc"] for d in resp.json()["detail"]]
