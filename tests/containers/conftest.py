"""The container suite (`make test-containers`): the project's images built from its own
Dockerfiles and run as users run them: `docker compose up` as the README says, the single
image as SageMaker runs it, the two-container layout, and each image's user, root and
contents. A Docker engine is needed: where none answers the suite skips with one line,
unless CI=true or SEMIF_CONTAINERS_INSTALL=1 lets it install and start one
(scripts/containers.py); in CI a missing engine fails it.

Everything the suite adds to the engine (containers, networks, volumes, images, the
stand-in bases, build cache) is removed at its end, and a dockerd it started is stopped.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.containers import Engine, EngineMissing, ensure_bases, install_allowed
from scripts.prepare import ensure_model
from tests.containers.kit import FIGURES, ROOT, figure, image_size_mb

# The project's images, under the names docker-compose.yml gives them (so that `up --build`
# finds them built), and the single image's
PROXY_IMAGE = "semif-proxy:0.1.0"
LLAMA_IMAGE = "semif-llama:b11434"
SINGLE_IMAGE = "semif-single:suite"
DOCKERFILES = {
    PROXY_IMAGE: "Dockerfile.proxy",
    LLAMA_IMAGE: "Dockerfile.llama",
    SINGLE_IMAGE: "Dockerfile.single",
}


def _inventory(engine: Engine) -> dict[str, set[str]]:
    def ids(*args: str) -> set[str]:
        return set(engine.docker(*args, check=False).stdout.split())

    return {
        "container": ids("ps", "--all", "--quiet", "--no-trunc"),
        "network": ids("network", "ls", "--quiet", "--no-trunc"),
        "volume": ids("volume", "ls", "--quiet"),
        "image": ids("image", "ls", "--all", "--quiet", "--no-trunc"),
    }


def _remove_what_was_added(engine: Engine, before: dict[str, set[str]], prune_cache: bool) -> None:
    after = _inventory(engine)
    added = {kind: sorted(after[kind] - before[kind]) for kind in after}
    if added["container"]:
        engine.docker("rm", "--force", "--volumes", *added["container"], check=False)
    if added["network"]:
        engine.docker("network", "rm", *added["network"], check=False)
    if added["volume"]:
        engine.docker("volume", "rm", "--force", *added["volume"], check=False)
    if added["image"]:
        engine.docker("image", "rm", "--force", *added["image"], check=False)
    if prune_cache:
        engine.docker("builder", "prune", "--all", "--force", check=False)
    left = {kind: sorted(_inventory(engine)[kind] - before[kind]) for kind in after}
    assert not any(left.values()), f"the suite left behind: {left}"


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    try:
        got = Engine.ensure(install=install_allowed())
    except EngineMissing as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI runs the container suite, and no engine could be set up: {e}")
        pytest.skip(
            f"container suite skipped: {e} (SEMIF_CONTAINERS_INSTALL=1 installs and starts one)"
        )
    before = _inventory(got)
    try:
        started = time.monotonic()
        how = ensure_bases(got)
        figure(
            "base images",
            ", ".join(f"{name} {way}" for name, way in how.items())
            + f" ({time.monotonic() - started:.0f} s)",
        )
        yield got
    finally:
        # the build cache is pruned whole only in an engine the suite started or in CI,
        # where nothing else built; elsewhere it is left (docker builder prune clears it)
        _remove_what_was_added(
            got, before, prune_cache=got.started is not None or os.environ.get("CI") == "true"
        )
        got.stop()


@pytest.fixture(scope="session")
def model_dir() -> Iterator[Path]:
    """``models/`` as the README has users make it: the default model copied in (a hard
    link where the cache shares the disk). Removed afterwards if the suite made it."""
    models = ROOT / "models"
    made = not models.exists()
    models.mkdir(exist_ok=True)
    model = ensure_model()
    target = models / model.name
    placed = not target.exists()
    if placed:
        try:
            os.link(model, target)
        except OSError:
            shutil.copy(model, target)
    try:
        yield models
    finally:
        if placed:
            target.unlink(missing_ok=True)
        if made:
            shutil.rmtree(models, ignore_errors=True)


@pytest.fixture(scope="session")
def images(engine: Engine) -> dict[str, str]:
    """The three images, built from the project's Dockerfiles as its docs say."""
    for image, dockerfile in DOCKERFILES.items():
        started = time.monotonic()
        engine.docker(
            "build", "--quiet", *engine.build_args(), "-f", dockerfile, "-t", image, str(ROOT)
        )
        figure(
            f"{dockerfile}",
            f"built in {time.monotonic() - started:.0f} s, {image_size_mb(engine, image):.0f} MB",
        )
    return dict(DOCKERFILES)


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001
    if FIGURES:
        terminalreporter.section("container suite figures (measured, not bounds)")
        for what, value in FIGURES:
            terminalreporter.write_line(f"{what}: {value}")
