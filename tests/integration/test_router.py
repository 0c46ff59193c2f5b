"""Several models behind one proxy: llama-server in router mode (a preset of two models,
each a child llama-server of its own) and the real proxy in front. Both models are
SmolLM2's weights; the second is served with llama.cpp's built-in llama3 chat template,
so the two differ where the proxy must keep things per model: the template, the labels
verified in its answer position, the prompts' tokens, the slots."""

from __future__ import annotations

import os
import subprocess

import httpx
import pytest

from scripts.stack import file_tail, stop, wait_ready
from tests.conftest import binaries, free_port, launch_proxy

CHAT = {
    "messages": [{"role": "user", "content": "Ticket: I was charged twice."}],
    "semif": {"options": ["billing", "shipping"]},
}
S1 = {
    "state": "I was charged twice.",
    "questions": {"topic": {"type": "choice", "criteria": {"billing": None, "shipping": None}}},
}


@pytest.fixture(scope="module")
def router(logs_dir, tmp_path_factory):
    binary, model = binaries()
    preset = tmp_path_factory.mktemp("router") / "models.ini"
    preset.write_text(
        "version = 1\n\n[*]\nc = 4096\nnp = 2\n\n"
        f"[smollm2]\nmodel = {model}\n\n"
        f"[smollm2-llama3]\nmodel = {model}\nchat-template = llama3\njinja = false\n"
    )
    port = free_port()
    log = open(logs_dir / f"router-{port}.log", "ab")
    env = {**os.environ, "LD_LIBRARY_PATH": str(binary.parent)}
    proc = subprocess.Popen(
        [
            str(binary),
            "--models-preset",
            str(preset),
            "--models-max",
            "2",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_ready(
            f"http://127.0.0.1:{port}/health",
            proc,
            why=lambda rc: f"the router exited with {rc}: {file_tail(log.name)}",
        )
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)
        log.close()


@pytest.fixture(scope="module")
def proxy(router, logs_dir):
    proc, url, log = launch_proxy(logs_dir, router)
    yield url
    stop(proc)
    log.close()


def chat(proxy: str, model: str | None, **extra):
    body = {**CHAT, **extra} if model is None else {**CHAT, "model": model, **extra}
    return httpx.post(proxy + "/v1/chat/completions", json=body, timeout=120)


def test_models_lists_every_model_and_the_default_names(proxy):
    ids = [m["id"] for m in httpx.get(proxy + "/v1/models", timeout=30).json()["data"]]
    assert {"smollm2", "smollm2-llama3", "jev-latest", "gpt-6-luna"} <= set(ids)
    assert len(ids) == len(set(ids))
    assert httpx.get(proxy + "/v1/models/smollm2-llama3").status_code == 200
    assert httpx.get(proxy + "/v1/models/nope").status_code == 404


def test_each_model_answers_decisions_under_its_own_name(proxy, router):
    answers = {}
    for model in ("smollm2", "smollm2-llama3"):
        first, again = chat(proxy, model), chat(proxy, model)
        assert first.status_code == 200, first.text
        body = first.json()
        assert body["model"] == model
        assert body["semif"]["choice"] in ("billing", "shipping")
        # the same request, the same answer (repeatable reads, per model)
        assert again.json()["semif"]["probabilities"] == body["semif"]["probabilities"]
        answers[model] = body
    # each was read through its own template: the prompts differ in length
    assert (
        answers["smollm2"]["usage"]["prompt_tokens"]
        != answers["smollm2-llama3"]["usage"]["prompt_tokens"]
    )
    # and in what the models say (the same weights, different prompts)
    assert (
        answers["smollm2"]["semif"]["probabilities"]
        != answers["smollm2-llama3"]["semif"]["probabilities"]
    )
    # both children are running: the router loaded each when its name was asked for
    status = {
        m["id"]: m["status"]["value"]
        for m in httpx.get(router + "/v1/models", timeout=30).json()["data"]
    }
    assert status == {"smollm2": "loaded", "smollm2-llama3": "loaded"}


def test_default_names_and_no_name_go_to_the_first_model(proxy):
    default = chat(proxy, "smollm2").json()["semif"]["probabilities"]
    assert chat(proxy, None).json()["semif"]["probabilities"] == default
    s1 = httpx.post(proxy + "/v1/systemone", json={**S1, "model": "jev-latest"}, timeout=120)
    named = httpx.post(proxy + "/v1/systemone", json={**S1, "model": "smollm2"}, timeout=120)
    assert s1.status_code == named.status_code == 200, s1.text
    assert _decided(s1) == _decided(named)
    other = httpx.post(proxy + "/v1/systemone", json={**S1, "model": "smollm2-llama3"}, timeout=120)
    assert other.status_code == 200 and _decided(other) != _decided(named)


def _decided(resp: httpx.Response) -> dict:
    """A System One answer's answers, less each one's own decision id."""
    return {
        qid: {k: v for k, v in answer.items() if k != "x_decision_id"}
        for qid, answer in resp.json()["answers"].items()
    }


def test_an_unknown_model_is_refused_naming_the_served_ones(proxy):
    resp = chat(proxy, "gpt-4o")
    error = resp.json()["error"]
    assert resp.status_code == 400 and error["code"] == "model_not_found"
    assert error["param"] == "model" and "smollm2-llama3" in error["message"]
    s1 = httpx.post(proxy + "/v1/systemone", json={**S1, "model": "gpt-4o"}, timeout=60)
    assert s1.status_code == 422 and s1.json()["detail"][0]["loc"] == ["body", "model"]


def test_generations_are_relayed_to_the_model_they_name(proxy):
    resp = httpx.post(
        proxy + "/v1/chat/completions",
        timeout=120,
        json={
            "model": "smollm2-llama3",
            "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}],
        },
    )
    assert resp.status_code == 200 and resp.json()["model"] == "smollm2-llama3"
