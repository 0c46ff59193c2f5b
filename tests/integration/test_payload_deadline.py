"""A jsonlines /invocations payload answers within PROXY_INVOCATIONS_TIMEOUT (the
transform job's InvocationsTimeoutInSeconds), not the real-time decision deadline:
the lines it had no time for get 504 records instead of SageMaker timing the whole
call out and sending it again. The upstream is the stand-in, 0.5 s per read."""

from __future__ import annotations

import time

import orjson
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import create_app
from proxy.config import Settings
from tests.standin import StandIn

LINE = orjson.dumps(
    {
        "messages": [{"role": "user", "content": "route it"}],
        "semif": {"options": ["billing", "shipping"]},
    }
)


async def test_lines_past_the_payload_deadline_get_504_records_in_order():
    with StandIn() as standin:
        standin.total_slots = 2
        # each line alone is well inside the 50 s decision deadline; the payload is not
        settings = Settings(upstream_url=standin.url, invocations_timeout_s=2.0)
        async with TestClient(TestServer(create_app(settings))) as client:
            standin.mode, standin.delay_s = "slow", 0.5
            started = time.monotonic()
            resp = await client.post(
                "/invocations",
                data=b"\n".join([LINE] * 20),
                headers={"Content-Type": "application/jsonlines"},
            )
            body = await resp.read()
            took = time.monotonic() - started
            metrics = await (await client.get("/metrics")).text()
    assert resp.status == 200
    records = [orjson.loads(line) for line in body.splitlines()]
    assert len(records) == 20
    answered = [r for r in records if "error" not in r]
    late = [r["error"] for r in records if "error" in r]
    # two lines at a time, 0.5 s each, 1.9 s of the payload's 2 s: a few answered, in
    # front (the lines are taken in order), the rest refused without waiting for them
    assert 2 <= len(answered) <= 8 and records[: len(answered)] == answered
    assert all(e["status"] == 504 and e["code"] == "payload_deadline" for e in late)
    assert "PROXY_INVOCATIONS_TIMEOUT" in late[0]["message"]
    assert took < 2.0 + 1.0  # the answer came back before the payload's own deadline
    # lines not started by then were never sent: only the answered and the two in flight
    assert standin.hits_chat <= len(answered) + 2
    assert f'semif_upstream_errors_total{{kind="payload_deadline"}} {len(late)}.0' in metrics


async def test_the_body_limit_bounds_the_lines_not_a_count():
    """Batch Transform fills a payload up to MaxPayloadInMB whatever the record count:
    20,000 short lines are answered line for line (here each an error record)."""
    with StandIn() as standin:
        async with TestClient(TestServer(create_app(Settings(upstream_url=standin.url)))) as c:
            resp = await c.post(
                "/invocations",
                data=b"\n".join([b"{}"] * 20_000),
                headers={"Content-Type": "application/jsonlines"},
            )
            records = [orjson.loads(line) for line in (await resp.read()).splitlines()]
    assert resp.status == 200 and len(records) == 20_000
    assert {r["error"]["code"] for r in records} == {"unknown_body_shape"}
