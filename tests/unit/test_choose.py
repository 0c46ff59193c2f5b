"""Choosing a llama-server: the order, the fall-back, the cache and its key (no process started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.choose import Candidate, NoBuildRuns, candidates, choice_key, choose
from scripts.cpu import Cpu
from scripts.fetch import BuildError
from scripts.probe import Probe

AVX2 = Cpu("x86_64", frozenset({"sse4_2", "avx", "f16c", "fma", "avx2", "bmi2"}), "AMD EPYC")
AVX512 = Cpu("x86_64", AVX2.features | {"avx512f", "avx512bw", "avx512vl"}, "AMD EPYC")
GRAVITON = Cpu("aarch64", frozenset({"asimd", "asimddp", "asimdhp", "i8mm", "sve"}), "0xd40")
MODEL = Path("/models/SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SEMIF_CACHE", str(tmp_path / "cache"))


class Fake:
    """Candidates whose binaries are files in tmp_path and whose probe answers from a table."""

    def __init__(self, tmp_path: Path, runs: dict[str, float | str], present=(), unbuildable=()):
        self.dir, self.runs = tmp_path, runs
        self.present, self.unbuildable = set(present), set(unbuildable)
        self.obtained: list[str] = []
        self.probed: list[str] = []

    def candidate(self, name: str, tier: int, requires: tuple[str, ...] = ()) -> Candidate:
        path = self.dir / name

        def present() -> Path | None:
            return path if name in self.present else None

        def obtain() -> Path:
            if name in self.unbuildable:
                raise BuildError(f"{name}: cmake exited with 2")
            self.obtained.append(name)
            self.present.add(name)
            path.write_text("binary")
            return path

        if name in self.present:
            path.write_text("binary")
        return Candidate(
            name, "b1", f"build {name}", tier, present, obtain, identity=name, requires=requires
        )

    def probe(self, binary: Path, model: Path, **_: object) -> Probe:
        self.probed.append(binary.name)
        result = self.runs[binary.name]
        if isinstance(result, str):
            return Probe(False, result)
        return Probe(True, prompt_tokens_per_s=result, build_info="b1-x")


def _cands(fake: Fake) -> list[Candidate]:
    return [fake.candidate("wheel", 0), fake.candidate("source", 1), fake.candidate("portable", 1)]


def test_the_first_tier_that_runs_wins_and_later_ones_are_not_built(tmp_path):
    fake = Fake(tmp_path, {"wheel": 600.0, "source": 250.0, "portable": 248.0})
    choice = choose(AVX512, MODEL, _cands(fake), probe_fn=fake.probe)
    assert (choice.candidate, choice.prompt_tokens_per_s) == ("wheel", 600.0)
    assert fake.obtained == ["wheel"] and fake.probed == ["wheel"]
    assert choice.rejected == []


def test_a_candidate_that_dies_falls_back_to_the_next_and_says_why(tmp_path):
    died = "llama-server died with SIGILL (illegal instruction): this build needs AVX-512"
    fake = Fake(tmp_path, {"wheel": died, "source": 250.0, "portable": 248.0})
    choice = choose(AVX2, MODEL, _cands(fake), probe_fn=fake.probe)
    assert choice.candidate == "source"
    assert fake.obtained == ["wheel", "source"]  # portable never built just to compare
    assert choice.rejected == [{"candidate": "wheel", "reason": died}]
    assert "not wheel: " + died in choice.summary()


ZEN4 = Cpu("x86_64", AVX512.features | {"avx512_vnni", "avx512_bf16"}, "AMD EPYC")
SAPPHIRE = Cpu("x86_64", ZEN4.features | {"avx_vnni", "amx_tile"}, "Intel Xeon")
UNREAD = Cpu("x86_64", frozenset())  # /proc/cpuinfo could not be read


@pytest.mark.parametrize(
    ("cpu", "present", "reason"),  # reason: the part that depends on the CPU
    [
        (AVX2, (), "this CPU (AVX2) lacks AVX-512 and AVX-VNNI"),
        (ZEN4, (), "this CPU (AVX-512) lacks AVX-VNNI"),
        # a copy already in the cache is not started either: it would die with SIGILL
        (ZEN4, ("wheel",), "this CPU (AVX-512) lacks AVX-VNNI"),
    ],
)
def test_a_candidate_needing_flags_this_cpu_lacks_is_neither_fetched_nor_tried(
    tmp_path, cpu, present, reason
):
    fake = Fake(tmp_path, {"wheel": 600.0, "source": 250.0}, present=present)
    cands = [
        fake.candidate("wheel", 0, requires=("avx512f", "avx_vnni")),
        fake.candidate("source", 1),
    ]
    choice = choose(cpu, MODEL, cands, probe_fn=fake.probe)
    assert (choice.candidate, fake.obtained, fake.probed) == ("source", ["source"], ["source"])
    assert choice.rejected == [
        {
            "candidate": "wheel",
            "reason": (f"needs AVX-512 and AVX-VNNI; {reason}: not fetched or tried"),
        }
    ]


@pytest.mark.parametrize("cpu", [SAPPHIRE, UNREAD])  # every flag there; flags unknown
def test_a_candidate_whose_flags_are_there_or_unknown_is_tried(tmp_path, cpu):
    fake = Fake(tmp_path, {"wheel": 600.0, "source": 250.0})
    cands = [
        fake.candidate("wheel", 0, requires=("avx512f", "avx_vnni")),
        fake.candidate("source", 1),
    ]
    choice = choose(cpu, MODEL, cands, probe_fn=fake.probe)
    assert (choice.candidate, fake.probed) == ("wheel", ["wheel"])


def test_within_a_tier_what_is_already_built_competes_on_speed(tmp_path):
    fake = Fake(
        tmp_path,
        {"wheel": "SIGILL", "source": 234.0, "portable": 248.0},
        present={"source", "portable"},
    )
    choice = choose(AVX2, MODEL, _cands(fake), probe_fn=fake.probe)
    assert choice.candidate == "portable"
    assert fake.probed == ["wheel", "source", "portable"]
    assert {
        "candidate": "source",
        "reason": "runs, but slower: 234 prompt tokens/s",
    } in choice.rejected


def test_a_build_that_fails_moves_on_to_the_portable_recipe(tmp_path):
    fake = Fake(tmp_path, {"wheel": "SIGILL", "portable": 248.0}, unbuildable={"source"})
    choice = choose(AVX2, MODEL, _cands(fake), probe_fn=fake.probe)
    assert choice.candidate == "portable"
    assert choice.rejected[1] == {"candidate": "source", "reason": "source: cmake exited with 2"}


def test_nothing_runs_is_an_error_listing_every_reason(tmp_path):
    fake = Fake(
        tmp_path,
        {"wheel": "SIGILL here", "source": "exited with status 1"},
        unbuildable={"portable"},
    )
    with pytest.raises(NoBuildRuns) as err:
        choose(AVX2, MODEL, _cands(fake), probe_fn=fake.probe)
    text = str(err.value)
    assert "AMD EPYC, AVX2" in text
    for line in (
        "wheel: SIGILL here",
        "source: exited with status 1",
        "portable: portable: cmake exited with 2",
    ):
        assert line in text


def test_the_choice_is_cached_and_reused_without_a_probe(tmp_path):
    fake = Fake(tmp_path, {"wheel": "SIGILL", "source": 250.0, "portable": 248.0})
    first = choose(AVX2, MODEL, _cands(fake), probe_fn=fake.probe)
    fake.probed.clear()
    again = choose(AVX2, MODEL, _cands(fake), probe_fn=fake.probe)
    assert again == first and fake.probed == []
    fresh = choose(AVX2, MODEL, _cands(fake), probe_fn=fake.probe, reprobe=True)
    assert fresh.candidate == "source" and fake.probed == ["wheel", "source"]


def test_a_cache_carried_to_another_cpu_is_probed_again(tmp_path):
    fake = Fake(tmp_path, {"wheel": 600.0, "source": 250.0, "portable": 248.0})
    choose(AVX512, MODEL, _cands(fake), probe_fn=fake.probe)
    fake.runs["wheel"] = "SIGILL"
    fake.probed.clear()
    choice = choose(AVX2, MODEL, _cands(fake), probe_fn=fake.probe)
    assert choice.candidate == "source" and fake.probed == ["wheel", "source"]


def test_a_cached_choice_whose_binary_is_gone_is_probed_again(tmp_path):
    fake = Fake(tmp_path, {"wheel": 600.0})
    first = choose(AVX512, MODEL, _cands(fake)[:1], probe_fn=fake.probe)
    Path(first.binary).unlink()
    fake.present.clear()
    fake.probed.clear()
    choose(AVX512, MODEL, _cands(fake)[:1], probe_fn=fake.probe)
    assert fake.probed == ["wheel"]


@pytest.mark.parametrize(
    ("change", "same"),
    [
        (lambda c, m, g: (c, m, g), True),
        (lambda c, m, g: (AVX512, m, g), False),  # another CPU
        (lambda c, m, g: (c, Path("/other/SmolLM2-135M-Instruct.Q4_1.gguf"), g), True),
        (lambda c, m, g: (c, Path("/m/gemma.gguf"), g), False),  # another model
        (lambda c, m, g: (c, m, True), False),  # GPU mode
    ],
)
def test_the_key_covers_cpu_model_and_gpu_mode(tmp_path, change, same):
    cands = _cands(Fake(tmp_path, {}))
    base = choice_key(AVX2, cands, MODEL, False)
    assert (choice_key(*_swap(change(AVX2, MODEL, False), cands)) == base) is same


def _swap(args, cands):
    cpu, model, gpu = args
    return cpu, cands, model, gpu


@pytest.mark.parametrize(
    ("cpu", "gpu", "nvcc", "names"),
    [
        (AVX2, False, None, ["wheel", "source", "portable"]),
        (AVX512, False, "/usr/bin/nvcc", ["wheel", "source", "portable"]),
        (GRAVITON, False, None, ["source", "portable"]),  # the wheel is x86-64 only
        (AVX2, True, None, ["wheel"]),
        (AVX2, True, "/usr/local/cuda/bin/nvcc", ["wheel", "cuda"]),
        (GRAVITON, True, "/usr/bin/nvcc", ["cuda"]),
    ],
)
def test_the_candidates_depend_on_the_machine(cpu, gpu, nvcc, names):
    cands = candidates(cpu, gpu=gpu, nvcc=nvcc)
    assert [c.name for c in cands] == names
    assert all(c.gpu == gpu and (c.args == ("-ngl", "999")) == gpu for c in cands)


@pytest.mark.parametrize(("gpu", "requires"), [(False, ("avx512f", "avx_vnni")), (True, ())])
def test_the_wheel_is_passed_over_by_its_flags_only_on_the_cpu(gpu, requires):
    (wheel,) = [c for c in candidates(AVX2, gpu=gpu) if c.name == "wheel"]
    assert wheel.requires == requires
    assert wheel.needs == "AVX-512 and AVX-VNNI"  # what a SIGILL message says it needs


def test_llama_build_names_the_order_and_refuses_unknown_names():
    assert [c.name for c in candidates(AVX2, order=["portable", "source"])] == [
        "portable",
        "source",
    ]
    with pytest.raises(NoBuildRuns, match=r"LLAMA_BUILD names \['cuda'\]"):
        candidates(AVX2, order=["cuda"])


def test_cuda_is_built_with_this_cpus_flags_and_cuda():
    (cuda,) = [c for c in candidates(AVX2, gpu=True, nvcc="nvcc") if c.name == "cuda"]
    assert "-DGGML_CUDA=ON" in cuda.identity and "-DGGML_AVX2=ON" in cuda.identity
    assert "-DGGML_NATIVE=OFF" in cuda.identity


def test_a_build_made_with_other_flags_is_not_trusted(tmp_path):
    from scripts.fetch import _recipe, source_dir, source_present

    root = source_dir("avx2")
    (root / "build" / "bin").mkdir(parents=True)
    (root / "build" / "bin" / "llama-server").write_text("binary")
    (root / ".done").write_text(_recipe(["-DGGML_AVX2=ON"], ()))
    assert source_present("avx2", ["-DGGML_AVX2=ON"]) == root / "build" / "bin" / "llama-server"
    assert source_present("avx2", ["-DGGML_AVX2=ON", "-DGGML_BMI2=ON"]) is None
    assert source_present("avx2", ["-DGGML_AVX2=ON"], exclude=("libggml-cpu-x.so",)) is None


def test_the_key_covers_the_whole_flags_line(tmp_path):
    from dataclasses import replace

    cands = _cands(Fake(tmp_path, {}))
    assert choice_key(replace(AVX2, signature="a"), cands, MODEL, False) != choice_key(
        replace(AVX2, signature="b"), cands, MODEL, False
    )
