"""scripts/containers.py's choices that need no engine: when it may install, which CA bundle
the builds get, and what a stand-in's cache key depends on."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import containers
from scripts.containers import BASES, build_ca, install_allowed, standin_key


@pytest.mark.parametrize(
    ("env", "allowed"),
    [
        ({"CI": "true"}, True),
        ({"SEMIF_CONTAINERS_INSTALL": "1"}, True),
        ({"CI": "1"}, False),  # CI=true is what CI sets; anything else asks nothing of root
        ({"SEMIF_CONTAINERS_INSTALL": "yes"}, False),
        ({}, False),
    ],
)
def test_installs_only_in_ci_or_when_asked(env, allowed):
    assert install_allowed(env) is allowed


def test_the_builds_ca_bundle_is_the_one_named_first(tmp_path: Path):
    named, pip, ssl = (tmp_path / n for n in ("named.crt", "pip.crt", "ssl.crt"))
    for f in (named, pip, ssl):
        f.write_text("-----BEGIN CERTIFICATE-----\n")
    env = {"SEMIF_BUILD_CA": str(named), "PIP_CERT": str(pip), "SSL_CERT_FILE": str(ssl)}
    assert build_ca(env) == str(named)
    assert build_ca({"PIP_CERT": str(pip), "SSL_CERT_FILE": str(ssl)}) == str(pip)
    # a name that is no file is passed over, not handed to the build
    assert build_ca({"SEMIF_BUILD_CA": str(tmp_path / "missing"), "SSL_CERT_FILE": str(ssl)}) == (
        str(ssl)
    )


def test_a_standins_key_follows_its_recipe_its_name_and_the_llama_build(tmp_path, monkeypatch):
    python, slim, llama = BASES[0], BASES[1], BASES[2]
    assert python.recipe == slim.recipe and python.name != slim.name
    build = tmp_path / "bin"
    build.mkdir()
    (build / "llama-server").write_bytes(b"one")
    (build / "libllama.so.0.6.0").write_bytes(b"lib")
    (build / "libllama.so.0").symlink_to("libllama.so.0.6.0")
    first = standin_key(llama, build)
    assert standin_key(llama, build) == first  # the same inputs, the same key
    (build / "llama-server").write_bytes(b"two")
    assert standin_key(llama, build) != first  # another llama-server build, another image
    assert standin_key(python, None) != standin_key(slim, None)  # one archive per name
    recipes = tmp_path / "standins"
    recipes.mkdir()
    (recipes / python.recipe).write_text("FROM x\n")
    before = standin_key(python, None)
    monkeypatch.setattr(containers, "STANDINS", recipes)
    assert standin_key(python, None) != before  # the recipe is part of the key
