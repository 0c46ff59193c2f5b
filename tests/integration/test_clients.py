"""Clients that map answers onto typed OpenAI objects keep only the fields they know: the
decision's distribution must reach them through ``choices[0].logprobs``."""

import math

import pytest
from langchain_openai import ChatOpenAI

OPTIONS = ["billing", "shipping", "technical"]
TICKET = "Ticket: I was charged twice for my order last week."


def _from_logprobs(logprobs: dict) -> dict[str, float]:
    (position,) = logprobs["content"]
    return {e["token"]: math.exp(e["logprob"]) for e in position["top_logprobs"]}


def test_langchain_gets_the_distribution_in_response_metadata(proxy_url):
    chat = ChatOpenAI(
        base_url=proxy_url + "/v1",
        api_key="unused",
        model="smollm2",
        logprobs=True,
        top_logprobs=3,
        max_retries=0,
    )
    message = chat.invoke(TICKET, extra_body={"semif": {"options": OPTIONS}})
    assert message.content in OPTIONS
    got = _from_logprobs(message.response_metadata["logprobs"])
    assert set(got) == set(OPTIONS) and max(got, key=got.get) == message.content
    assert math.fsum(got.values()) == pytest.approx(1.0, rel=1e-9)


def test_langchain_streams_the_distribution_too(proxy_url):
    chat = ChatOpenAI(
        base_url=proxy_url + "/v1",
        api_key="unused",
        model="smollm2",
        logprobs=True,
        top_logprobs=2,
        max_retries=0,
        streaming=True,
    )
    chunks = list(chat.stream(TICKET, extra_body={"semif": {"options": OPTIONS}}))
    logprobs = [
        c.response_metadata["logprobs"] for c in chunks if c.response_metadata.get("logprobs")
    ]
    assert len(logprobs) == 1 and len(_from_logprobs(logprobs[0])) == 2


def test_the_openai_sdk_reads_the_same_numbers_as_semif(proxy_url):
    import openai

    with openai.OpenAI(base_url=proxy_url + "/v1", api_key="unused", max_retries=0) as client:
        resp = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": TICKET}],
            logprobs=True,
            top_logprobs=20,
            extra_body={"semif": {"options": OPTIONS}},
        )
    semif = resp.model_extra["semif"]
    top = resp.choices[0].logprobs.content[0].top_logprobs
    assert {e.token: math.exp(e.logprob) for e in top} == pytest.approx(
        semif["probabilities"], rel=1e-12
    )
    assert semif["logprobs_of"] == "read"
