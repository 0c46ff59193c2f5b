"""Both container entrypoints, run with ``sh`` and a fake program in place of the real one.

SageMaker starts a container as ``docker run IMAGE serve`` and, in a multi-container
endpoint, names its port in SAGEMAKER_BIND_TO_PORT. The fake records the arguments and
environment it was started with.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROXY = ROOT / "docker" / "proxy-entrypoint.sh"
LLAMA = ROOT / "docker" / "llama-entrypoint.sh"

_FAKE = """#!/bin/sh
for arg in "$@"; do printf '%s\\n' "$arg"; done > "$FAKE_OUT.args"
env > "$FAKE_OUT.env"
"""


def run(script: Path, args: list[str], env: dict[str, str], tmp: Path):
    """Run ``script`` with a clean environment; return (exit code, argv, env) of the fake."""
    fake = tmp / "fake"
    fake.write_text(_FAKE)
    fake.chmod(0o755)
    out = tmp / "out"
    base = {
        "PATH": os.environ["PATH"],
        "FAKE_OUT": str(out),
        "PROXY_PYTHON": str(fake),
        "LLAMA_SERVER_BIN": str(fake),
    }
    proc = subprocess.run(
        ["sh", str(script), *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    if not Path(f"{out}.args").exists():
        return proc.returncode, None, None
    argv = Path(f"{out}.args").read_text().splitlines()
    seen = dict(
        line.split("=", 1) for line in Path(f"{out}.env").read_text().splitlines() if "=" in line
    )
    return proc.returncode, argv, seen


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["serve"], ["-m", "proxy"]),
        (["serve", "--n-probs", "5"], ["-m", "proxy", "--n-probs", "5"]),
        (["--n-probs", "5"], ["-m", "proxy", "--n-probs", "5"]),
        ([], ["-m", "proxy"]),
        (["--host", "serve"], ["-m", "proxy", "--host", "serve"]),  # only a leading serve goes
    ],
)
def test_proxy_drops_a_leading_serve(tmp_path: Path, args: list[str], expected: list[str]):
    code, argv, _ = run(PROXY, args, {}, tmp_path)
    assert code == 0
    assert argv == expected


@pytest.mark.parametrize(
    ("env", "port"),
    [
        ({"SAGEMAKER_BIND_TO_PORT": "9001", "PROXY_PORT": "8080"}, "9001"),
        ({"SAGEMAKER_BIND_TO_PORT": "9001"}, "9001"),
        ({"PROXY_PORT": "7000"}, "7000"),
        ({"SAGEMAKER_BIND_TO_PORT": "", "PROXY_PORT": "7000"}, "7000"),
        ({}, None),  # the proxy's own default (8080) applies
    ],
)
def test_proxy_port_follows_sagemaker(tmp_path: Path, env: dict[str, str], port: str | None):
    code, _, seen = run(PROXY, ["serve"], env, tmp_path)
    assert code == 0
    assert seen.get("PROXY_PORT") == port


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    for name in ("mmproj-vision.gguf", "qwen.gguf", "zeta.gguf", "notes.txt"):
        (d / name).write_text("x")
    return d


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["serve"], []),
        (["serve", "-t", "2"], ["-t", "2"]),
        (["-t", "2"], ["-t", "2"]),
        (["-t", "serve"], ["-t", "serve"]),
    ],
)
def test_llama_drops_a_leading_serve(tmp_path: Path, model_dir: Path, args, expected):
    code, argv, _ = run(LLAMA, args, {"LLAMA_MODEL_DIR": str(model_dir)}, tmp_path)
    assert code == 0
    assert argv == expected


@pytest.mark.parametrize(
    ("env", "port"),
    [
        ({"SAGEMAKER_BIND_TO_PORT": "9002", "LLAMA_ARG_PORT": "8081"}, "9002"),
        ({"LLAMA_ARG_PORT": "7001"}, "7001"),
        ({}, "8081"),
    ],
)
def test_llama_port_follows_sagemaker(tmp_path: Path, model_dir: Path, env, port):
    code, _, seen = run(LLAMA, ["serve"], {"LLAMA_MODEL_DIR": str(model_dir), **env}, tmp_path)
    assert code == 0
    assert seen["LLAMA_ARG_PORT"] == port


def test_llama_defaults_host_metrics_and_first_model(tmp_path: Path, model_dir: Path):
    code, _, seen = run(LLAMA, ["serve"], {"LLAMA_MODEL_DIR": str(model_dir)}, tmp_path)
    assert code == 0
    assert seen["LLAMA_ARG_MODEL"] == str(model_dir / "qwen.gguf")  # mmproj skipped
    assert seen["LLAMA_ARG_HOST"] == "0.0.0.0"
    assert seen["LLAMA_ARG_ENDPOINT_METRICS"] == "1"
    assert seen["LLAMA_ARG_ALIAS"] == "qwen"  # /v1/models shows no container path


def test_llama_model_from_environment_wins(tmp_path: Path, model_dir: Path):
    env = {
        "LLAMA_MODEL_DIR": str(model_dir),
        "LLAMA_ARG_MODEL": "/models/chosen.gguf",
        "LLAMA_ARG_HOST": "127.0.0.1",
    }
    code, _, seen = run(LLAMA, ["serve"], env, tmp_path)
    assert code == 0
    assert seen["LLAMA_ARG_MODEL"] == "/models/chosen.gguf"
    assert seen["LLAMA_ARG_HOST"] == "127.0.0.1"


def test_llama_without_a_model_exits_before_exec(tmp_path: Path):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, argv, _ = run(LLAMA, ["serve"], {"LLAMA_MODEL_DIR": str(empty)}, tmp_path)
    assert code == 66
    assert argv is None


SINGLE = ROOT / "docker" / "single-entrypoint.sh"


def single(env: dict[str, str], tmp: Path) -> tuple[int, dict[str, str] | None]:
    """The single image's entrypoint with a fake supervisord: the ports each program was
    given, read from the commands it hands supervisord."""
    code, argv, seen = run(SINGLE, ["serve"], {"SUPERVISORD": str(tmp / "fake"), **env}, tmp)
    if seen is None:
        return code, None
    llama = dict(w.split("=", 1) for w in seen["SEMIF_LLAMA_COMMAND"].split() if "=" in w)
    proxy = dict(w.split("=", 1) for w in seen["SEMIF_PROXY_COMMAND"].split() if "=" in w)
    assert argv == ["-c", "/etc/semif/supervisord.conf"]
    assert "-u SAGEMAKER_BIND_TO_PORT" in seen["SEMIF_LLAMA_COMMAND"]  # the proxy's port
    assert llama["LLAMA_ARG_HOST"] == "127.0.0.1"  # callers reach the proxy alone
    assert proxy["UPSTREAM_URL"] == f"http://127.0.0.1:{llama['LLAMA_ARG_PORT']}"
    return code, {"proxy": proxy["PROXY_PORT"], "llama": llama["LLAMA_ARG_PORT"]}


@pytest.mark.parametrize(
    ("env", "ports"),
    [
        ({}, {"proxy": "8080", "llama": "8081"}),
        ({"PROXY_PORT": "9000"}, {"proxy": "9000", "llama": "8081"}),
        (
            {"SAGEMAKER_BIND_TO_PORT": "8090", "PROXY_PORT": "9000"},
            {"proxy": "8090", "llama": "8081"},
        ),
        # SageMaker's range for a container's extra ports: its first port that is free
        ({"SAGEMAKER_SAFE_PORT_RANGE": "20000-20999"}, {"proxy": "8080", "llama": "20000"}),
        (
            {"SAGEMAKER_BIND_TO_PORT": "20000", "SAGEMAKER_SAFE_PORT_RANGE": "20000-20999"},
            {"proxy": "20000", "llama": "20001"},
        ),
        (
            {"LLAMA_ARG_PORT": "7000", "SAGEMAKER_SAFE_PORT_RANGE": "20000-20999"},
            {"proxy": "8080", "llama": "7000"},
        ),
    ],
)
def test_single_image_ports_come_from_what_sagemaker_documents(tmp_path: Path, env, ports):
    assert single(env, tmp_path) == (0, ports)


@pytest.mark.parametrize(
    "env",
    [
        {"SAGEMAKER_BIND_TO_PORT": "20000", "SAGEMAKER_SAFE_PORT_RANGE": "20000-20000"},
        {"LLAMA_ARG_PORT": "8080"},
    ],
)
def test_single_image_refuses_one_port_for_both(tmp_path: Path, env):
    code, ports = single(env, tmp_path)
    assert code == 64 and ports is None


@pytest.mark.parametrize(
    ("env", "threads", "connections"),
    [
        ({}, "12", "11"),  # 4 slots: two calls each, the quick lane, health, one spare
        ({"LLAMA_ARG_N_PARALLEL": "2"}, "8", "7"),
        ({"LLAMA_ARG_THREADS_HTTP": "20"}, "20", "19"),
        ({"PROXY_MAX_CONNECTIONS": "6"}, "12", "6"),
    ],
)
def test_single_image_gives_llama_server_two_http_threads_per_slot(
    tmp_path: Path, env, threads, connections
):
    code, _, seen = run(SINGLE, ["serve"], {"SUPERVISORD": str(tmp_path / "fake"), **env}, tmp_path)
    assert code == 0 and seen is not None
    llama = dict(w.split("=", 1) for w in seen["SEMIF_LLAMA_COMMAND"].split() if "=" in w)
    proxy = dict(w.split("=", 1) for w in seen["SEMIF_PROXY_COMMAND"].split() if "=" in w)
    assert (llama["LLAMA_ARG_THREADS_HTTP"], proxy["PROXY_MAX_CONNECTIONS"]) == (
        threads,
        connections,
    )


def test_single_image_refuses_a_slot_count_that_is_not_one(tmp_path: Path):
    code, _, seen = run(
        SINGLE,
        ["serve"],
        {"SUPERVISORD": str(tmp_path / "fake"), "LLAMA_ARG_N_PARALLEL": "four"},
        tmp_path,
    )
    assert code == 64 and seen is None
