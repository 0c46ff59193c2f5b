"""A slow model with the default model's answers: SmolLM2 with its blocks repeated K times.

    .venv/bin/python scripts/slow_model.py               # K = 8; prints the GGUF's path
    .venv/bin/python scripts/slow_model.py --blocks 2 8  # one path a line
    .venv/bin/python scripts/slow_model.py --no-zero     # the garbage variant

Layer ``i`` of the new model (``llama.block_count`` x K layers) is block ``i mod n`` of
the source's ``n``: the source's whole stack, then K - 1 more passes over it. The first
pass is the source's blocks byte for byte; in every added copy the tensors that write
into the residual stream (``attn_output.*``, ``ffn_down.*``) are zero bytes, and a
quantised block of zero bytes dequantises to 0 (its scale is 0), so an added block adds
exactly nothing while costing a real block's compute: the log-probabilities equal the
source's (docs/slow-model.md). ``--no-zero`` keeps the copies whole: its answers are
garbage, its labels hold little of the mass, which is what tests of widening reads want.
Metadata is copied key for key; the block count, and any per-layer array under the
architecture's prefix, follow the new layers.

Cached under ``$SEMIF_CACHE/models/`` (scripts/fetch.py), keyed by K, the variant and
the source file's sha256; written to a ``.part`` and renamed, one process at a time.
Progress goes to stderr, the path to stdout. Needs the ``gguf`` package (llama.cpp's
own, in requirements/dev.lock): run it with the project's venv.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gguf  # noqa: E402

from scripts.fetch import cache_root, ensure_model, file_sha256, locked, say  # noqa: E402

__all__ = ["ZEROED", "Layer", "ensure_slow_model", "layers", "slow_model_path", "write_slow_model"]

# The tensors of a block that add to the residual stream: zero in an added copy.
ZEROED = ("attn_output.", "ffn_down.")
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")


@dataclass(frozen=True)
class Layer:
    """One layer of the new model: which source block it copies and whether it is the original."""

    index: int
    source: int
    original: bool


def layers(n_blocks: int, k: int) -> list[Layer]:
    """Layer ``i`` copies block ``i mod n``; the first ``n`` layers are the originals, in order."""
    return [Layer(i, i % n_blocks, i < n_blocks) for i in range(n_blocks * k)]


def slow_model_path(source_sha256: str, k: int, *, zero: bool = True) -> Path:
    variant = "" if zero else "-nozero"
    return cache_root() / "models" / f"slow-k{k}{variant}-{source_sha256[:12]}.gguf"


def ensure_slow_model(k: int, *, zero: bool = True, source: Path | None = None) -> Path:
    """The slow model for ``k`` (default source: the default model), made once and cached."""
    source = source or ensure_model()
    target = slow_model_path(file_sha256(source), k, zero=zero)
    with locked(target.name):
        if not target.exists():
            part = target.with_name(target.name + ".part")
            part.unlink(missing_ok=True)
            write_slow_model(source, part, k, zero=zero)
            part.rename(target)
    return target


def _field_value(field: Any) -> tuple[Any, Any, Any]:
    """A reader field as (value, type, array sub-type), as GGUFWriter.add_key_value takes it."""
    kind = field.types[0]
    sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
    return field.contents(), kind, sub


def write_slow_model(source: Path, dest: Path, k: int, *, zero: bool = True) -> None:
    """Write ``source`` with its blocks repeated ``k`` times to ``dest`` (see the module doc).

    Tensors are streamed from the source's memory map: only one zeroed tensor at a time
    is held in memory."""
    if k < 1:
        raise ValueError(f"K must be at least 1, not {k}")
    reader = gguf.GGUFReader(source)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    count_key = gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)
    n_blocks = int(reader.get_field(count_key).contents())
    plan = layers(n_blocks, k)

    writer = gguf.GGUFWriter(dest, arch=arch, endianess=reader.endianess)
    alignment = reader.get_field(gguf.Keys.General.ALIGNMENT)
    if alignment is not None:
        writer.data_alignment = int(alignment.contents())
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # the writer's own
        value, kind, sub = _field_value(field)
        if field.name == count_key:
            value = n_blocks * k
        elif field.name.startswith(f"{arch}.") and sub is not None and len(value) == n_blocks:
            value = [value[layer.source] for layer in plan]  # a per-layer array
        writer.add_key_value(field.name, value, kind, sub_type=sub)

    blocks: dict[int, list[tuple[str, Any]]] = {n: [] for n in range(n_blocks)}
    rest = []
    for tensor in reader.tensors:
        if m := _BLOCK.fullmatch(tensor.name):
            blocks[int(m[1])].append((m[2], tensor))
        else:
            rest.append((tensor.name, tensor, False))
    out = rest + [
        (f"blk.{layer.index}.{suffix}", tensor, zero and not layer.original and _zeroed(suffix))
        for layer in plan
        for suffix, tensor in blocks[layer.source]
    ]
    for name, tensor, _ in out:
        data = tensor.data
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, tensor.tensor_type)

    total = sum(tensor.n_bytes for _, tensor, _ in out)
    variant = "zeroed copies" if zero else "whole copies, no zeroing"
    say(f"writing {dest.name}: {n_blocks} blocks x {k} ({variant}), {total / 1e6:.0f} MB")
    started = last = time.monotonic()
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    done = 0
    for _, tensor, zeroed in out:
        writer.write_tensor_data(
            np.zeros_like(tensor.data) if zeroed else tensor.data,
            tensor_endianess=reader.endianess,
        )
        done += tensor.n_bytes
        if time.monotonic() - last > 1.0 or done == total:
            last = time.monotonic()
            print(f"\r[prepare]   {done / 1e6:7.1f} MB", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    writer.close()
    say(f"  written in {time.monotonic() - started:.1f}s")


def _zeroed(suffix: str) -> bool:
    return suffix.startswith(ZEROED)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--blocks",
        type=int,
        nargs="+",
        default=[8],
        metavar="K",
        help="how many times each block runs (default 8); several K make several models",
    )
    parser.add_argument(
        "--no-zero",
        action="store_true",
        help="keep the added copies whole: garbage answers (for tests of widening reads)",
    )
    parser.add_argument(
        "--source", type=Path, help="the GGUF to repeat (default: the default model)"
    )
    args = parser.parse_args(argv)
    for k in args.blocks:
        print(ensure_slow_model(k, zero=not args.no_zero, source=args.source))
    return 0


if __name__ == "__main__":
    sys.exit(main())
