"""Bad input gets a 4xx that names the problem; never a 5xx, a hang or a wrong answer."""

import httpx
import openai
import pytest

MESSAGES = [{"role": "user", "content": "Ticket: where is my parcel?"}]


def _post(proxy_url, body=None, content=None, headers=None):
    return httpx.post(
        proxy_url + "/v1/chat/completions", json=body, content=content, headers=headers, timeout=30
    )


@pytest.mark.parametrize(
    ("semif", "param"),
    [
        ({}, "semif.options"),
        ({"options": []}, "semif.options"),
        ({"options": ["only one"]}, "semif.options"),
        ({"options": [f"o{i}" for i in range(256)]}, "semif.options"),
        ({"options": ["Refund", "refund "]}, "semif.options"),
        ({"options": ["a", 1]}, "semif.options.1"),
        ({"type": "maybe", "options": ["a", "b"]}, "semif.type"),
        ({"type": "score", "options": ["low"]}, "semif.options"),
        ({"type": "score", "options": [str(i) for i in range(11)]}, "semif.options"),
        ({"options": ["a", "b"], "temperature": 0}, "semif.temperature"),
        ({"options": ["a", "b"], "temperature": -2}, "semif.temperature"),
        ({"options": ["a", "b"], "temperature": "hot"}, "semif.temperature"),
        ({"options": ["a", "b"], "colour": "red"}, "semif.colour"),
        ("a,b", "semif"),
    ],
)
def test_invalid_semif_gets_400_naming_the_field(proxy_url, semif, param):
    resp = _post(proxy_url, {"messages": MESSAGES, "semif": semif})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error" and error["message"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 3}, "n"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_incompatible_fields_with_semif_get_400(proxy_url, extra, param):
    resp = _post(proxy_url, {"messages": MESSAGES, "semif": {"options": ["a", "b"]}, **extra})
    assert (resp.status_code, resp.json()["error"]["param"]) == (400, param)


def test_openai_sdk_sees_a_bad_request_error(proxy_url):
    with openai.OpenAI(base_url=proxy_url + "/v1", api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model="m", messages=MESSAGES, extra_body={"semif": {"options": ["x"]}}
            )
    assert caught.value.param == "semif.options"


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b"", '"caf\xe9"'.encode("latin-1")])
def test_malformed_json_gets_400(proxy_url, content):
    resp = _post(proxy_url, content=content, headers={"Content-Type": "application/json"})
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "invalid_json"


def test_body_over_the_limit_gets_413(proxy_url):
    big = {
        "messages": [{"role": "user", "content": "x" * (6 * 1024 * 1024)}],
        "semif": {"options": ["a", "b"]},
    }
    resp = _post(proxy_url, big)
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "request_too_large"


def test_prompt_over_the_context_is_a_400_from_upstream(proxy_url):
    long = [{"role": "user", "content": "word " * 9000}]
    resp = _post(proxy_url, {"messages": long, "semif": {"options": ["a", "b"]}})
    assert resp.status_code == 400
    assert "context" in resp.json()["error"]["message"]


def _nested(depth):
    """A JSON text nested ``depth`` arrays deep (clients' own encoders refuse to write one)."""
    return "[" * depth + '"x"' + "]" * depth


@pytest.mark.parametrize(
    "body",
    [
        '{"messages": [{"role": "user", "content": "hi"}],'
        ' "semif": {"options": {"a": %s, "b": null}}}',
        '{"messages": [{"role": "user", "content": "hi"}], "semif": {"options": ["a", "b"]},'
        ' "chat_template_kwargs": {"x": %s}}',
    ],
    ids=["options", "kwargs"],
)
def test_deeply_nested_bodies_get_400_not_500(proxy_url, body):
    for depth in (300, 1000):
        resp = _post(
            proxy_url,
            content=(body % _nested(depth)).encode(),
            headers={"Content-Type": "application/json"},
        )
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "too_deep"


def test_deeply_nested_system_one_state_gets_422(proxy_url):
    body = '{"state": ' + _nested(1000) + ', "questions": {"q": {"type": "noul"}}}'
    resp = httpx.post(
        proxy_url + "/v1/systemone",
        content=body.encode(),
        timeout=30,
        headers={"Content-Type": "application/json"},
    )
    assert resp.status_code == 422
