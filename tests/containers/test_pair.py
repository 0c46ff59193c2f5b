"""The two-container layout (`python -m deploy create --proxy-image ... --llama-image ...`):
Dockerfile.llama and Dockerfile.proxy started as docs/sagemaker.md says a multi-container
endpoint starts them: one network namespace (the proxy joins llama-server's), each
container's Environment as the deploy code writes it, the proxy on SageMaker's 8080 and
llama-server on 8081, where UPSTREAM_URL points. The proxy runs with a read-only root and a
tmpfs /tmp, as docs/operations.md says it can."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.deploy import DeployConfig, model_request
from scripts.containers import Engine
from scripts.probe import free_port
from tests.containers.conftest import LLAMA_IMAGE, PROXY_IMAGE
from tests.containers.kit import CHAT, READY_S, S1, container, figure, health, logs, status, until


def environments() -> tuple[dict[str, str], dict[str, str]]:
    """The proxy's and llama-server's Environment, as `python -m deploy create` writes them."""
    cfg = DeployConfig(
        name="suite",
        model_data="s3://bucket/model.tar.gz",
        role="arn:aws:iam::123456789012:role/suite",
        proxy_image=PROXY_IMAGE,
        llama_image=LLAMA_IMAGE,
    )
    proxy, llama = model_request(cfg)["Containers"]
    assert (proxy["ContainerHostname"], llama["ContainerHostname"]) == ("proxy", "llama")
    return proxy["Environment"], llama["Environment"]


@pytest.fixture(scope="module")
def pair(engine: Engine, model_dir: Path, images) -> Iterator[tuple[str, str, str]]:
    proxy_env, llama_env = environments()
    port = free_port()
    started = time.monotonic()
    with (
        container(
            engine,
            LLAMA_IMAGE,
            "semif-suite-llama",
            f"--publish=127.0.0.1:{port}:8080",  # the namespace's 8080 is the proxy's
            f"--volume={model_dir}:/opt/ml/model:ro",
            *[f"--env={k}={v}" for k, v in llama_env.items()],
            command=("serve",),
        ) as llama,
        container(
            engine,
            PROXY_IMAGE,
            "semif-suite-proxy",
            f"--network=container:{llama}",
            "--read-only",
            "--tmpfs=/tmp",
            *[f"--env={k}={v}" for k, v in proxy_env.items()],
            command=("serve",),
        ) as proxy,
    ):
        url = f"http://127.0.0.1:{port}"
        until(lambda: status(url + "/ping") == 200, READY_S, "/ping 200", logs(engine, proxy))
        figure("two containers: docker run to /ping 200", f"{time.monotonic() - started:.1f} s")
        yield llama, proxy, url


def test_the_proxy_answers_ping_and_invocations_beside_llama_server(pair):
    _, _, url = pair
    s1 = httpx.post(url + "/invocations", json=S1, timeout=120)
    assert s1.status_code == 200 and 0 <= s1.json()["answers"]["late"]["noul"] <= 1
    chat = httpx.post(url + "/invocations", json=CHAT, timeout=120)
    assert chat.status_code == 200, chat.text


def test_each_containers_own_health_check_passes(engine: Engine, pair):
    llama, proxy, _ = pair
    # llama-server's /ping is the static file the llama image adds (SageMaker pings each
    # container); it answers on the port UPSTREAM_URL names
    ping = engine.docker("exec", llama, "curl", "-fsS", "http://127.0.0.1:8081/ping")
    assert ping.stdout.strip() == "ok"
    for name in (llama, proxy):
        until(
            lambda n=name: health(engine, n) == "healthy",
            60,
            f"{name}'s HEALTHCHECK",
            logs(engine, name),
        )
