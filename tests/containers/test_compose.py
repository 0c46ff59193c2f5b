"""`docker compose up` as the README says, with the project's files unchanged: llama-server,
the proxy and Prometheus (Grafana's image cannot be had where no registry is reachable: it
is left out, and the README says it is optional). One decision of each kind through the
published 127.0.0.1:8080, the real Prometheus scraping both, llama-server ended inside its
container and brought back by its restart policy, and `down -v` leaving nothing."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from scripts.containers import Engine
from tests.containers.kit import CHAT, READY_S, ROOT, S1, figure, status, until

SERVICES = ("llama", "proxy", "prometheus")
URL = "http://127.0.0.1:8080"
PROMETHEUS = "http://127.0.0.1:9090"
# docker-compose.yml names its project semif-sidecar; the suite's runs under a name of its
# own, so that a user's running stack is neither taken over nor taken down by `down -v`
PROJECT = "semif-suite"


def compose(engine: Engine, *args: str, check: bool = True, timeout: float | None = None):
    return engine.docker(
        "compose", "--project-name", PROJECT, *args, cwd=ROOT, check=check, timeout=timeout
    )


def project_objects(engine: Engine) -> dict[str, list[str]]:
    label = f"label=com.docker.compose.project={PROJECT}"
    return {
        kind: engine.docker(*cmd, "--filter", label, "--quiet", check=False).stdout.split()
        for kind, cmd in (
            ("containers", ("ps", "--all")),
            ("networks", ("network", "ls")),
            ("volumes", ("volume", "ls")),
        )
    }


@pytest.fixture(scope="module")
def stack(engine: Engine, model_dir, images) -> Iterator[Engine]:
    figure("grafana", "left out: its image cannot be pulled here and has no stand-in")
    started = time.monotonic()
    try:
        compose(
            engine,
            "up",
            "--build",
            "--detach",
            "--wait",
            "--wait-timeout",
            str(READY_S),
            *SERVICES,
            timeout=READY_S + 120,
        )
        figure("compose up --build to healthy", f"{time.monotonic() - started:.1f} s")
        yield engine
    finally:
        compose(engine, "down", "--volumes", "--timeout", "30", check=False)


def logs(engine: Engine) -> str:
    got = compose(engine, "logs", "--no-color", "--tail", "80", check=False)
    return got.stdout + got.stderr


def test_a_decision_of_each_kind_and_a_relayed_stream_through_the_published_port(stack):
    client = openai.OpenAI(base_url=URL + "/v1", api_key="unused", max_retries=0, timeout=120)
    decided = client.chat.completions.create(
        model="smollm2", messages=CHAT["messages"], extra_body={"semif": CHAT["semif"]}
    )
    probabilities = decided.model_extra["semif"]["probabilities"]
    assert list(probabilities) == CHAT["semif"]["options"]
    assert math.fsum(probabilities.values()) == pytest.approx(1.0, abs=1e-12)

    answer = httpx.post(URL + "/v1/systemone", json=S1, timeout=120)
    assert answer.status_code == 200, answer.text
    assert 0 <= answer.json()["answers"]["late"]["noul"] <= 1

    # an ordinary streamed chat completion, relayed to llama-server and back untouched
    stream = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=8,
        stream=True,
    )
    chunks = list(stream)
    assert len(chunks) >= 2 and chunks[-1].choices[0].finish_reason in ("length", "stop")
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()


def test_prometheus_scrapes_both_and_answers_a_query_over_the_decision_latency(stack):
    def both_up():
        targets = httpx.get(PROMETHEUS + "/api/v1/targets", timeout=5).json()["data"]
        health = {t["labels"]["job"]: t["health"] for t in targets["activeTargets"]}
        return health if health == {"proxy": "up", "llama": "up"} else None

    until(both_up, 120, "Prometheus saw both targets up", lambda: logs(stack))
    httpx.post(URL + "/v1/systemone", json=S1, timeout=120).raise_for_status()
    query = (
        "histogram_quantile(0.5, sum by (le) "
        '(semif_request_duration_seconds_bucket{route="/v1/systemone"}))'
    )

    def median():
        got = httpx.get(PROMETHEUS + "/api/v1/query", params={"query": query}, timeout=5)
        result = got.json()["data"]["result"]
        value = float(result[0]["value"][1]) if result else math.nan
        return value if value > 0 else None  # NaN until a scrape holds a decision

    seconds = until(median, 120, "PromQL over the proxy's latency histogram", lambda: logs(stack))
    version = httpx.get(PROMETHEUS + "/api/v1/status/buildinfo", timeout=5).json()["data"]
    figure(
        "prometheus",
        f"{version['version']} ran (docker-compose.yml pins v3.7.3); "
        f"median System One latency it computed: {seconds:.3f} s",
    )


def test_llama_server_ended_in_its_container_gets_a_503_with_a_reason_then_comes_back(stack):
    engine = stack
    llama = compose(engine, "ps", "--quiet", "llama").stdout.strip()
    restarts = int(engine.docker("inspect", "--format", "{{.RestartCount}}", llama).stdout)
    # PID 1 is llama-server (the entrypoint execs it); the shell's own kill, as the
    # official image has no procps
    compose(engine, "exec", "-T", "llama", "sh", "-c", "kill -TERM 1")
    seen: list[tuple[int | None, str]] = []

    def refused():
        try:
            got = httpx.post(URL + "/v1/systemone", json=S1, timeout=30)
        except httpx.TransportError as e:
            raise AssertionError(f"the proxy itself went away: {e}") from e
        seen.append((got.status_code, got.text))
        return got if got.status_code in (502, 503) else None

    down = until(refused, 60, "a decision refused while llama-server is down", lambda: logs(engine))
    reason = json.dumps(down.json())
    assert "llama" in reason.lower() or "upstream" in reason.lower(), reason
    figure("with llama-server down, a decision got", f"{down.status_code} {reason[:160]}")
    until(lambda: status(URL + "/ping") == 200, READY_S, "/ping 200 again", lambda: logs(engine))
    assert httpx.post(URL + "/v1/systemone", json=S1, timeout=120).status_code == 200
    after = int(engine.docker("inspect", "--format", "{{.RestartCount}}", llama).stdout)
    assert after == restarts + 1  # brought back by `restart: unless-stopped`, not recreated


def test_down_leaves_nothing(stack):
    compose(stack, "down", "--volumes", "--timeout", "30")
    left = project_objects(stack)
    assert left == {"containers": [], "networks": [], "volumes": []}
    assert status(URL + "/ping") is None
