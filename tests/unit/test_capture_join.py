"""The outcome loop on the proxy's own answers: the proxy (before the stand-in llama-server,
``PROXY_DECISION_RECORDS=answer``) answers a streamed chat decision, a System One request of
two questions sent twice with one InferenceId (a client's retry) and a jsonlines
``/invocations`` payload; each answer is put in a Data Capture line as AWS documents them
(output only; the stream BASE64, as capture stores a type not declared JSON);
records-from-capture reads them; outcomes keyed by decision id, by the capture's inferenceId
and by its eventId join the same records to the same labels."""

from __future__ import annotations

import base64

import orjson
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import create_app
from proxy.config import Settings
from semif_tools import capture
from semif_tools.outcomes import join, outcome_line, parse_outcome
from semif_tools.record_files import load_records
from tests.standin import StandIn

KEY = b"k" * 16
INFERENCE_ID = "X-Amzn-SageMaker-Inference-Id"
CHAT = {
    "messages": [{"role": "user", "content": "Ticket: where is my parcel?"}],
    "semif": {"options": ["billing", "shipping, returns"]},
    "stream": True,
    "stream_options": {"include_usage": True},
}
STATE = {
    "state": "a parcel that never came",
    "questions": {
        "team": {"type": "choice", "criteria": ["billing", "shipping"]},
        "refund": {"type": "noul", "instructions": "The writer wants a refund"},
    },
}
LINES = b'{"state": "a", "questions": {"t": {"type": "choice", "criteria": ["x", "y"]}}}\n' * 2


def _event(number: int, response, raw: bytes, inference_id: str | None) -> bytes:
    content_type = response.headers["Content-Type"].partition(";")[0]
    if content_type == "text/event-stream":
        output = {"data": base64.b64encode(raw).decode(), "encoding": "BASE64"}
    else:
        output = {"data": raw.decode(), "encoding": "JSON"}
    meta = {"eventId": f"ev-{number}", "inferenceTime": "2026-12-03T10:11:12Z"}
    if inference_id is not None:
        meta["inferenceId"] = inference_id
    output = {"observedContentType": content_type, "mode": "OUTPUT", **output}
    return orjson.dumps(
        {"captureData": {"endpointOutput": output}, "eventMetadata": meta, "eventVersion": "0"}
    )


async def _captured() -> list[bytes]:
    """One capture line per invocation, in AWS's format, of the proxy's actual answers."""
    calls = [  # (path, body, the InferenceId the client passes)
        ("/invocations", CHAT, "ticket 7/a"),  # an InferenceId AWS accepts, with "/" and " "
        ("/invocations", STATE, "sys-1"),
        ("/invocations", STATE, "sys-1"),  # the client's retry
        ("/invocations", STATE, None),  # no InferenceId: keyed by the eventId
    ]
    lines = []
    with StandIn(tokens=True) as standin:
        settings = Settings(upstream_url=standin.url, decision_records="answer")
        async with TestClient(TestServer(create_app(settings, records_key=KEY))) as client:
            for number, (path, body, inference_id) in enumerate(calls):
                headers = {} if inference_id is None else {INFERENCE_ID: inference_id}
                response = await client.post(path, json=body, headers=headers)
                assert response.status == 200, await response.text()
                lines.append(_event(number, response, await response.read(), inference_id))
            response = await client.post(
                "/invocations",
                data=LINES,
                headers={"Content-Type": "application/jsonlines", INFERENCE_ID: "batch 1"},
            )
            assert response.status == 200, await response.text()
            lines.append(_event(4, response, await response.read(), "batch 1"))
    return lines


async def test_outcomes_keyed_the_aws_way_join_as_decision_ids_do(tmp_path):
    lines = await _captured()
    assert orjson.loads(lines[0])["captureData"]["endpointOutput"]["encoding"] == "BASE64"
    path = tmp_path / "records.jsonl"
    path.write_bytes(b"".join(c.line() for c in capture.read_capture(lines)))
    loaded = load_records([path])
    by_id = {r.decision_id: r for r in loaded.records}
    uuid = next(d for d in by_id if d.endswith("/team") and not d.startswith("sys-1"))
    uuid = uuid.partition("/")[0]
    assert sorted(by_id) == sorted(
        [
            "ticket 7%2Fa",  # escaped where it enters a decision id
            "sys-1/team",
            "sys-1/refund",
            f"{uuid}/team",
            f"{uuid}/refund",
            "batch 1/0",
            "batch 1/1",
        ]
    )
    assert (loaded.read, loaded.repeated, loaded.conflicting) == (9, 2, 0)  # the retry
    assert by_id["sys-1/team"].fields["capture"]["event_id"] == "ev-2"  # the last kept
    assert by_id["ticket 7%2Fa"].fields["request_id"] == "ticket 7/a"  # as given
    labels = {
        "ticket 7%2Fa": ("ticket 7/a", "ev-0", "shipping, returns"),
        "sys-1/team": ("sys-1/team", "ev-2/team", "shipping"),
        "sys-1/refund": ("sys-1/refund", "ev-2/refund", "true"),
        f"{uuid}/team": (None, "ev-3/team", "billing"),
        "batch 1/1": ("batch 1/1", "ev-4/1", "y"),
    }
    keyed = {
        "decision id": [(d, option) for d, (_, _, option) in labels.items()],
        "inferenceId": [(i or d, option) for d, (i, _, option) in labels.items()],
        "eventId": [(e, option) for _, (_, e, option) in labels.items()],
    }
    joined = {}
    for how, pairs in keyed.items():
        outcomes = [
            parse_outcome(orjson.loads(orjson.dumps(outcome_line(k, o))), f"{how}:{n}")
            for n, (k, o) in enumerate(pairs, 1)
        ]
        result = join(loaded, outcomes)
        joined[how] = [(r.decision_id, gold) for r, gold in result.pairs]
        assert not result.unmatched and not result.ambiguous and not result.unknown_option
    assert joined["decision id"] == [
        ("ticket 7%2Fa", 1),
        ("sys-1/team", 1),
        ("sys-1/refund", 0),
        (f"{uuid}/team", 0),
        ("batch 1/1", 1),
    ]
    assert joined["inferenceId"] == joined["eventId"] == joined["decision id"]
