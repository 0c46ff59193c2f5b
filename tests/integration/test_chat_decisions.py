"""Decisions through the real proxy and llama-server, with the openai SDK as the client."""

import math

import httpx
import openai
import pytest

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


def _written_out(options, labels):
    """The decision prompt written out by hand from the documented format (not by the
    proxy's own ``options_block``): the ticket, the question, one line per option."""
    lines = "\n".join(f"{label}: {option}" for label, option in zip(labels, options))
    block = (
        f"Which option fits best?\n\nOptions:\n{lines}\n\n"
        "Answer with the label of the best option only."
    )
    return [{"role": "user", "content": TICKET[0]["content"] + "\n\n" + block}], block


def _post(llama, path, body):
    resp = httpx.post(llama.url + path, json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _direct_full_read(llama, labels, options, slot=0):
    """The whole vocabulary's log-probabilities at the answer position, straight from
    llama-server's /completion, evaluated the way the proxy promises to evaluate every read
    (docs/repeatability.md): the part before the question cold, the question's rows in
    chunks of 2 to 63 tokens, the last token alone. Returns the labels' log-probabilities
    and the number of prompt tokens."""
    convo, block = _written_out(options, labels)
    rendered = _post(
        llama,
        "/apply-template",
        {"messages": convo, "chat_template_kwargs": {"enable_thinking": False}},
    )["prompt"]
    tokens = _post(llama, "/tokenize", {"content": rendered, "add_special": True})["tokens"]
    before = _post(
        llama, "/tokenize", {"content": rendered[: rendered.rfind(block)], "add_special": True}
    )["tokens"]
    shared = (
        next(i for i, (a, b) in enumerate(zip(before, tokens)) if a != b)
        if before != tokens[: len(before)]
        else len(before)
    )
    base = {"id_slot": slot, "temperature": 0, "n_predict": 0}
    _post(llama, "/completion", {**base, "prompt": tokens[:shared], "cache_prompt": False})
    end, last = shared, len(tokens) - 1
    while end < last:
        size = min(50, last - end)
        if last - end - size == 1:
            size += 1  # never leave a one-token chunk
        end += size
        _post(llama, "/completion", {**base, "prompt": tokens[:end], "cache_prompt": True})
    grammar = "root ::= " + " | ".join(f'"{label}"' for label in labels)
    read = _post(
        llama,
        "/completion",
        {
            **base,
            "prompt": tokens,
            "cache_prompt": True,
            "n_predict": 1,
            "n_probs": 49152,
            "grammar": grammar,
        },
    )
    assert read["timings"]["prompt_n"] == 1  # the last token alone
    top = read["completion_probabilities"][0]["top_logprobs"]
    assert len(top) == 49152
    by_token = {entry["token"]: entry["logprob"] for entry in top}
    everything = math.fsum(math.exp(entry["logprob"]) for entry in top)
    return [by_token[label] for label in labels], len(tokens), everything


@pytest.mark.parametrize("n", [26, 255])
def test_every_option_is_exact_against_a_full_vocabulary_read(client, llama, n):
    options = [f"team {i:03d}" for i in range(n)]
    llama.wait_idle()  # an earlier test's generation would share (and change) the batch
    resp = _decide(client, {"options": options})
    semif = resp.model_extra["semif"]
    assert len(semif["probabilities"]) == n
    labels = [semif["labels"][name] for name in options]
    logprobs, prompt_tokens, everything = _direct_full_read(llama, labels, options)
    # the written-out prompt is the proxy's: usage counts it once per read (a widened read
    # sends it again, served from the cache)
    assert resp.usage.prompt_tokens == prompt_tokens * semif["reads"]
    total = math.fsum(math.exp(lp) for lp in logprobs)
    for name, lp in zip(options, logprobs):
        assert semif["probabilities"][name] == pytest.approx(math.exp(lp) / total, rel=1e-9), name
    # the log-probabilities come before the grammar: over the whole vocabulary they sum to
    # 1, and the labels, though the grammar allowed nothing else, hold less than all of it
    assert everything == pytest.approx(1.0, abs=1e-3)
    assert semif["label_mass"] == pytest.approx(total, rel=1e-9)
    assert semif["label_mass"] < 0.999


def test_semif_stream_is_one_chunk_then_done(client):
    with _decide(client, {"options": ["billing", "shipping"]}, stream=True) as stream:
        chunks = list(stream)
    assert len(chunks) == 1
    (chunk,) = chunks
    assert chunk.choices[0].delta.content in ("billing", "shipping")
    assert chunk.choices[0].finish_reason == "stop"
    assert chunk.model_extra["semif"]["choice"] == chunk.choices[0].delta.content
    assert chunk.usage is None  # not asked for


def test_semif_stream_sends_usage_last_when_asked(client):
    with _decide(
        client,
        {"options": ["billing", "shipping"]},
        stream=True,
        stream_options={"include_usage": True},
    ) as stream:
        answer, closing = list(stream)
    assert answer.usage is None and answer.choices[0].delta.content in ("billing", "shipping")
    assert closing.choices == [] and closing.usage.completion_tokens == 1
    assert closing.usage.prompt_tokens > closing.usage.prompt_tokens_details.cached_tokens >= 0
