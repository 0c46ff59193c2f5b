"""Which request heads the front answers itself (anything else goes to aiohttp)."""

import pytest

from proxy.front_http import parse_head

BASE = [b"POST /v1/chat/completions HTTP/1.1", b"Host: x", b"Content-Length: 12"]


def head(*lines: bytes, base=BASE) -> bytes:
    return b"\r\n".join([*base, *lines])


def test_a_plain_post_is_parsed():
    assert parse_head(head()) == (b"/v1/chat/completions", 12, True, "")


def test_close_in_any_connection_header_wins():
    assert parse_head(head(b"Connection: close", b"Connection: keep-alive"))[2] is False


def test_connection_close_and_authorization_are_read():
    parsed = parse_head(head(b"connection: keep-alive, Close", b"Authorization:  Bearer k \t",
                              b"Authorization: Bearer second"))
    assert parsed == (b"/v1/chat/completions", 12, False, "Bearer k")


def test_authorization_bytes_survive_undecoded():
    assert parse_head(head(b"Authorization: Bearer \xff"))[3] == "Bearer \udcff"


@pytest.mark.parametrize("request_line", [
    b"GET /v1/chat/completions HTTP/1.1",
    b"POST /v1/chat/completions HTTP/1.0",
    b"POST /v1/chat/completions  HTTP/1.1",
    b"POST  HTTP/1.1",
    b"post /v1/chat/completions HTTP/1.1",
])
def test_other_request_lines_go_to_aiohttp(request_line):
    assert parse_head(head(base=[request_line, *BASE[1:]])) is None


@pytest.mark.parametrize("lines", [
    [b"Transfer-Encoding: chunked"],
    [b"Expect: 100-continue"],
    [b"Upgrade: h2c"],
    [b"Connection: Upgrade"],
    [b"Content-Length: 12"],  # twice
    [b" folded: line"],
    [b"No colon here"],
    [b"Bad Name: x"],
    [b"X: a\x00b"],
    [b"X: a\nb"],
    [b"X: a\rTransfer-Encoding: chunked"],  # a bare CR
    [b": empty name"],
    [b"Host: second"],
])
def test_unusual_heads_go_to_aiohttp(lines):
    assert parse_head(head(*lines)) is None


@pytest.mark.parametrize("length", [b"", b"-1", b"+3", b"1e3", b"0x10", b"3 4"])
def test_a_content_length_that_is_not_digits_goes_to_aiohttp(length):
    assert parse_head(head(base=[BASE[0], b"Content-Length: " + length])) is None


def test_a_head_without_content_length_goes_to_aiohttp():
    assert parse_head(b"POST /v1/decisions HTTP/1.1\r\nHost: x") is None


def test_a_head_without_host_goes_to_aiohttp():
    assert parse_head(b"POST /v1/decisions HTTP/1.1\r\nContent-Length: 2") is None
