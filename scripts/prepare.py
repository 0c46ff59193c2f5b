"""Everything the sidecar needs to run, fetched once: the model and a llama-server that runs here.

    python scripts/prepare.py model                 # prints the GGUF path
    python scripts/prepare.py llama-server          # chooses (or recalls) a build; prints its path
    python scripts/prepare.py llama-server --json   # the whole choice: build, flags, prompt rate
    python scripts/prepare.py llama-server --reprobe   # forget the cached choice, try again
    python scripts/prepare.py llama-server --source    # the b11434 source build for this CPU
    python scripts/prepare.py browser               # Debian's chromium, for the playground test

Which build is chosen, and why, is ``choose.py``'s docstring. Environment:
``GPU=1`` chooses a GPU-capable build that offloads the model; ``LLAMA_BUILD``
(e.g. ``source,portable``) names the candidates to try, in order; ``SEMIF_CACHE``
moves the cache (default ``~/.cache/semif-sidecar``). Progress goes to stderr;
the one answer asked for goes to stdout. Standard library only: this runs
before any virtual environment exists.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.choose import Choice, NoBuildRuns, candidates, choose  # noqa: E402
from scripts.cpu import read_cpu, source_build  # noqa: E402
from scripts.fetch import cache_root, ensure_model, say, source_binary  # noqa: E402

__all__ = [
    "BROWSER",
    "cache_root",
    "choose_llama_server",
    "ensure_browser",
    "ensure_llama_server",
    "ensure_model",
    "gpu_requested",
]

BROWSER = "chromium"  # Debian's package and command (browser downloads from elsewhere fail)


def ensure_browser() -> Path:
    """Debian's headless-capable ``chromium``, installed with apt-get when missing (as root,
    or through sudo); the tests that drive a real browser need it and never skip."""
    found = shutil.which(BROWSER)
    if found:
        return Path(found)
    if not shutil.which("apt-get"):
        raise NoBuildRuns(
            f"the browser test needs {BROWSER}: install it with your package "
            "manager (this is not a Debian-like system)"
        )
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]  # never a password prompt
    if sudo and not shutil.which("sudo"):
        raise NoBuildRuns(
            f"the browser test needs {BROWSER}: run `apt-get install -y {BROWSER}` as root"
        )
    say(f"installing {BROWSER} with apt-get (about 400 MB, once)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", BROWSER],
    ):
        if subprocess.run([*sudo, *command], env=env).returncode != 0:
            raise NoBuildRuns(f"`{' '.join(command)}` failed: install {BROWSER} yourself")
    found = shutil.which(BROWSER)
    if not found:
        raise NoBuildRuns(f"apt-get installed {BROWSER} but it is not on PATH")
    return Path(found)


def gpu_requested(env: dict[str, str] | os._Environ = os.environ) -> bool:
    return (env.get("GPU") or "").strip().lower() in ("1", "true", "yes", "on")


def choose_llama_server(
    *,
    gpu: bool | None = None,
    reprobe: bool = False,
    model: Path | None = None,
    env: dict[str, str] | os._Environ = os.environ,
) -> Choice:
    """The llama-server build to run on this machine with ``model`` (default: ``MODEL``,
    else SmolLM2), probed on that model and cached (see choose.py)."""
    gpu = gpu_requested(env) if gpu is None else gpu
    cpu = read_cpu()
    order = [n.strip() for n in (env.get("LLAMA_BUILD") or "").split(",") if n.strip()]
    cands = candidates(cpu, gpu=gpu, order=order or None, nvcc=shutil.which("nvcc"))
    model = model or Path(env.get("MODEL") or ensure_model())
    return choose(cpu, model, cands, gpu=gpu, reprobe=reprobe)


def ensure_llama_server(source: bool = False) -> Path:
    """The path of the chosen llama-server; ``source``: the b11434 source build for this CPU."""
    if source:
        return source_binary(*source_build(read_cpu()))
    return Path(choose_llama_server().binary)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["model", "llama-server", "browser", "all"])
    parser.add_argument(
        "--source",
        action="store_true",
        help="the llama.cpp b11434 source build for this CPU (no probe)",
    )
    parser.add_argument("--reprobe", action="store_true", help="ignore the cached choice")
    parser.add_argument("--json", action="store_true", help="print the whole choice as JSON")
    args = parser.parse_args(argv)
    started = time.monotonic()
    out = ""
    try:
        if args.what == "browser":
            out = str(ensure_browser())
        if args.what in ("model", "all"):
            out = str(ensure_model())
        if args.what in ("llama-server", "all"):
            if args.source:
                out = str(ensure_llama_server(source=True))
            else:
                choice = choose_llama_server(reprobe=args.reprobe)
                say(f"llama-server: {choice.summary()}")
                out = json.dumps(asdict(choice), indent=2) if args.json else choice.binary
    except NoBuildRuns as err:
        print(f"[prepare] {err}", file=sys.stderr)
        return 1
    spent = time.monotonic() - started
    if spent > 2:
        say(f"ready in {spent:.0f}s (cached under {cache_root()})")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
