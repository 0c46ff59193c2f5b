"""The same proxy against llama.cpp b11434 (the official Docker image's build),
compiled from source once and cached (scripts/prepare.py --source)."""

import math

import httpx
import openai
import pytest

from scripts.prepare import ensure_llama_server, ensure_model
from scripts.stack import start_llama_server, stop, wait_ready
from tests.conftest import free_port, launch_proxy

TICKET = [{"role": "user", "content": "Ticket: my parcel never arrived."}]


@pytest.fixture(scope="module")
def b11434(logs_dir):
    binary = ensure_llama_server(source=True)
    port = free_port()
    with open(logs_dir / "llama-b11434.log", "ab") as log:
        proc = start_llama_server(binary, ensure_model(), port, log=log)
        try:
            wait_ready(f"http://127.0.0.1:{port}/health", proc)
            yield f"http://127.0.0.1:{port}"
        finally:
            stop(proc)


@pytest.fixture(scope="module")
def proxy_b11434(b11434, logs_dir):
    proc, url, log = launch_proxy(logs_dir, b11434)
    yield url
    stop(proc)
    log.close()


def test_it_is_really_b11434(b11434):
    assert httpx.get(b11434 + "/props").json()["build_info"].startswith("b11434")


def test_decision_and_relay_work_against_b11434(proxy_b11434, b11434):
    options = [f"queue {i}" for i in range(30)]
    with openai.OpenAI(base_url=proxy_b11434 + "/v1", api_key="x", max_retries=0) as client:
        for _ in range(2):  # the second read is served from the prompt cache
            resp = client.chat.completions.create(
                model="m", messages=TICKET, extra_body={"semif": {"options": options}}
            )
        semif = resp.model_extra["semif"]
        assert math.fsum(semif["probabilities"].values()) == pytest.approx(1, abs=1e-12)
        assert resp.choices[0].message.content == semif["choice"]
        plain = client.chat.completions.create(model="m", messages=TICKET, max_tokens=4)
        assert plain.choices[0].message.content
