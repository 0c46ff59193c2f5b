"""llama-server going away and coming back; clients going away mid-request."""

import time

import aiohttp
import httpx

from scripts.stack import stop
from tests.conftest import launch_llama, launch_proxy

DECISION = {
    "messages": [{"role": "user", "content": "Ticket: the app crashes on start."}],
    "semif": {"options": ["billing", "shipping", "technical"]},
}


def test_stopped_llama_gives_503_then_recovers_without_restarting_the_proxy(own_llama, logs_dir):
    started, port = own_llama
    proc, server, _ = started[0]
    proxy_proc, proxy_url, proxy_log = launch_proxy(logs_dir, server.url)
    try:
        assert (
            httpx.post(proxy_url + "/v1/chat/completions", json=DECISION, timeout=60).status_code
            == 200
        )
        stop(proc)
        for body in (DECISION, {"messages": DECISION["messages"], "max_tokens": 4}):
            down = httpx.post(proxy_url + "/v1/chat/completions", json=body, timeout=30)
            assert down.status_code == 503
            assert int(down.headers["Retry-After"]) > 0
            assert down.json()["error"]["code"] == "upstream_unavailable"
        assert httpx.get(proxy_url + "/health").status_code == 503
        assert httpx.get(proxy_url + "/livez").json() == {"status": "alive"}  # not killed for it
        started.append(launch_llama(logs_dir, "own-llama", port))
        back = httpx.post(proxy_url + "/v1/chat/completions", json=DECISION, timeout=60)
        assert back.status_code == 200
        assert back.json()["semif"]["choice"] in DECISION["semif"]["options"]
        ready_by = time.monotonic() + 60  # after its kept verdict's one short read
        while httpx.get(proxy_url + "/health").status_code != 200:
            assert time.monotonic() < ready_by, "not ready again after llama-server came back"
            time.sleep(0.1)
    finally:
        stop(proxy_proc)
        proxy_log.close()


async def test_client_disconnect_cancels_the_upstream_generation(proxy_url, llama):
    body = {
        "messages": [{"role": "user", "content": "Tell a very long story."}],
        "max_tokens": 2000,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
    }
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy_url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            await resp.content.readline()  # generation has started
            assert llama.busy_slots() == 1
        # leaving the block closed the connection mid-stream
    llama.wait_idle(timeout_s=5)
