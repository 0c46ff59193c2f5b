"""Each image's user, root and contents: the proxy image runs as uid 10001 (with a read-only
root: test_pair.py), the llama and single images as root, as SageMaker expects containers to
run (docs/sagemaker.md); no compiler and no test or development package inside; the
llama.cpp base (a stand-in where it cannot be pulled) holds no Python, so that no build can
lean on one it would not have."""

from __future__ import annotations

import re

import pytest

from scripts.containers import Engine
from tests.containers.conftest import LLAMA_IMAGE, PROXY_IMAGE, SINGLE_IMAGE
from tests.containers.kit import ROOT, in_image

LLAMA_BASE = "ghcr.io/ggml-org/llama.cpp:server-b11434"
TOOLS = ("gcc", "cc", "g++", "c++", "clang", "make", "ld")


def locked(name: str) -> set[str]:
    text = (ROOT / "requirements" / name).read_text()
    return {m.lower().replace("_", "-") for m in re.findall(r"^([A-Za-z0-9_.-]+)==", text, re.M)}


def test_the_proxy_runs_as_10001_and_the_others_as_root(engine: Engine, images):
    def user(image: str) -> str:
        return engine.docker("image", "inspect", "--format", "{{.Config.User}}", image).stdout

    assert user(PROXY_IMAGE).strip() == "10001"
    assert in_image(engine, PROXY_IMAGE, "id -u").strip() == "10001"
    for image in (LLAMA_IMAGE, SINGLE_IMAGE):
        assert user(image).strip() == ""  # root: SageMaker's expectation
        assert in_image(engine, image, "id -u").strip() == "0"


@pytest.mark.parametrize("image", [PROXY_IMAGE, LLAMA_IMAGE, SINGLE_IMAGE])
def test_no_compiler_inside(engine: Engine, images, image):
    found = in_image(engine, image, " ; ".join(f"command -v {t}" for t in TOOLS) + " ; true")
    assert found.split() == []


@pytest.mark.parametrize("image", [PROXY_IMAGE, SINGLE_IMAGE])
def test_no_test_or_development_package_inside(engine: Engine, images, image):
    installed = in_image(engine, image, "python3 -m pip list --format=freeze 2>/dev/null")
    names = {line.split("==")[0].lower().replace("_", "-") for line in installed.split()}
    assert "aiohttp" in names and "semif-sidecar" in names  # the listing is real
    dev_only = locked("dev.lock") - locked("runtime.lock")
    assert "pytest" in dev_only
    assert names & dev_only == set()


@pytest.mark.parametrize("image", [LLAMA_BASE, LLAMA_IMAGE])
def test_the_llama_images_hold_no_python(engine: Engine, images, image):
    assert in_image(engine, image, "ls /app/llama-server && command -v curl").split() == [
        "/app/llama-server",
        "/usr/bin/curl",
    ]
    found = in_image(engine, image, "command -v python3 python python3.11 python3.12 ; true")
    assert found.split() == []
