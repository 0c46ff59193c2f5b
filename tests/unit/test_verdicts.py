"""proxy/verdicts.py: the self-check's kept verdicts, their key and their file."""

from __future__ import annotations

import hashlib
import os

import orjson
import pytest

from proxy.decision.selfcheck import Check
from proxy.verdicts import (
    CHECK_VERSION,
    MAX_KEPT,
    Verdicts,
    cpu_features,
    file_stamp,
    verdict_key,
)


@pytest.mark.parametrize(
    ("cpuinfo", "expected"),
    [
        ("processor\t: 0\nflags\t\t: sse2 avx2 fma avx2\n\nflags\t\t: other", "avx2 fma sse2"),
        ("processor\t: 0\nFeatures\t: fp asimd evtstrm\n", "asimd evtstrm fp"),
        ("model name\t: flags are not here\n", ""),
        ("", ""),
    ],
)
def test_cpu_features(cpuinfo: str, expected: str) -> None:
    assert cpu_features(cpuinfo) == expected


IDENTITY = {"build": "b11434-abc", "model": "m.gguf", "meta": {"n_params": 134515008}}
PARTS = {
    "model_file": {"size": 1, "mtime_ns": 2},
    "cpu": "avx2",
    "scheme": "prefix-63",
    "slots": 4,
}


def test_key_is_the_sha256_of_its_parts_sorted() -> None:
    expected = hashlib.sha256(
        orjson.dumps(
            {
                "check": CHECK_VERSION,
                "cpu": "avx2",
                "llama_server": IDENTITY,
                "model_file": {"mtime_ns": 2, "size": 1},
                "scheme": "prefix-63",
                "slots": 4,
            },
            option=orjson.OPT_SORT_KEYS,
        )
    ).hexdigest()
    assert verdict_key(IDENTITY, **PARTS) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("model_file", {"size": 1, "mtime_ns": 3}),
        ("cpu", "avx2 avx512f"),
        ("scheme", "segment"),
        ("slots", 2),
    ],
)
def test_every_part_changes_the_key(name: str, value: object) -> None:
    changed = {**PARTS, name: value}
    assert verdict_key(IDENTITY, **changed) != verdict_key(IDENTITY, **PARTS)  # type: ignore[arg-type]


def test_llama_servers_identity_changes_the_key() -> None:
    other = {**IDENTITY, "build": "b11435-def"}
    assert verdict_key(other, **PARTS) != verdict_key(IDENTITY, **PARTS)  # type: ignore[arg-type]


def test_file_stamp(tmp_path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"12345")
    os.utime(model, ns=(1_000, 2_000))
    assert file_stamp(str(model)) == {"size": 5, "mtime_ns": 2_000}
    assert file_stamp(str(tmp_path / "absent.gguf")) == {}
    assert file_stamp("") == {}


def test_a_verdict_is_kept_in_the_file_for_the_next_process(tmp_path) -> None:
    path = tmp_path / "dir" / "verdicts.json"
    Verdicts(path).put("k", Check("prefix-63", True, "4 reads identical", 1700000000.0))
    kept = Verdicts(path).get("k")
    assert kept == Check(
        "prefix-63",
        True,
        "4 reads identical (kept from the check at 1700000000)",
        1700000000.0,
    )
    assert Verdicts(path).get("other") is None


def test_not_checked_is_never_kept(tmp_path) -> None:
    path = tmp_path / "verdicts.json"
    Verdicts(path).put("k", Check("prefix-63", None, "not checked: gone", 1.0))
    assert not path.exists()
    assert Verdicts(path).get("k") is None


def test_a_failed_verdict_is_not_kept(tmp_path) -> None:
    # passing traffic batched with the check can make it fail: checked again next start
    path = tmp_path / "verdicts.json"
    Verdicts(path).put("k", Check("prefix-63", False, "differs", 5.0))
    assert not path.exists()
    assert Verdicts(path).get("k") is None


