"""scripts/slow_model.py's transform on a small GGUF made here: the blocks repeated K times,
the originals first and byte for byte, the added copies' output projections zero bytes
(``--no-zero``: whole), every other key and tensor as it was."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from scripts.slow_model import ZEROED, Layer, layers, write_slow_model

N_BLOCKS = 3
HEADS = [4, 2, 1]  # a per-layer array: it follows the layers
Q4_1 = gguf.GGMLQuantizationType.Q4_1


@pytest.mark.parametrize(
    ("n", "k", "expected"),
    [
        (3, 1, [(0, 0, True), (1, 1, True), (2, 2, True)]),
        (2, 2, [(0, 0, True), (1, 1, True), (2, 0, False), (3, 1, False)]),
        (1, 3, [(0, 0, True), (1, 0, False), (2, 0, False)]),
    ],
)
def test_layers_are_the_stack_then_its_copies(n, k, expected):
    assert layers(n, k) == [Layer(*row) for row in expected]


def _tiny_gguf(path: Path) -> None:
    rng = np.random.default_rng(7)
    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_block_count(N_BLOCKS)
    writer.add_head_count(HEADS)
    writer.add_context_length(64)
    writer.add_name("tiny")
    writer.add_token_list(["a", "b", "c"])
    writer.add_tensor("token_embd.weight", rng.standard_normal((3, 64), dtype=np.float32))
    for n in range(N_BLOCKS):
        writer.add_tensor(f"blk.{n}.attn_norm.weight", rng.standard_normal(64, dtype=np.float32))
        for name in ("attn_q", "attn_output", "ffn_up", "ffn_down"):
            # 64 x 64 in Q4_1: 2 blocks of 20 bytes a row
            raw = rng.integers(0, 256, (64, 40), dtype=np.uint8)
            writer.add_tensor(f"blk.{n}.{name}.weight", raw, raw_dtype=Q4_1)
    writer.add_tensor("output_norm.weight", rng.standard_normal(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def assert_slow_copy(source: gguf.GGUFReader, slow: gguf.GGUFReader, k: int, zero: bool) -> None:
    """``slow`` is ``source`` with its blocks repeated ``k`` times (scripts/slow_model.py)."""
    n = int(source.get_field("llama.block_count").contents())
    assert slow.get_field("llama.block_count").contents() == n * k
    keys = [key for key in source.fields if not key.startswith("GGUF.")]
    assert [key for key in slow.fields if not key.startswith("GGUF.")] == keys
    for key in keys:
        if key == "llama.block_count":
            continue
        before, after = source.fields[key].contents(), slow.fields[key].contents()
        if isinstance(before, list) and key.startswith("llama.") and len(before) == n:
            before = before * k
        assert after == before, key

    tensors = {t.name: t for t in source.tensors}
    copies = {t.name: t for t in slow.tensors}
    names = {name for name in tensors if not name.startswith("blk.")}
    for layer in layers(n, k):
        for name in (name for name in tensors if name.startswith(f"blk.{layer.source}.")):
            suffix = name.split(".", 2)[2]
            names.add(f"blk.{layer.index}.{suffix}")
            was, now = tensors[name], copies[f"blk.{layer.index}.{suffix}"]
            assert (now.tensor_type, list(now.shape)) == (was.tensor_type, list(was.shape))
            if zero and not layer.original and suffix.startswith(ZEROED):
                assert not now.data.view(np.uint8).any(), now.name
            else:
                assert now.data.tobytes() == was.data.tobytes(), now.name
    assert set(copies) == names
    for name in (name for name in tensors if not name.startswith("blk.")):
        assert copies[name].data.tobytes() == tensors[name].data.tobytes(), name


@pytest.mark.parametrize(("k", "zero"), [(1, True), (2, True), (3, True), (3, False)])
def test_the_blocks_repeat_and_only_added_copies_are_zeroed(tmp_path, k, zero):
    _tiny_gguf(tmp_path / "tiny.gguf")
    write_slow_model(tmp_path / "tiny.gguf", tmp_path / "slow.gguf", k, zero=zero)
    source, slow = gguf.GGUFReader(tmp_path / "tiny.gguf"), gguf.GGUFReader(tmp_path / "slow.gguf")
    assert slow.get_field("llama.attention.head_count").contents() == HEADS * k
    assert_slow_copy(source, slow, k, zero)
    zeroed = sum(not t.data.view(np.uint8).any() for t in slow.tensors)
    assert zeroed == (2 * N_BLOCKS * (k - 1) if zero else 0)  # attn_output, ffn_down


def test_k_below_one_is_refused(tmp_path):
    _tiny_gguf(tmp_path / "tiny.gguf")
    with pytest.raises(ValueError, match="at least 1"):
        write_slow_model(tmp_path / "tiny.gguf", tmp_path / "slow.gguf", 0)
