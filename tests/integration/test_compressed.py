"""Compressed request bodies through the real proxy: zstd from the official typesafe-sdk
(its ``zstd`` extra), br and gzip from plain clients, decoded by aiohttp and relayed decoded;
the size limit holds after decoding (a bomb gets 413 and memory stays put); a body that does
not decode, or a coding nobody decodes, gets a JSON 4xx in the route's shape, counted."""

from __future__ import annotations

import gzip
import re

import brotli
import httpx
import httpx2
import orjson
import pytest
from backports import zstd
from typesafe_sdk import Noul, TypeSafeClient

from scripts.stack import stop
from tests.conftest import launch_proxy, rss_kb

STATE = "Order 1182: my card was charged twice and the parcel is late. " * 20  # over 1 KiB
LIMIT = 64 * 1024  # the proxy under test takes bodies up to 64 KiB, decoded


@pytest.fixture(scope="module")
def small_limit(llama, logs_dir):
    proc, url, log = launch_proxy(logs_dir, llama.url, env={"PROXY_MAX_BODY_BYTES": str(LIMIT)})
    yield url, proc
    stop(proc)
    log.close()


def _client_errors(url: str, reason: str) -> float:
    text = httpx.get(url + "/metrics").text
    found = re.search(rf'^semif_client_errors_total{{reason="{reason}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_typesafe_sdk_sends_zstd_and_gets_the_same_answer_as_plain(proxy_url):
    sent: list[tuple[str | None, int]] = []

    def seen(request: httpx2.Request) -> None:
        sent.append((request.headers.get("Content-Encoding"), len(request.content)))

    answers = []
    for compression in (None, False):  # None: the SDK's default, zstd with the extra
        http = httpx2.Client(timeout=120, event_hooks={"request": [seen]})
        with TypeSafeClient(
            base_url=proxy_url, api_key="k", http_client=http, compression=compression
        ) as client:
            answers.append(
                client.system_one(
                    STATE, {"refund": Noul(instructions="Does the customer ask for money back?")}
                )
            )
    (zstd_coding, zstd_size), (plain_coding, plain_size) = sent
    assert zstd_coding == "zstd" and plain_coding is None
    assert zstd_size < plain_size / 4  # the repeated state compresses well: it was compressed
    assert answers[0].usage.input_tokens > 0
    assert 0 < answers[0].answers["refund"].noul < 1


@pytest.mark.parametrize(
    "coding, encode", [("br", brotli.compress), ("gzip", gzip.compress), ("zstd", zstd.compress)]
)
def test_relayed_bodies_are_decoded_before_llama_server_sees_them(proxy_url, llama, coding, encode):
    body = orjson.dumps({"content": "Hello there, how are you today?"})
    direct = httpx.post(llama.url + "/tokenize", content=body).json()
    resp = httpx.post(
        proxy_url + "/tokenize",
        content=encode(body),
        headers={"Content-Encoding": coding, "Content-Type": "application/json"},
    )
    assert resp.status_code == 200, resp.text
    assert resp.json() == direct and direct["tokens"]


def test_a_decompression_bomb_gets_413_and_memory_stays_put(small_limit):
    url, proc = small_limit
    packer = zstd.ZstdCompressor()
    block = bytes(1 << 20)
    bomb = b"".join(packer.compress(block) for _ in range(512)) + packer.flush()  # 512 MiB
    assert len(bomb) < 64 * 1024
    before = rss_kb(proc.pid)
    for path, shape in (
        ("/v1/systemone", "detail"),
        ("/v1/chat/completions", "error"),
        ("/tokenize", "error"),
    ):
        resp = httpx.post(
            url + path,
            content=bomb,
            timeout=60,
            headers={"Content-Encoding": "zstd", "Content-Type": "application/json"},
        )
        assert resp.status_code == 413, resp.text
        assert shape in resp.json() and str(LIMIT) in resp.text
    assert (rss_kb(proc.pid) - before) < 32 * 1024  # far below the 512 MiB it decodes to


def test_a_body_just_under_the_limit_decoded_is_accepted(small_limit, llama):
    url, _ = small_limit
    body = orjson.dumps({"content": "x " * (LIMIT // 2 - 64)})
    assert len(body) < LIMIT
    resp = httpx.post(
        url + "/tokenize",
        content=zstd.compress(body),
        timeout=60,
        headers={"Content-Encoding": "zstd", "Content-Type": "application/json"},
    )
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["tokens"]) > 1000


def test_a_body_that_does_not_decode_gets_a_json_400_in_the_routes_shape(proxy_url):
    before = _client_errors(proxy_url, "bad_body")
    chat = httpx.post(
        proxy_url + "/v1/chat/completions",
        content=b"not zstd at all",
        headers={"Content-Encoding": "zstd", "Content-Type": "application/json"},
    )
    assert chat.status_code == 400
    assert chat.json()["error"]["code"] == "bad_body" and "zstd" in chat.json()["error"]["message"]
    system_one = httpx.post(
        proxy_url + "/v1/systemone",
        content=b"\x1f\x8bnot gzip",
        headers={"Content-Encoding": "gzip"},
    )
    assert system_one.status_code == 422 and "gzip" in system_one.text
    assert _client_errors(proxy_url, "bad_body") == before + 2


def test_a_coding_nobody_decodes_gets_415_not_a_misread_body(proxy_url):
    body = orjson.dumps({"content": "hello"})
    resp = httpx.post(
        proxy_url + "/tokenize",
        content=body,
        headers={"Content-Encoding": "compress", "Content-Type": "application/json"},
    )
    assert resp.status_code == 415
    err = resp.json()["error"]
    assert err["code"] == "unsupported_content_encoding" and "compress" in err["message"]
    assert err["param"] == "Content-Encoding"
