"""Readiness waits for the self-check, and a kept verdict makes the next start ready at once
(proxy/verdicts.py): no decision waits for the check's reads."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import orjson

from scripts.stack import stop
from tests.conftest import launch_llama, launch_proxy

DECISION = {
    "messages": [{"role": "user", "content": "Ticket: I was charged twice this month."}],
    "semif": {"options": ["billing", "shipping", "technical"]},
}


def ready(url: str, timeout_s: float = 300) -> list[str]:
    """Poll ``/health`` until 200; every status seen on the way (a 503's error code), in
    order, deduplicated."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while True:
        resp = httpx.get(url + "/health", timeout=30)
        body = resp.json()
        status = body["status"] if resp.status_code == 200 else body["error"]["code"]
        if not seen or seen[-1] != status:
            seen.append(status)
        if resp.status_code == 200:
            return seen
        assert resp.status_code == 503, resp.text
        assert time.monotonic() < deadline, f"not ready: {seen}"
        time.sleep(0.05)


def checks(url: str) -> list[dict]:
    return list(httpx.get(url + "/v1/models", timeout=60).json()["x_repeatable"].values())


def test_ready_only_once_the_check_has_settled_and_a_second_start_keeps_its_verdict(
    llama, logs_dir, tmp_path: Path
):
    kept = tmp_path / "verdicts.json"
    env = {"PROXY_CHECK_VERDICTS": str(kept)}
    proc, url, log = launch_proxy(logs_dir, llama.url, env=env)
    try:
        seen = ready(url)
        assert set(seen) <= {"self_check_running", "ok"} and seen[-1] == "ok"
        [check] = checks(url)  # ready means settled: no decision waits for the check
        assert check["repeatable"] is True, check
        assert "kept" not in check["detail"]
        assert "repeatability self-check on prefix-" in Path(log.name).read_text()
        [entry] = orjson.loads(kept.read_bytes()).values()
        assert entry["repeatable"] is True and entry["scheme"] == check["read_scheme"]
    finally:
        stop(proc)
        log.close()
    proc, url, log = launch_proxy(logs_dir, llama.url, env=env)
    try:
        ready(url)
        [again] = checks(url)
        assert again["repeatable"] is True
        assert again["detail"].startswith(f"{check['detail']} (kept from the check at ")
        assert again["checked_at"] == check["checked_at"]
        answer = httpx.post(url + "/v1/chat/completions", json=DECISION, timeout=120)
        assert answer.status_code == 200 and answer.json()["semif"]["repeatable"] is True
    finally:
        stop(proc)
        log.close()


def test_another_read_scheme_is_checked_anew(llama, logs_dir, tmp_path: Path):
    kept = tmp_path / "verdicts.json"
    for ubatch in ("63", "0"):  # the prefix scheme, then the segment scheme: two keys
        env = {"PROXY_CHECK_VERDICTS": str(kept), "PROXY_UPSTREAM_UBATCH": ubatch}
        proc, url, log = launch_proxy(logs_dir, llama.url, env=env)
        try:
            ready(url)
            [check] = checks(url)
            assert check["repeatable"] is True and "kept" not in check["detail"], check
        finally:
            stop(proc)
            log.close()
    schemes = sorted(e["scheme"] for e in orjson.loads(kept.read_bytes()).values())
    assert schemes == ["prefix-63", "segment"]


def test_a_llama_server_restart_is_ready_without_checking_again(own_llama, logs_dir, tmp_path):
    started, port = own_llama
    proxy_proc, url, proxy_log = launch_proxy(
        logs_dir, started[0][1].url, env={"PROXY_CHECK_VERDICTS": "off"}
    )
    try:
        ready(url)
        [first] = checks(url)
        assert first["repeatable"] is True and "kept" not in first["detail"]
        stop(started[0][0])
        time.sleep(2.5)  # nobody calls the proxy: its own watch (one /health a second) sees it
        started.append(launch_llama(logs_dir, "own-llama", port))
        deadline = time.monotonic() + 60
        while "kept" not in (after := checks(url)[0])["detail"]:  # recalled from memory
            assert time.monotonic() < deadline, after
            time.sleep(0.1)
        ready(url)
        assert after["repeatable"] is True
        assert after["detail"].startswith(first["detail"] + " (kept from the check at ")
        answer = httpx.post(url + "/v1/chat/completions", json=DECISION, timeout=120)
        assert answer.status_code == 200
    finally:
        stop(proxy_proc)
        proxy_log.close()
