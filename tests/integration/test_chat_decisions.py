"""Decisions through the real proxy and llama-server, with the openai SDK as the client."""

import math

import httpx
import openai
import pytest

from proxy.decision.prompt import append_to_conversation, options_block
from proxy.decision.question import choice_question

TICKET = [{"role": "user", "content": "Ticket: I was charged twice for my order last week."}]


@pytest.fixture(scope="module")
def client(proxy_url):
    with openai.OpenAI(base_url=proxy_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def _decide(client, semif, messages=TICKET, **kw):
    return client.chat.completions.create(
        model="smollm2", messages=messages, extra_body={"semif": semif}, **kw
    )


def test_choice_distribution_sums_to_one_and_argmax_is_the_content(client):
    options = {"billing": "charges and refunds", "shipping": None, "technical": "bugs"}
    resp = _decide(client, {"options": options})
    semif = resp.model_extra["semif"]
    probs = semif["probabilities"]
    assert list(probs) == list(options)
    assert math.fsum(probs.values()) == pytest.approx(1.0, abs=1e-12)
    assert resp.choices[0].message.content == max(probs, key=probs.get) == semif["choice"]
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.prompt_tokens > 20 and resp.usage.completion_tokens == 1
    assert 0 < semif["label_mass"] <= 1
    n, top = len(probs), max(probs.values())
    assert semif["confidence"] == pytest.approx(max(0.0, (n * top - 1) / (n - 1)), abs=1e-12)
    assert semif["prompt_format_version"] == "semif-1"


def test_noul(client):
    resp = _decide(client, {"type": "noul", "options": {"true": "the customer was overcharged"}})
    semif = resp.model_extra["semif"]
    assert semif["type"] == "noul"
    assert semif["noul"] == pytest.approx(semif["probabilities"]["true"], abs=0)
    assert resp.choices[0].message.content == ("true" if semif["noul"] >= 0.5 else "false")
    assert "confidence" not in semif


def test_score(client):
    levels = ["not urgent", "somewhat urgent", "urgent", "critical"]
    resp = _decide(client, {"type": "score", "options": levels})
    semif = resp.model_extra["semif"]
    probs = [semif["probabilities"][str(i)] for i in range(4)]
    assert semif["legend"] == {str(i): lv for i, lv in enumerate(levels)}
    assert semif["score"] == pytest.approx(sum(i * p for i, p in enumerate(probs)), abs=1e-12)
    assert resp.choices[0].message.content == str(max(range(4), key=probs.__getitem__))


def test_temperature_divides_the_log_probabilities(client, llama):
    options = ["billing", "shipping", "technical"]
    llama.wait_idle()
    plain = _decide(client, {"options": options}).model_extra["semif"]
    hot = _decide(client, {"options": options, "temperature": 2.0}).model_extra["semif"]
    # p_T ∝ p^(1/T): recover p_T from p and compare (same cached prompt, same numerics)
    root = {k: math.sqrt(v) for k, v in plain["probabilities"].items()}
    total = sum(root.values())
    expected = {k: v / total for k, v in root.items()}
    assert hot["probabilities"] == pytest.approx(expected, abs=1e-6)
    assert hot["choice"] == plain["choice"]


def _direct_full_read(llama, semif_answer, options):
    """Ask llama-server itself for the whole vocabulary's log-probabilities."""
    labels = [semif_answer["labels"][name] for name in options]
    convo = append_to_conversation(TICKET, options_block(choice_question(options), labels))
    body = {
        "messages": convo, "max_tokens": 1, "temperature": 0, "logprobs": True,
        "top_logprobs": 49152, "chat_template_kwargs": {"enable_thinking": False},
        "grammar": "root ::= " + " | ".join(f'"{lb}"' for lb in labels),
    }
    data = httpx.post(llama.url + "/v1/chat/completions", json=body, timeout=120).json()
    top = data["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    assert len(top) == 49152
    by_token = {entry["token"]: entry["logprob"] for entry in top}
    logprobs = [by_token[label] for label in labels]
    total = math.fsum(math.exp(lp) for lp in logprobs)
    return {name: math.exp(lp) / total for name, lp in zip(options, logprobs)}


@pytest.mark.parametrize("n", [26, 255])
def test_every_option_is_exact_against_a_full_vocabulary_read(client, llama, n):
    options = [f"team {i:03d}" for i in range(n)]
    llama.wait_idle()  # an earlier test's generation would share (and change) the batch
    _decide(client, {"options": options})  # warm the prompt cache: later reads are 1-token evals
    semif = _decide(client, {"options": options}).model_extra["semif"]
    assert len(semif["probabilities"]) == n
    direct = _direct_full_read(llama, semif, options)
    for name in options:
        assert semif["probabilities"][name] == pytest.approx(direct[name], abs=1e-6), name


def test_semif_stream_is_one_chunk_then_done(client):
    with _decide(client, {"options": ["billing", "shipping"]}, stream=True) as stream:
        chunks = list(stream)
    assert len(chunks) == 1
    (chunk,) = chunks
    assert chunk.choices[0].delta.content in ("billing", "shipping")
    assert chunk.choices[0].finish_reason == "stop"
    assert chunk.model_extra["semif"]["choice"] == chunk.choices[0].delta.content
