"""The CPU's features, read from /proc/cpuinfo, and the build flags they allow."""

from __future__ import annotations

import pytest

from scripts.cpu import Cpu, feature_names, lacking, level, read_cpu, source_build

AVX2 = {"sse4_2", "avx", "f16c", "fma", "avx2", "bmi2"}
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"}
AMX = AVX512 | {"amx_tile", "amx_int8", "amx_bf16"}


def test_read_cpu_keeps_the_flags_that_matter(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC 9R14\n"
        "flags\t\t: fpu vme sse4_2 avx f16c fma avx2 bmi2 sha_ni rdrand\n\n"
        "processor\t: 1\nflags\t\t: fpu\n"
    )
    cpu = read_cpu(info, arch="x86_64")
    assert (cpu.arch, cpu.features, cpu.model) == ("x86_64", frozenset(AVX2), "AMD EPYC 9R14")
    other = tmp_path / "other"  # the same features plus one flag the kernel lists
    other.write_text(info.read_text().replace("sha_ni", "sha_ni gfni"))
    assert read_cpu(other, arch="x86_64").signature != cpu.signature != ""


def test_read_cpu_on_aarch64_reads_features(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nFeatures\t: fp asimd evtstrm aes asimdhp asimddp i8mm sve\n"
        "CPU part\t: 0xd40\n"
    )
    cpu = read_cpu(info, arch="aarch64")
    assert (cpu.arch, cpu.features, cpu.model) == (
        "aarch64",
        frozenset({"asimd", "asimdhp", "asimddp", "i8mm", "sve"}),
        "0xd40",
    )


def test_an_unreadable_cpuinfo_gives_no_features(tmp_path):
    assert read_cpu(tmp_path / "missing", arch="x86_64").features == frozenset()


@pytest.mark.parametrize(
    ("arch", "features", "words"),
    [
        ("x86_64", AVX2, "AVX2"),
        ("x86_64", AVX512, "AVX-512"),
        ("x86_64", AMX, "AVX-512 and AMX"),
        ("x86_64", {"sse4_2", "avx"}, "AVX"),
        ("x86_64", set(), "x86-64 without AVX"),
        ("aarch64", {"asimd", "asimddp", "i8mm"}, "Armv8 with dotprod, i8mm"),
        ("aarch64", {"asimd"}, "Armv8 (NEON only)"),
    ],
)
def test_level_in_words(arch, features, words):
    assert level(Cpu(arch, frozenset(features))) == words


def _on(flags: list[str]) -> set[str]:
    return {f[len("-DGGML_") : -len("=ON")] for f in flags if f.endswith("=ON")}


@pytest.mark.parametrize(
    ("features", "tag", "on"),
    [
        (AVX2, "sse42-avx-f16c-fma-avx2-bmi2", {"SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2"}),
        # AVX-512 and AMX are never switched on (slower, or SIGILL: docs/llama-server.md)
        (AMX, "sse42-avx-f16c-fma-avx2-bmi2", {"SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2"}),
        (
            AVX2 | {"avx_vnni"},
            "sse42-avx-f16c-fma-avx2-bmi2-avx_vnni",
            {"SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX_VNNI"},
        ),
        ({"sse4_2", "avx"}, "sse42-avx", {"SSE42", "AVX"}),
        ({"sse4_2", "avx", "avx2"}, "sse42-avx", {"SSE42", "AVX"}),  # AVX2 without FMA/F16C
        (set(), "x86-64", set()),
    ],
)
def test_x86_source_flags_switch_on_what_the_cpu_has_and_off_the_rest(features, tag, on):
    got_tag, flags = source_build(Cpu("x86_64", frozenset(features)))
    assert got_tag == tag and _on(flags) == on
    assert "-DGGML_NATIVE=OFF" in flags
    assert {"-DGGML_AVX512=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF"} <= set(flags)
    assert len(flags) == 1 + 7 + 7  # every instruction-set switch set explicitly


@pytest.mark.parametrize(
    ("features", "tag", "arch_flag"),
    [
        (
            {"asimd", "asimddp", "asimdhp", "i8mm", "sve"},
            "armv8.2-a-dotprod-fp16-i8mm",
            "-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16+i8mm",
        ),
        ({"asimd"}, "armv8-a", "-DGGML_CPU_ARM_ARCH=armv8-a"),
    ],
)
def test_arm_source_flags_name_the_architecture(features, tag, arch_flag):
    assert source_build(Cpu("aarch64", frozenset(features))) == (
        tag,
        ["-DGGML_NATIVE=OFF", arch_flag],
    )


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        ((), ""),
        (("avx_vnni",), "AVX-VNNI"),
        (("avx512f", "avx_vnni"), "AVX-512 and AVX-VNNI"),
        (("avx2", "avx512_bf16", "gfni"), "AVX2, AVX-512 BF16 and gfni"),  # unnamed: the flag
    ],
)
def test_feature_names_in_words(flags, words):
    assert feature_names(flags) == words


@pytest.mark.parametrize(
    ("features", "lacks"),
    [
        (AVX2, ["avx512f", "avx_vnni"]),
        (AVX512, ["avx_vnni"]),
        (AVX512 | {"avx_vnni"}, []),
        (set(), []),  # flags unreadable: nothing is known to be missing
    ],
)
def test_lacking_lists_the_flags_the_cpu_does_not_have_in_order(features, lacks):
    assert lacking(Cpu("x86_64", frozenset(features)), ("avx512f", "avx_vnni")) == lacks
