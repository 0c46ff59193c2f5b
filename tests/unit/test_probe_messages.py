"""What a llama-server exit is reported as (exact words: people read them)."""

from __future__ import annotations

import pytest

from scripts.probe import DEFAULT_FIX, explain_exit, log_tail

LOG = "load_model: loading model 'x.gguf'\n\nAMX is not ready to be used!\nmain: exiting\n"


@pytest.mark.parametrize(
    ("returncode", "kwargs", "expected"),
    [
        (
            -4,
            {"needs": "AVX-512", "has": "AVX2", "fix": None},
            "llama-server died with SIGILL (illegal instruction): this build needs AVX-512, "
            "this CPU has AVX2",
        ),
        (
            132,
            {"has": "AVX2", "fix": "run X"},  # 128 + 4, as a shell reports it
            "llama-server died with SIGILL (illegal instruction): this build uses an instruction "
            "this CPU does not have, this CPU has AVX2; run X",
        ),
        (
            -11,
            {"fix": None},
            "llama-server died with SIGSEGV; its log ends:\n"
            "load_model: loading model 'x.gguf'\nAMX is not ready to be used!\n"
            "main: exiting",
        ),
        (
            -9,
            {},
            "llama-server was killed (SIGKILL: out of memory, or stopped by hand); its log "
            "ends:\nload_model: loading model 'x.gguf'\nAMX is not ready to be used!\n"
            "main: exiting",
        ),
        (
            -15,
            {},
            "llama-server was stopped (SIGTERM); its log ends:\n"
            "load_model: loading model 'x.gguf'\nAMX is not ready to be used!\nmain: exiting",
        ),
        (
            1,
            {},
            "llama-server exited with status 1; its log ends:\n"
            "load_model: loading model 'x.gguf'\nAMX is not ready to be used!\nmain: exiting",
        ),
    ],
)
def test_exits_are_explained(returncode, kwargs, expected):
    assert explain_exit(returncode, LOG, **kwargs) == expected


def test_the_default_fix_names_the_command():
    text = explain_exit(-4, "", needs="AVX-512", has="AVX2")
    assert text.endswith("; " + DEFAULT_FIX)
    assert "python scripts/prepare.py llama-server --reprobe" in text


def test_log_tail_keeps_the_last_non_empty_lines():
    assert log_tail("a\n\nb\n  \nc\n", 2) == "b\nc"
    assert log_tail("", 3) == ""
