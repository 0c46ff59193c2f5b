"""The OpenAI Decisions API through the real proxy and llama-server, with the openai SDK."""

import math

import httpx
import openai
import pytest
from openai.types.decision import (
    AnswerAnswerResourceChoice,
    AnswerAnswerResourcePredicate,
    AnswerAnswerResourceScore,
)

STATE = (
    "Subject: charged twice\n\n"
    "Hello, my card was charged twice for order 1182 and the parcel is late."
)
REFUND = {
    "type": "predicate",
    "name": "refund",
    "instructions": "Does the customer ask for money back?",
}
TEAM = {
    "type": "choice",
    "instructions": "Which team should handle this ticket?",
    "choices": [
        {"value": "billing", "description": "charges, refunds, invoices"},
        {"value": "shipping", "description": "delivery, parcels"},
        {"value": "technical"},
    ],
}
URGENCY = {
    "type": "score",
    "name": "urgency",
    "instructions": "How urgent is it?",
    "levels": [{"label": "can wait"}, {"label": "this week"}, {"label": "today"}],
}
# The same questions in System One form.
SYSTEM_ONE = {
    "refund": {"type": "noul", "instructions": REFUND["instructions"]},
    "team": {
        "type": "choice",
        "instructions": TEAM["instructions"],
        "criteria": {
            "billing": "charges, refunds, invoices",
            "shipping": "delivery, parcels",
            "technical": None,
        },
    },
    "urgency": {
        "type": "score",
        "instructions": URGENCY["instructions"],
        "criteria": ["can wait", "this week", "today"],
    },
}


@pytest.fixture(scope="module")
def client(proxy_url):
    with openai.OpenAI(base_url=proxy_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def test_sdk_parses_every_answer_type(client, model):
    resp = client.decisions.create(model=model, input=STATE, questions=[REFUND, TEAM, URGENCY])
    refund, team, urgency = resp.answers
    assert isinstance(refund, AnswerAnswerResourcePredicate) and refund.name == "refund"
    assert isinstance(team, AnswerAnswerResourceChoice) and team.name is None
    assert isinstance(urgency, AnswerAnswerResourceScore) and urgency.name == "urgency"
    assert resp.model == model and 0 < refund.probability < 1
    team_probs = {p.value: p.probability for p in team.probabilities}
    assert list(team_probs) == ["billing", "shipping", "technical"]
    assert math.fsum(team_probs.values()) == pytest.approx(1, abs=1e-12)
    assert team.choice == max(team_probs, key=team_probs.get)
    assert team.confidence == pytest.approx((3 * max(team_probs.values()) - 1) / 2, abs=1e-12)
    assert [(p.label, p.value) for p in urgency.probabilities] == [
        ("can wait", 0),
        ("this week", 1),
        ("today", 2),
    ]
    assert math.fsum(p.probability for p in urgency.probabilities) == pytest.approx(1, abs=1e-12)
    expected = math.fsum(p.value * p.probability for p in urgency.probabilities)
    assert urgency.score == pytest.approx(expected, abs=1e-12) and 0 <= urgency.confidence <= 1
    usage = resp.usage
    assert usage.input_tokens > 0 and usage.output_tokens == 3
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_answers_match_system_one(client, model, proxy_url):
    s1 = httpx.post(
        proxy_url + "/v1/systemone",
        timeout=120,
        json={"model": "jev-latest", "state": STATE, "questions": SYSTEM_ONE},
    ).json()["answers"]
    refund, team, urgency = client.decisions.create(
        model=model, input=STATE, questions=[REFUND, TEAM, URGENCY]
    ).answers
    assert refund.probability == pytest.approx(s1["refund"]["noul"], abs=0.02)
    for p in team.probabilities:
        assert p.probability == pytest.approx(s1["team"]["probabilities"][p.value], abs=0.02)
    assert team.choice == s1["team"]["choice"]
    for p in urgency.probabilities:
        assert p.probability == pytest.approx(
            s1["urgency"]["probabilities"][str(p.value)], abs=0.02
        )
    assert urgency.score == pytest.approx(s1["urgency"]["score"], abs=0.02)


def test_items_are_read_as_their_transcript(client, model):
    items = [
        {"role": "system", "content": "You route support tickets."},
        {"role": "user", "content": [{"type": "input_text", "text": STATE}]},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "order_status",
            "arguments": '{"id": 1182}',
        },
        {"type": "function_call_output", "call_id": "c1", "output": "shipped 9 days ago"},
    ]
    transcript = (
        f"system: You route support tickets.\nuser: {STATE}\n"
        'function_call order_status (c1): {"id": 1182}\n'
        "function_call_output (c1): shipped 9 days ago"
    )
    # The same prompt either way, read the same way (proxy/kv.py): the same numbers, exactly.
    as_items = client.decisions.create(model=model, input=items, questions=[TEAM]).answers[0]
    as_text = client.decisions.create(model=model, input=transcript, questions=[TEAM]).answers[0]
    assert [(a.value, a.probability) for a in as_items.probabilities] == [
        (b.value, b.probability) for b in as_text.probabilities
    ]


