"""The slow model (scripts/slow_model.py, K = 2) made from the real default model: its blocks
repeated, and llama-server's top log-probabilities on it those of the default model."""

from __future__ import annotations

import gguf
import httpx
import pytest

from scripts.prepare import ensure_model
from scripts.stack import stop
from tests.conftest import LlamaServer, launch_llama, slow_model
from tests.unit.test_slow_model import assert_slow_copy

K = 2  # the fastest to make and to start; every K adds zero the same way
PROMPTS = [
    "The capital of France is",
    "Ticket: my parcel never arrived. Category:",
]


@pytest.fixture(scope="module")
def slow_llama(logs_dir):
    proc, server, log = launch_llama(logs_dir, f"llama-slow-k{K}", model=slow_model(K))
    yield server
    stop(proc)
    log.close()


def test_the_slow_model_is_the_default_models_blocks_repeated():
    source = gguf.GGUFReader(ensure_model())
    assert source.get_field("llama.block_count").contents() == 30
    assert_slow_copy(source, gguf.GGUFReader(slow_model(K)), K, zero=True)


def _top5(server: LlamaServer, prompt: str) -> list[list[tuple[int, float]]]:
    """The top 5 log-probabilities at each of 3 greedy tokens, rounded to 6 decimals."""
    server.wait_idle()
    body = {
        "prompt": prompt,
        "n_predict": 3,
        "n_probs": 5,
        "temperature": 0,
        "cache_prompt": False,
    }
    resp = httpx.post(server.url + "/completion", json=body, timeout=120)
    resp.raise_for_status()
    return [
        [(entry["id"], round(entry["logprob"], 6)) for entry in position["top_logprobs"]]
        for position in resp.json()["completion_probabilities"]
    ]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_top_logprobs_equal_the_default_models(llama, slow_llama, prompt):
    assert slow_llama.model.name.startswith(f"slow-k{K}-")
    expected = _top5(llama, prompt)
    assert len(expected) == 3 and all(len(position) == 5 for position in expected)
    assert _top5(slow_llama, prompt) == expected
