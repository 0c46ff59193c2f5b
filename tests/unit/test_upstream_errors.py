"""upstream.py against a stand-in HTTP server: every failure maps to our hierarchy."""

import asyncio
import socket

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.config import Settings
from proxy.errors import (
    UpstreamBadResponse,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from proxy.upstream import NextToken, Upstream, parse_models

GOOD = {
    "model": "m",
    "choices": [
        {
            "logprobs": {
                "content": [
                    {
                        "top_logprobs": [
                            {"id": 49, "token": "A", "logprob": -0.5},
                            {"id": 50, "token": "B", "logprob": -1.5},
                        ]
                    }
                ]
            }
        }
    ],
    "usage": {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 7}},
}


async def _truncated(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Length": "1000", "Content-Type": "application/json"}
    )
    await resp.prepare(request)
    await resp.write(b'{"choices": [')
    request.transport.close()
    return resp


async def _slow(request: web.Request) -> web.Response:
    await asyncio.sleep(2)
    return web.json_response(GOOD)


BEHAVIOURS = {
    "good": lambda r: web.json_response(GOOD),
    "loading": lambda r: web.json_response(
        {"error": {"code": 503, "message": "Loading model"}}, status=503
    ),
    "too_long": lambda r: web.json_response(
        {"error": {"code": 400, "message": "exceeds the available context size"}}, status=400
    ),
    "crash": lambda r: web.json_response({"error": {"message": "out of memory"}}, status=500),
    "forbidden": lambda r: web.json_response({"error": {"message": "Invalid API Key"}}, status=401),
    "not_json": lambda r: web.Response(text="<html>oops</html>"),
    "no_logprobs": lambda r: web.json_response({"choices": [{"message": {"content": "A"}}]}),
    "truncated": _truncated,
    "slow": _slow,
}


@pytest.fixture
async def stand_in():
    mode = {"now": "good", "dropped": 0}

    async def handler(request: web.Request) -> web.StreamResponse:
        if mode["now"] == "drop" or (mode["now"] == "drop_once" and not mode["dropped"]):
            mode["dropped"] += 1
            request.transport.close()  # no answer at all
            return web.Response()
        result = BEHAVIOURS.get(mode["now"], BEHAVIOURS["good"])(request)
        return await result if asyncio.iscoroutine(result) else result

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    app.router.add_post("/slots/{id}", handler)
    server = TestServer(app)
    await server.start_server()
    yield mode, str(server.make_url(""))
    await server.close()


async def _read(base_url: str, timeout_s: float = 5.0):
    up = Upstream(Settings(upstream_url=base_url, request_timeout_s=timeout_s, retry_after_s=7))
    try:
        return await up.next_token(
            [{"role": "user", "content": "q"}],
            n_probs=2,
            template_kwargs=None,
        )
    finally:
        await up.close()


async def test_good_answer_is_parsed(stand_in):
    _, url = stand_in
    read = await _read(url)
    assert read.logprobs == {49: -0.5, 50: -1.5}
    assert (read.model, read.prompt_tokens, read.prompt_evaluated) == ("m", 10, 3)


@pytest.mark.parametrize(
    ("mode", "error", "status", "says"),
    [
        ("loading", UpstreamUnavailable, 503, "Loading model"),
        ("too_long", UpstreamRejected, 400, "context size"),
        ("crash", UpstreamBadResponse, 502, "out of memory"),
        ("forbidden", UpstreamBadResponse, 502, "credentials"),
        ("not_json", UpstreamBadResponse, 502, "invalid JSON"),
        ("no_logprobs", UpstreamBadResponse, 502, "log-probabilities"),
        ("truncated", UpstreamBadResponse, 502, ""),
    ],
)
async def test_upstream_failures_map_to_our_errors(stand_in, mode, error, status, says):
    state, url = stand_in
    state["now"] = mode
    with pytest.raises(error) as caught:
        await _read(url)
    assert caught.value.status == status
    assert says in caught.value.message


async def test_loading_carries_retry_after(stand_in):
    state, url = stand_in
    state["now"] = "loading"
    with pytest.raises(UpstreamUnavailable) as caught:
        await _read(url)
    assert caught.value.headers() == {"Retry-After": "7"}


async def test_slow_upstream_times_out(stand_in):
    state, url = stand_in
    state["now"] = "slow"
    with pytest.raises(UpstreamTimeout) as caught:
        await _read(url, timeout_s=0.3)
    assert caught.value.status == 504


async def test_unreachable_upstream_is_unavailable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connection refused
        with pytest.raises(UpstreamUnavailable) as caught:
            await _read(f"http://127.0.0.1:{port}")
    assert caught.value.status == 503


async def test_a_connection_dropped_before_answering_is_retried_once(stand_in):
    state, url = stand_in
    state["now"] = "drop_once"
    read = await _read(url)
    assert read.logprobs == {49: -0.5, 50: -1.5} and state["dropped"] == 1


async def test_always_dropped_connections_are_unavailable(stand_in):
    state, url = stand_in
    state["now"] = "drop"
    with pytest.raises(UpstreamUnavailable) as caught:
        await _read(url)
    assert caught.value.status == 503 and state["dropped"] == 2  # the first try and one retry