def test_boolean_choice_values_stay_booleans(client, model):
    question = {
        "type": "choice",
        "instructions": "Was the customer charged twice?",
        "choices": [{"value": True}, {"value": False, "description": "charged once"}],
    }
    answer = client.decisions.create(model=model, input=STATE, questions=[question]).answers[0]
    assert [p.value for p in answer.probabilities] == [True, False]
    assert isinstance(answer.choice, bool)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "see"},
                            {"type": "input_image", "image_url": "data:,"},
                        ],
                    }
                ],
                "questions": [REFUND],
            },
            "input.0.content.1",
        ),
        (
            {"input": STATE, "questions": [REFUND, {**TEAM, "choices": TEAM["choices"][:1]}]},
            "questions.1.choices",
        ),
        ({"input": STATE, "questions": []}, "questions"),
        ({"model": "gpt-4o", "input": STATE, "questions": [REFUND]}, "model"),
    ],
)
def test_bad_requests_get_openai_errors_naming_the_field(proxy_url, model, body, param):
    resp = httpx.post(proxy_url + "/v1/decisions", json={"model": model, **body}, timeout=60)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"]) == ("invalid_request_error", param)


def test_sdk_raises_bad_request_for_an_image(client, model):
    image = {"type": "input_image", "image_url": "https://example.com/a.png"}
    with pytest.raises(openai.BadRequestError) as caught:
        client.decisions.create(
            model=model, input=[{"role": "user", "content": [image]}], questions=[REFUND]
        )
    assert caught.value.body["param"] == "input.0.content.0"


def test_malformed_json_is_400(proxy_url):
    resp = httpx.post(
        proxy_url + "/v1/decisions",
        content=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "invalid_json"


def test_the_documented_model_name_works_and_usage_has_openais_meaning(client, proxy_url):
    first = client.decisions.create(model="gpt-6-luna", input=STATE, questions=[REFUND, TEAM])
    again = client.decisions.create(model="gpt-6-luna", input=STATE, questions=[REFUND, TEAM])
    s1 = httpx.post(
        proxy_url + "/v1/systemone",
        timeout=120,
        json={"state": STATE, "questions": {k: SYSTEM_ONE[k] for k in ("refund", "team")}},
    ).json()
    prompt_tokens = sum(a["x_prompt_tokens"] for a in s1["answers"].values())
    # every prompt token counts, however many llama-server had cached
    assert first.model == "gpt-6-luna"
    assert first.usage.input_tokens == again.usage.input_tokens == prompt_tokens
    assert s1["usage"]["input_tokens"] == prompt_tokens
    cached = again.usage.input_tokens_details.cached_tokens
    assert 0 < cached < again.usage.input_tokens  # the state was cached, the last token not
    assert s1["usage"]["x_cached_input_tokens"] > 0


@pytest.mark.parametrize("name", ["jev-latest", "gpt-6-luna"])
def test_models_retrieve_knows_every_listed_name(client, name):
    listed = [m.id for m in client.models.list().data]
    assert name in listed
    assert client.models.retrieve(name).id == name


def test_an_unknown_model_is_a_404_in_openais_shape(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-4o")
    assert err.value.body["code"] == "model_not_found"
