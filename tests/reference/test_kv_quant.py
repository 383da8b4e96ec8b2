"""KV cache layouts: 656-byte FP8 MLA rows, bf16 rows, and the 132-byte index-K pages, checked byte by byte."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from dsa_runtime.reference.kv_quant import ReferenceKVQuant

from . import oracle64 as o

KV = ReferenceKVQuant()
POISON = 0xA5


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _mla_inputs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    c = (torch.randn(n, 512, generator=g) * torch.logspace(-3, 2, n)[:, None]).bfloat16()
    k_pe = torch.randn(n, 64, generator=g).bfloat16()
    if n > 2:
        c[1, 128:256] = 0  # an all-zero tile: floored scale
        c[2, 0] = 448.0  # exactly the e4m3 max at scale 1 (ue8m0)
    return c, k_pe


def test_656_rows_are_byte_exact():
    fmt = "ue8m0"  # the fp8_656 cache always holds power-of-two scales
    c, k_pe = _mla_inputs(7, 0)
    rows = KV.quantize_mla(c, k_pe, layout="fp8_656")
    assert rows.shape == (7, 656) and rows.dtype == torch.uint8
    for i in range(7):
        got = rows[i].numpy().tobytes()
        assert got == o.encode_656(c[i], k_pe[i], fmt)
        # Scales decoded by hand at byte offset 512: four little-endian fp32, tile j covers c[128j:128j+128].
        scales = struct.unpack("<4f", got[512:528])
        for j in range(4):
            assert scales[j] == o.scale_of(c[i, 128 * j : 128 * j + 128].abs().max().item(), fmt)
        assert all(s > 0 and s == 2.0 ** round(np.log2(s)) for s in scales)
        # k_pe is kept verbatim as bf16 at bytes 528..655.
        assert (
            np.frombuffer(got[528:], dtype="<u2").tolist()
            == k_pe[i].view(torch.int16).numpy().astype(np.uint16).tolist()
        )
    # Row 2 holds 448 in tile 0 and smaller values elsewhere: amax 448 gives scale 1 in both formats.
    assert struct.unpack("<f", rows[2].numpy().tobytes()[512:516])[0] == 1.0


def test_656_dequantize_matches_decoder():
    c, k_pe = _mla_inputs(5, 1)
    rows = KV.quantize_mla(c, k_pe, layout="fp8_656")
    back = KV.dequantize_mla(rows, layout="fp8_656")
    assert back.shape == (5, 576) and back.dtype == torch.bfloat16
    want = torch.stack([o.decode_656(rows[i].numpy().tobytes()) for i in range(5)])
    assert torch.equal(back, want.bfloat16())  # one rounding of the exact dequantized value
    assert torch.equal(back[:, 512:], k_pe)
    # Dequantized c is close to the input: e4m3 keeps 3 mantissa bits.
    err = (back[:, :512].double() - c.double()).abs()
    tile_scale = want[:, :512].abs().amax(dim=1, keepdim=True) / 448
    assert bool((err <= c.double().abs() / 15 + tile_scale).all())


def test_bf16_layout_round_trip():
    c, k_pe = _mla_inputs(4, 2)
    rows = KV.quantize_mla(c, k_pe, layout="bf16")
    assert rows.shape == (4, 576) and rows.dtype == torch.bfloat16
    assert torch.equal(rows, torch.cat([c, k_pe], 1))
    assert torch.equal(KV.dequantize_mla(rows, layout="bf16"), rows)


@pytest.mark.parametrize(
    ("layout", "page_size"), [("fp8_656", 64), ("fp8_656", 16), ("bf16", 64), ("bf16", 3)]
)
def test_store_mla_skips_padding_and_leaves_neighbours(layout, page_size):
    width, dtype = (656, torch.uint8) if layout == "fp8_656" else (576, torch.bfloat16)
    pages = 3
    if dtype == torch.uint8:
        cache = torch.full((pages, page_size, width), POISON, dtype=dtype)
    else:
        cache = torch.full((pages, page_size, width), -7.25, dtype=dtype)
    before = cache.clone()
    c, k_pe = _mla_inputs(5, 3)
    slots = torch.tensor([page_size + 1, -1, 0, 2 * page_size + page_size - 1, -1], dtype=torch.int32)
    KV.store_mla(cache, slots, c, k_pe, layout=layout)
    rows = KV.quantize_mla(c, k_pe, layout=layout)
    written = set()
    for i, slot in enumerate(slots.tolist()):
        if slot == -1:
            continue
        page, off = divmod(slot, page_size)
        assert torch.equal(cache[page, off], rows[i])
        written.add((page, off))
    for page in range(pages):
        for off in range(page_size):
            if (page, off) not in written:
                assert torch.equal(cache[page, off], before[page, off]), (page, off)


def test_store_mla_rejects_wrong_cache():
    c, k_pe = _mla_inputs(1, 4)
    with pytest.raises(ValueError):
        KV.store_mla(
            torch.zeros(1, 4, 576, dtype=torch.bfloat16), torch.tensor([0]), c, k_pe, layout="fp8_656"
        )


def _index_k_inputs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    k8 = (torch.randn(n, 128, generator=g) * 50).clamp(-448, 448).to(torch.float8_e4m3fn)
    k_scale = torch.rand(n, generator=g) * 1e-2 + 1e-6
    return k8, k_scale


@pytest.mark.parametrize("page_size", [64, 16, 5])
def test_index_k_store_and_gather_bytes(page_size):
    pages = 4
    cache = torch.full((pages, page_size * 132), POISON, dtype=torch.uint8)
    k8, k_scale = _index_k_inputs(6, page_size)
    slots = torch.tensor([0, -1, page_size - 1, 3 * page_size + 2, -1, 2 * page_size], dtype=torch.int64)
    KV.store_index_k(cache, slots, k8, k_scale)
    want = np.full((pages, page_size * 132), POISON, dtype=np.uint8)
    o.store_index_k(want, slots.tolist(), k8.view(torch.uint8).numpy(), k_scale.tolist())
    assert np.array_equal(cache.numpy(), want)  # every byte, including the untouched poison
    # Read back by explicit offsets: the scale of slot 3*P+2 sits after the P*128 key bytes of page 3.
    _, _, so = o.index_k_offsets(3 * page_size + 2, page_size)
    assert struct.unpack("<f", cache[3, so : so + 4].numpy().tobytes())[0] == k_scale[3].item()
    valid = slots >= 0
    g8, gs = KV.gather_index_k(cache, slots[valid])
    assert g8.dtype == torch.float8_e4m3fn and gs.dtype == torch.float32
    assert torch.equal(g8.view(torch.uint8), k8[valid].view(torch.uint8))
    assert torch.equal(gs, k_scale[valid])


def test_gather_index_k_rejects_padding():
    with pytest.raises(ValueError):
        KV.gather_index_k(torch.zeros(1, 64 * 132, dtype=torch.uint8), torch.tensor([-1]))


def test_656_scale_rule_is_not_a_parameter():
    """The checkpoint's scale_fmt no longer selects the cache's scale rule: the kwarg is gone."""
    c, k_pe = _mla_inputs(2, 3)
    with pytest.raises(TypeError):
        KV.quantize_mla(c, k_pe, layout="fp8_656", scale_fmt="float")
