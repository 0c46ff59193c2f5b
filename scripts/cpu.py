"""What this CPU can run: its instruction-set features, and the llama.cpp build flags they allow.

Standard library only (it runs before any virtual environment exists). Pure
functions take a ``Cpu`` so the mapping is unit-tested for CPUs we do not have.
"""

from __future__ import annotations

import hashlib
import platform
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ARM_FEATURES",
    "Cpu",
    "X86_FEATURES",
    "feature_names",
    "lacking",
    "level",
    "read_cpu",
    "source_build",
]

# The /proc/cpuinfo flags that decide which ggml kernels can run (x86-64 "flags",
# aarch64 "Features"). The cache key holds these and a hash of the whole line:
# a build chosen on one CPU is probed again on any other.
X86_FEATURES = (
    "sse4_2",
    "avx",
    "f16c",
    "fma",
    "avx2",
    "bmi2",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512dq",
    "avx512cd",
    "avx512_vbmi",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)
ARM_FEATURES = ("asimd", "asimddp", "asimdhp", "fphp", "i8mm", "sve", "sve2", "sme")
# How a message names a flag (the flag itself where it has no entry).
_NAMES = {
    "sse4_2": "SSE4.2",
    "avx": "AVX",
    "f16c": "F16C",
    "fma": "FMA",
    "avx2": "AVX2",
    "bmi2": "BMI2",
    "avx_vnni": "AVX-VNNI",
    "avx512f": "AVX-512",
    "avx512_vnni": "AVX-512 VNNI",
    "avx512_bf16": "AVX-512 BF16",
    "amx_tile": "AMX",
}


@dataclass(frozen=True)
class Cpu:
    arch: str  # platform.machine(): "x86_64", "aarch64", ...
    features: frozenset[str]  # the relevant subset of the kernel's flags
    model: str = ""  # "AMD EPYC 9R14", for messages only
    signature: str = ""  # a hash of the kernel's whole flags line, for the cache key

    @property
    def is_x86(self) -> bool:
        return self.arch in ("x86_64", "AMD64", "amd64")

    @property
    def is_arm(self) -> bool:
        return self.arch in ("aarch64", "arm64")


def read_cpu(cpuinfo: Path = Path("/proc/cpuinfo"), arch: str | None = None) -> Cpu:
    """This machine's CPU, from ``/proc/cpuinfo`` (empty features where it is unreadable)."""
    arch = arch or platform.machine()
    flags: set[str] = set()
    model = ""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("flags", "features") and not flags:
            flags = set(value.split())
        elif key in ("model name", "cpu part") and not model:
            model = value.strip()
    known = X86_FEATURES + ARM_FEATURES
    signature = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16]
    return Cpu(arch, frozenset(f for f in flags if f in known), model, signature)


def level(cpu: Cpu) -> str:
    """The CPU's best instruction-set level in words, for messages: "AVX2", "AVX-512 and AMX"."""
    f = cpu.features
    if cpu.is_x86:
        if "amx_tile" in f and "avx512f" in f:
            return "AVX-512 and AMX"
        if "avx512f" in f:
            return "AVX-512"
        for name, flag in (("AVX2", "avx2"), ("AVX", "avx"), ("SSE4.2", "sse4_2")):
            if flag in f:
                return name
        return "x86-64 without AVX"
    if cpu.is_arm:
        extras = [
            name
            for name, flag in (("dotprod", "asimddp"), ("i8mm", "i8mm"), ("SVE", "sve"))
            if flag in f
        ]
        return "Armv8 with " + ", ".join(extras) if extras else "Armv8 (NEON only)"
    return cpu.arch


def feature_names(flags: Iterable[str]) -> str:
    """Flags in words, for messages: ("avx512f", "avx_vnni") -> "AVX-512 and AVX-VNNI"."""
    names = [_NAMES.get(f, f) for f in flags]
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def lacking(cpu: Cpu, flags: Iterable[str]) -> list[str]:
    """The ``flags`` this CPU does not have; none where its flags could not be read
    (then only running a build tells)."""
    if not cpu.features:
        return []
    return [f for f in flags if f not in cpu.features]


_OFF = "OFF"
_ON = "ON"


def source_build(cpu: Cpu) -> tuple[str, list[str]]:
    """The tag and the ggml CMake flags of a source build for this CPU's features.

    x86-64: each instruction set the CPU has, up to AVX2 (SSE4.2, AVX, F16C, FMA,
    AVX2, BMI2, AVX-VNNI), is switched on and every other one off explicitly
    (with ``GGML_NATIVE=OFF`` ggml would otherwise assume AVX2). AVX-512 is left
    off: on an AMD EPYC with AVX-512 such a build measured slower than the AVX2 one
    (177 against 234 prompt tokens/s, docs/llama-server.md), and AMX
    and ``GGML_NATIVE`` die with SIGILL on some of the VMs.
    aarch64: ``GGML_CPU_ARM_ARCH`` from the Features line (dotprod, fp16, i8mm);
    SVE is left off (vector-length-specific code; the NEON paths are portable).
    """
    f = cpu.features
    flags = ["-DGGML_NATIVE=OFF"]
    if cpu.is_x86:
        chosen = {
            "SSE42": "sse4_2" in f,
            "AVX": "avx" in f,
            "F16C": {"avx", "f16c"} <= f,
            "FMA": {"avx", "fma"} <= f,
            "AVX2": {"avx", "avx2", "fma", "f16c"} <= f,
            "BMI2": {"avx2", "bmi2"} <= f,
            "AVX_VNNI": {"avx2", "avx_vnni"} <= f,
        }
        flags += [f"-DGGML_{name}={_ON if on else _OFF}" for name, on in chosen.items()]
        flags += [
            f"-DGGML_{name}={_OFF}"
            for name in (
                "AVX512",
                "AVX512_VBMI",
                "AVX512_VNNI",
                "AVX512_BF16",
                "AMX_TILE",
                "AMX_INT8",
                "AMX_BF16",
            )
        ]
        tag = "-".join(name.lower() for name, on in chosen.items() if on) or "x86-64"
        return tag, flags
    if cpu.is_arm:
        ext = []
        if "asimddp" in f:
            ext.append("dotprod")
        if "asimdhp" in f or "fphp" in f:
            ext.append("fp16")
        if "i8mm" in f:
            ext.append("i8mm")
        base = "armv8.2-a" if ext else "armv8-a"
        arch = "+".join([base, *ext])
        return arch.replace("+", "-"), [*flags, f"-DGGML_CPU_ARM_ARCH={arch}"]
    return cpu.arch, flags
