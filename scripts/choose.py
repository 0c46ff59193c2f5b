"""Which llama-server runs on this machine: try the candidates in a fixed order, keep what works.

The candidates, in order (``LLAMA_BUILD`` names a subset or another order):

    tier 0  wheel      the prebuilt b10434 wheel (CPU + Vulkan): fastest where it runs,
                       no compiler needed; x86-64 only, its CPU library needs AVX-512
                       and AVX-VNNI (outside GPU mode, a CPU without them never downloads it)
    tier 1  source     b11434 built from source with flags read from this CPU (cpu.py)
            portable   b11434 with llama.cpp's portable recipe (one CPU library per
                       instruction-set level, the AMX one removed)
    GPU=1:  wheel with ``-ngl 999`` (Vulkan), then ``cuda`` (b11434 with GGML_CUDA,
            where ``nvcc`` is installed); a GPU candidate must really offload layers

A candidate runs if it loads the model and decodes a token here (``probe.py``); one
that ``requires`` a CPU flag this CPU lacks is passed over unfetched and untried.
The first tier with a candidate that runs wins; within a tier, candidates that
are already built are all probed and the fastest prompt rate is kept, but
nothing is built just to compare: a later candidate is fetched or built only
when none before it in its tier runs.

The choice is cached under ``$SEMIF_CACHE/choices/``, keyed by the candidates'
llama.cpp versions and flags, the CPU's instruction-set features, the GPU mode
and the model file: carried to another CPU, the cache is not trusted but probed
again. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.error
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

from .cpu import Cpu, feature_names, lacking, level, source_build
from .fetch import (
    CUDA_FLAGS,
    PORTABLE_EXCLUDED,
    PORTABLE_FLAGS,
    SOURCE_BUILD,
    WHEEL_BUILD,
    WHEEL_CPU_FLAGS,
    BuildError,
    cache_root,
    say,
    source_binary,
    source_present,
    wheel_binary,
    wheel_present,
)
from .probe import Probe, probe

__all__ = [
    "Candidate",
    "Choice",
    "NoBuildRuns",
    "candidates",
    "choose",
    "choice_key",
    "load_choice",
]

GPU_ARGS = ("-ngl", "999")


@dataclass(frozen=True)
class Candidate:
    name: str  # "wheel", "source", "portable", "cuda"
    build: str  # llama.cpp build, "b11434"
    label: str  # in words, for what `make run` prints
    tier: int
    present: Callable[[], Path | None]  # the binary when already in the cache
    obtain: Callable[[], Path]  # fetch or build it (BuildError when impossible)
    needs: str = ""  # what the CPU must have, for a SIGILL message
    requires: tuple[str, ...] = ()  # cpuinfo flags it dies without: not tried if lacking
    args: tuple[str, ...] = ()  # extra llama-server flags it runs with
    gpu: bool = False
    identity: str = ""  # what it is built from, for the cache key


@dataclass(frozen=True)
class Choice:
    candidate: str
    label: str
    binary: str
    build: str
    args: list[str]
    prompt_tokens_per_s: float
    build_info: str
    cpu: str
    gpu_layers: int = 0
    rejected: list[dict[str, str]] = field(default_factory=list)
    key: str = ""
    probed_at: str = ""

    def summary(self) -> str:
        gpu = f", {self.gpu_layers} layers on the GPU" if self.gpu_layers else ""
        line = (
            f"{self.label}: {self.prompt_tokens_per_s:.0f} prompt tokens/s on this CPU "
            f"({self.cpu}){gpu}"
        )
        for r in self.rejected:
            line += f"\n  not {r['candidate']}: {r['reason']}"
        return line


class NoBuildRuns(RuntimeError):
    """No candidate loads the model and decodes a token here; the message lists why each failed."""


def candidates(
    cpu: Cpu, *, gpu: bool = False, order: Sequence[str] | None = None, nvcc: str | None = None
) -> list[Candidate]:
    """The candidates for ``cpu`` in the order they are tried (``order`` names a subset)."""
    tag, flags = source_build(cpu)
    built_for = ", ".join(f[len("-DGGML_") : -len("=ON")] for f in flags if f.endswith("=ON"))
    found: dict[str, Candidate] = {}
    if cpu.is_x86:
        # GPU mode offloads the layers to Vulkan; whether the CPU library's faulting code
        # is reached there is untested, so there the probe decides
        requires = () if gpu else WHEEL_CPU_FLAGS
        found["wheel"] = Candidate(
            "wheel",
            WHEEL_BUILD,
            f"prebuilt wheel {WHEEL_BUILD} (CPU + Vulkan)",
            0,
            wheel_present,
            wheel_binary,
            needs=feature_names(WHEEL_CPU_FLAGS),
            requires=requires,
            identity=f"wheel-{WHEEL_BUILD}",
            args=GPU_ARGS if gpu else (),
            gpu=gpu,
        )
    if gpu:
        if nvcc:
            cuda_flags = [*flags, *CUDA_FLAGS[1:]]
            found["cuda"] = Candidate(
                "cuda",
                SOURCE_BUILD,
                f"source build {SOURCE_BUILD} (CUDA, {tag})",
                1,
                partial(source_present, f"cuda-{tag}", cuda_flags),
                partial(source_binary, f"cuda-{tag}", cuda_flags),
                needs=built_for,
                args=GPU_ARGS,
                gpu=True,
                identity=" ".join(cuda_flags),
            )
    else:
        found["source"] = Candidate(
            "source",
            SOURCE_BUILD,
            f"source build {SOURCE_BUILD} ({tag})",
            1,
            partial(source_present, tag, flags),
            partial(source_binary, tag, flags),
            needs=built_for,
            identity=" ".join(flags),
        )
        if cpu.is_x86 or cpu.is_arm:
            found["portable"] = Candidate(
                "portable",
                SOURCE_BUILD,
                f"portable source build {SOURCE_BUILD} (all CPU variants)",
                1,
                partial(source_present, "all-variants", PORTABLE_FLAGS, exclude=PORTABLE_EXCLUDED),
                partial(source_binary, "all-variants", PORTABLE_FLAGS, exclude=PORTABLE_EXCLUDED),
                identity=" ".join([*PORTABLE_FLAGS, *PORTABLE_EXCLUDED]),
            )
    names = list(order) if order else list(found)
    unknown = [n for n in names if n not in found]
    if unknown:
        raise NoBuildRuns(
            f"LLAMA_BUILD names {unknown}; on this machine the candidates are {list(found)}"
        )
    return [found[n] for n in names]


def choice_key(cpu: Cpu, cands: Sequence[Candidate], model: Path, gpu: bool) -> str:
    """What a cached choice depends on, hashed: another CPU, build or model is probed again."""
    basis = {
        "arch": cpu.arch,
        "features": sorted(cpu.features),
        "flags": cpu.signature,
        "gpu": gpu,
        "model": model.name,
        "candidates": [[c.name, c.build, c.identity, list(c.args)] for c in cands],
    }
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:16]


def _choice_path(key: str) -> Path:
    return cache_root() / "choices" / f"{key}.json"


def load_choice(key: str) -> Choice | None:
    """The cached choice for ``key``, if its binary is still there."""
    try:
        data = json.loads(_choice_path(key).read_text())
        choice = Choice(**data)
    except (OSError, ValueError, TypeError):
        return None
    return choice if choice.key == key and Path(choice.binary).exists() else None


def choose(
    cpu: Cpu,
    model: Path,
    cands: Sequence[Candidate],
    *,
    gpu: bool = False,
    reprobe: bool = False,
    probe_fn: Callable[..., Probe] = probe,
) -> Choice:
    """The llama-server to run here: the cached choice, or the first tier that runs."""
    key = choice_key(cpu, cands, model, gpu)
    if not reprobe and (cached := load_choice(key)):
        return cached
    rejected: list[dict[str, str]] = []
    for tier in sorted({c.tier for c in cands}):
        runners: list[tuple[Candidate, Path, Probe]] = []
        for cand in (c for c in cands if c.tier == tier):
            if missing := lacking(cpu, cand.requires):
                reason = (
                    f"needs {feature_names(cand.requires)}; this CPU ({level(cpu)}) lacks "
                    f"{feature_names(missing)}: not fetched or tried"
                )
                say(f"{cand.label} cannot run here: {reason}")
                rejected.append({"candidate": cand.name, "reason": reason})
                continue
            binary = cand.present()
            if binary is None:
                if runners:
                    continue  # never build just to compare
                try:
                    binary = cand.obtain()
                except (BuildError, OSError, urllib.error.URLError, SystemExit) as err:
                    rejected.append({"candidate": cand.name, "reason": str(err)})
                    say(f"{cand.label} is not available: {err}")
                    continue
            say(f"trying {cand.label} on the model")
            result = probe_fn(
                binary, model, args=cand.args, needs=cand.needs, has=level(cpu), gpu=cand.gpu
            )
            if result.ok:
                say(f"  runs: {result.prompt_tokens_per_s:.0f} prompt tokens/s")
                runners.append((cand, binary, result))
            else:
                say(f"  does not run here: {result.reason}")
                rejected.append({"candidate": cand.name, "reason": result.reason})
        if runners:
            cand, binary, result = max(runners, key=lambda r: r[2].prompt_tokens_per_s)
            for other, _, slower in runners:
                if other is not cand:
                    rejected.append(
                        {
                            "candidate": other.name,
                            "reason": (
                                "runs, but slower: "
                                f"{slower.prompt_tokens_per_s:.0f} prompt tokens/s"
                            ),
                        }
                    )
            choice = Choice(
                candidate=cand.name,
                label=cand.label,
                binary=str(binary),
                build=cand.build,
                args=list(cand.args),
                prompt_tokens_per_s=round(result.prompt_tokens_per_s, 1),
                build_info=result.build_info,
                cpu=f"{cpu.model or cpu.arch}, {level(cpu)}",
                gpu_layers=result.gpu_layers,
                rejected=rejected,
                key=key,
                probed_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            )
            _save(choice)
            return choice
    why = "\n".join(f"  {r['candidate']}: {r['reason']}" for r in rejected) or "  (no candidates)"
    raise NoBuildRuns(
        f"no llama-server runs on this machine ({cpu.model or cpu.arch}, "
        f"{level(cpu)}{', GPU mode' if gpu else ''}):\n{why}"
    )


def _save(choice: Choice) -> None:
    path = _choice_path(choice.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps(asdict(choice), indent=2) + "\n")
    tmp.replace(path)