async def _relay(base_url: str, path: str, resend: bool) -> int:
    up = Upstream(Settings(upstream_url=base_url, request_timeout_s=5.0))
    try:
        async with up.relay("POST", path, b"{}", {}, resend) as answer:
            return answer.status
    finally:
        await up.close()


async def test_a_relayed_request_dropped_before_answering_is_sent_again(stand_in):
    state, url = stand_in
    state["now"] = "drop_once"
    assert await _relay(url, "/v1/chat/completions", resend=True) == 200
    assert state["dropped"] == 1


async def test_a_relayed_request_dropped_twice_is_unavailable(stand_in):
    state, url = stand_in
    state["now"] = "drop"
    with pytest.raises(UpstreamUnavailable):
        await _relay(url, "/v1/chat/completions", resend=True)
    assert state["dropped"] == 2  # the first try and one more


async def test_a_control_request_is_never_sent_twice(stand_in):
    state, url = stand_in
    state["now"] = "drop_once"
    with pytest.raises(UpstreamUnavailable):
        await _relay(url, "/slots/0?action=erase", resend=False)
    assert state["dropped"] == 1


async def test_a_connection_that_carried_an_event_stream_is_not_used_again():
    # llama-server b11434 closes its end after an event stream without saying so; this
    # stand-in keeps it open, so a second request on it would come from the same port
    ports = []

    async def stream(request: web.Request) -> web.StreamResponse:
        ports.append(request.transport.get_extra_info("peername")[1])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(0.05)  # the stream still open when its headers are read
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", stream)
    server = TestServer(app)
    await server.start_server()
    up = Upstream(Settings(upstream_url=str(server.make_url("")), request_timeout_s=5.0))
    try:
        for _ in range(2):
            async with up.relay("POST", "/v1/chat/completions", b"{}", {}) as answer:
                assert answer.is_stream
                assert b"".join([chunk async for chunk in answer.chunks]) == b"data: [DONE]\n\n"
    finally:
        await up.close()
        await server.close()
    assert len(ports) == 2 and ports[0] != ports[1]


@pytest.mark.parametrize(
    ("value", "wanted", "result"),
    [
        (-0.5, [49], [-0.5]),
        (-2, [49], [-2.0]),
        (-0.5, [49, 51], None),  # 51 is not in the read: widen, never guess
    ],
)
def test_label_log_probabilities_from_a_read(value, wanted, result):
    read = NextToken({49: value, 50: -1.5}, "m", 10, 3)
    assert read.of(wanted) == result


@pytest.mark.parametrize("value", ["high", True, 0.5, [1], {"x": 1}, None])
def test_nonsense_label_log_probabilities_are_bad_responses(value):
    read = NextToken({49: value}, "m", 10, 3)
    with pytest.raises(UpstreamBadResponse, match="log-probability of token 49"):
        read.of([49])


async def test_a_name_that_does_not_resolve_is_unavailable():
    up = Upstream(Settings(upstream_url="http://nonexistent.invalid:8081", connect_timeout_s=10))
    try:
        with pytest.raises(UpstreamUnavailable) as caught:
            await up.next_token(
                [{"role": "user", "content": "q"}],
                n_probs=2,
                template_kwargs=None,
            )
    finally:
        await up.close()
    assert caught.value.status == 503


@pytest.mark.parametrize("field", ["meta", "architecture"])
def test_a_models_entry_whose_meta_is_not_an_object_is_a_bad_response(field):
    # read as absent, the context length would be unknown and its 400 skipped
    with pytest.raises(UpstreamBadResponse, match=f"'m.gguf' has a {field} that is not a JSON"):
        parse_models({"data": [{"id": "m.gguf", field: ["n_ctx", 8192]}]})


def test_a_models_entry_without_meta_is_read_with_what_it_has():
    (info,) = parse_models({"data": [{"id": "m.gguf", "meta": None}]}).models
    assert (info.id, info.n_ctx, info.output_modalities) == ("m.gguf", None, ("text",))


async def test_a_read_is_not_cut_by_the_per_call_timeout():
    # a long prompt on a slow model reads for minutes: its caller bounds it (a decision's
    # deadline, the self-check's bound), the per-call timeout only the other calls
    async def completion(request: web.Request) -> web.Response:
        await asyncio.sleep(0.6)
        return web.json_response(
            {
                "model": "m",
                "timings": {"cache_n": 2, "prompt_n": 3, "prompt_ms": 600.0},
                "completion_probabilities": [{"top_logprobs": [{"id": 49, "logprob": -0.5}]}],
            }
        )

    async def props(request: web.Request) -> web.Response:
        await asyncio.sleep(0.6)
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/completion", completion)
    app.router.add_get("/props", props)
    server = TestServer(app)
    await server.start_server()
    up = Upstream(Settings(upstream_url=str(server.make_url("")), request_timeout_s=0.2))
    try:
        done = await up.complete([1, 2, 3, 4, 5], slot=0, cache=True, n_probs=1)
        assert (done.read.logprobs, done.cached, done.seconds) == ({49: -0.5}, 2, 0.6)
        with pytest.raises(UpstreamTimeout):
            await up.total_slots()
    finally:
        await up.close()
        await server.close()
