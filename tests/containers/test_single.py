"""The single image (Dockerfile.single) as SageMaker runs it: `docker run IMAGE serve`, the
model at /opt/ml/model, SAGEMAKER_BIND_TO_PORT and SAGEMAKER_SAFE_PORT_RANGE set, and the
environment `python -m deploy` gives the model with Data Capture on (its records in the
answers, the prompt hashes' key file where AdditionalModelDataSources puts it). /ping is 200
only once llama-server is ready; /invocations takes each content type the docs promise;
Data Capture's round trip closes on its answers; SIGTERM stops both processes within
SageMaker's 30 s."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from deploy.deploy import RECORDS_KEY_FILE, DeployConfig, model_request
from scripts.containers import Engine
from scripts.probe import free_port
from tests.capture_round import (
    assert_every_decision_recovered,
    assert_keyed_alike,
    records_from_capture,
    serve_and_capture,
)
from tests.containers.conftest import SINGLE_IMAGE
from tests.containers.kit import CHAT, READY_S, S1, container, figure, health, logs, status, until

BIND_PORT, SAFE_RANGE = 9080, "9100-9109"  # not the defaults: each must reach the processes
GRACE_S = 30  # SageMaker's SIGKILL follows its SIGTERM after 30 s


def sagemaker_environment() -> dict[str, str]:
    """The container's Environment as `python -m deploy create` writes it (single image,
    Data Capture on), and what SageMaker adds."""
    cfg = DeployConfig(
        name="suite",
        model_data="s3://models/suite/model.tar.gz",  # the key beside it, not in the capture's
        role="arn:aws:iam::123456789012:role/suite",
        image=SINGLE_IMAGE,
        capture_s3_uri="s3://capture/suite",
    )
    env = dict(model_request(cfg)["PrimaryContainer"]["Environment"])
    env.update({"SAGEMAKER_BIND_TO_PORT": str(BIND_PORT), "SAGEMAKER_SAFE_PORT_RANGE": SAFE_RANGE})
    return env


@pytest.fixture(scope="module")
def single(engine: Engine, model_dir: Path, images, tmp_path_factory) -> Iterator[tuple[str, str]]:
    keys = tmp_path_factory.mktemp("records-key")
    (keys / "records.key").write_text(secrets.token_hex(32))  # as deploy's ensure_records_key
    port = free_port()
    env = [f"--env={k}={v}" for k, v in sagemaker_environment().items()]
    started = time.monotonic()
    with container(
        engine,
        SINGLE_IMAGE,
        "semif-suite-single",
        f"--publish=127.0.0.1:{port}:{BIND_PORT}",
        f"--volume={model_dir}:/opt/ml/model:ro",
        f"--volume={keys / 'records.key'}:{RECORDS_KEY_FILE}:ro",
        f"--stop-timeout={GRACE_S}",
        *env,
        command=("serve",),
    ) as name:
        url = f"http://127.0.0.1:{port}"
        pings: list[int | None] = []

        def ready():
            pings.append(status(url + "/ping"))
            return pings[-1] == 200

        until(ready, READY_S, "/ping 200", logs(engine, name))
        figure("single image: docker run to /ping 200", f"{time.monotonic() - started:.1f} s")
        # 200 only when llama-server answers: it did, on the range's first port, loopback
        inside = engine.docker(
            "exec", name, "curl", "-fsS", f"http://127.0.0.1:{SAFE_RANGE.split('-')[0]}/health"
        )
        assert '"ok"' in inside.stdout
        assert 503 in pings  # it said not ready before it was
        until(
            lambda: health(engine, name) == "healthy",
            60,
            "the image's HEALTHCHECK passed",
            logs(engine, name),
        )
        yield name, url


def test_invocations_takes_each_content_type_the_docs_promise(single):
    _, url = single
    chat = httpx.post(url + "/invocations", json=CHAT, timeout=120)
    assert chat.status_code == 200, chat.text
    assert set(chat.json()["semif"]["probabilities"]) == set(CHAT["semif"]["options"])
    s1 = httpx.post(url + "/invocations", json=S1, timeout=120)
    assert s1.status_code == 200 and 0 <= s1.json()["answers"]["late"]["noul"] <= 1
    # Batch Transform with SplitType=Line: a mini-batch of JSON lines, one answer line each
    lines = b"".join(orjson.dumps(S1) + b"\n" for _ in range(3))
    batch = httpx.post(
        url + "/invocations",
        content=lines,
        headers={"Content-Type": "application/jsonlines"},
        timeout=120,
    )
    assert batch.status_code == 200, batch.text
    answers = [orjson.loads(line) for line in batch.text.splitlines()]
    assert len(answers) == 3 and all("answers" in a for a in answers)
    params = httpx.get(url + "/execution-parameters", timeout=10)
    assert params.status_code == 200
    assert params.json()["BatchStrategy"] in ("MULTI_RECORD", "SINGLE_RECORD")


def test_the_capture_round_trip_closes_on_the_images_answers(single, tmp_path, capfd):
    _, url = single
    labels = serve_and_capture(url, tmp_path)
    records = records_from_capture(tmp_path)
    assert_every_decision_recovered(labels, records)
    for key in (1, 2):  # inferenceId, eventId
        assert_keyed_alike(tmp_path, records, labels, key, capfd)


def test_sigterm_stops_both_processes_within_the_grace_period(engine: Engine, single):
    name, _ = single
    top = engine.docker("top", name, "-o", "pid,args").stdout
    assert "llama-server" in top and "-m proxy" in top and "supervisord" in top
    started = time.monotonic()
    engine.docker("stop", "--time", str(GRACE_S), name)
    took = time.monotonic() - started
    code = engine.docker("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
    figure("single image: SIGTERM to stopped", f"{took:.1f} s (exit {code})")
    assert took < GRACE_S and code == "0"