def test_processes_sharing_the_file_add_to_what_it_holds(tmp_path) -> None:
    path = tmp_path / "verdicts.json"
    first, second = Verdicts(path), Verdicts(path)
    first.put("a", Check("prefix-63", True, "x", 1.0))
    second.put("b", Check("segment", True, "y", 2.0))
    assert set(orjson.loads(path.read_bytes())) == {"a", "b"}
    assert first.get("b") is not None  # read from the file when not in memory


def test_only_the_newest_are_kept(tmp_path) -> None:
    path = tmp_path / "verdicts.json"
    store = Verdicts(path)
    for i in range(MAX_KEPT + 3):
        store.put(f"k{i}", Check("segment", True, "", float(i)))
    kept = orjson.loads(path.read_bytes())
    assert len(kept) == MAX_KEPT
    assert "k0" not in kept and "k2" not in kept and f"k{MAX_KEPT + 2}" in kept


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"[1, 2]",
        b'{"k": {"scheme": "segment"}}',
        b'{"k": {"scheme": "segment", "repeatable": "yes", "detail": "", "checked_at": 1}}',
        b'{"k": {"scheme": "segment", "repeatable": false, "detail": "", "checked_at": 1}}',
    ],
)
def test_an_unreadable_or_malformed_file_keeps_nothing(tmp_path, content: bytes) -> None:
    path = tmp_path / "verdicts.json"
    path.write_bytes(content)
    assert Verdicts(path).get("k") is None


def test_in_memory_only_without_a_path() -> None:
    store = Verdicts(None)
    store.put("k", Check("segment", True, "ok", 3.0))
    assert store.get("k") is not None
    assert Verdicts(None).get("k") is None


def test_an_unwritable_place_keeps_it_in_memory(tmp_path, caplog) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the folder should be
    store = Verdicts(blocked / "verdicts.json")
    store.put("k", Check("segment", True, "ok", 3.0))
    assert store.get("k") is not None
    assert "could not keep" in caplog.text


def test_the_costs_the_check_taught_are_kept_with_its_verdict(tmp_path) -> None:
    from proxy.cost import CHUNK, ONE, CostModel

    taught = CostModel()
    taught.observe(CHUNK, 40, 0, 0.5, 0.52)
    taught.observe(CHUNK, 400, 40, 8.0, 8.03)
    taught.observe(ONE, 1, 440, 0.05, 0.06)
    path = tmp_path / "verdicts.json"
    Verdicts(path).put("k", Check("prefix-63", True, "ok", 1.0), taught.state())
    kept = Verdicts(path).costs("k")
    fresh = CostModel()
    assert kept is not None and fresh.restore(kept)
    # a prior: the same fit, weighing as one step, estimating nothing until a step of its own
    for kind in (CHUNK, ONE):
        assert fresh.steps[kind].a == pytest.approx(taught.steps[kind].a, rel=1e-12)
        assert fresh.steps[kind].b == pytest.approx(taught.steps[kind].b, rel=1e-12, abs=1e-18)
        assert fresh.steps[kind].sxx[0] == pytest.approx(1.0, rel=1e-12)
    assert fresh.observed == 0 and fresh.step_s(CHUNK, 57, 30) is None
    assert Verdicts(path).costs("other") is None


@pytest.mark.parametrize(
    "state",
    [
        {},
        {"fit": "per-token", "steps": {}},
        {"fit": "per-token", "steps": {"one": {"sxx": [1]}}, "overhead_s": 0, "observed": 1},
        # a whole state of sums over seconds (before the fit was per token): not taken
        {
            "steps": {
                k: {"sxx": [1.0, 1.0, 2.0], "sxy": [0.1, 0.1], "a": 0.1, "b": 0.0, "reach": 1.0}
                for k in ("one", "chunk", "batch")
            },
            "overhead_s": 0.0,
            "observed": 3,
        },
    ],
)
def test_costs_that_are_not_whole_are_not_taken(state) -> None:
    from proxy.cost import CostModel

    model = CostModel()
    assert model.restore(state) is False
    assert model.observed == 0 and model.step_s("chunk", 10, 0) is None
