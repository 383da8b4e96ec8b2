"""Run TritonSparseAttn on CPU under ``TRITON_INTERPRET=1`` (a subprocess: the interpreter must be chosen before
triton compiles anything): every quick sparse_attn kit case the triton claims cover (fp8_656 decode past 32
heads is ``mla_fp8_decode``'s, named here as not run), then direct checks of heads, K, empty rows, duplicates,
d_v, the head-split and value-split launch shapes, split-K decode, the few-head decode kernel and the merge of
scaled fp16 partials. One line per check; exit 1 on a miss."""

from __future__ import annotations

import os
import sys

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

from dsa_runtime.backend import Backend  # noqa: E402
from dsa_runtime.capabilities import Capabilities  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.fewhead_plan import FewHeadConfig  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.fewhead_plan import plan_splits as fewhead_splits  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.mla_fp8_decode import merge_slices  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.sparse_attn import (  # noqa: E402
    FEWHEAD_MAX_HEADS,
    SPARSE_ATTN_CLAIMS,
    TritonSparseAttn,
)
from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_combine import combine_splits  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_decode_bf16 import plan_splits  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_decode_fewhead import (  # noqa: E402
    _COUNTERS,
    decode_fewhead,
)
from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_prefill import (  # noqa: E402
    AttnConfig,
    default_config,
    sparse_mla_forward,
)
from dsa_runtime.reference.plugin import reference_backend  # noqa: E402
from dsa_runtime.reference.sparse_attn import ReferenceSparseAttn  # noqa: E402
from dsa_runtime.testing.compare import out_and_lse  # noqa: E402
from dsa_runtime.testing.fp8util import pack_mla_656  # noqa: E402
from dsa_runtime.testing.registry import family_cases  # noqa: E402
from dsa_runtime.testing.runner import RunContext, run_case  # noqa: E402
from dsa_runtime.testing.tolerances import tolerance  # noqa: E402

SCALE = 0.135234
REF = ReferenceSparseAttn()
OUT_TOL, LSE_TOL = tolerance("sparse_attn.out"), tolerance("sparse_attn.lse")


def kit_cases() -> int:
    cpu = torch.device("cpu")
    backend = Backend("triton_interp", Capabilities(devices=frozenset({"cpu"}), methods=SPARSE_ATTN_CLAIMS),
                      {"sparse_attn": TritonSparseAttn})
    ctx = RunContext(backend, reference_backend(), cpu, cpu)
    bad = 0
    for case in family_cases("sparse_attn"):
        if case.tier != "quick":
            continue
        if case.needs.get("kv_layout") == "fp8_656" and case.needs.get("heads", 0) > FEWHEAD_MAX_HEADS:
            print(f"not_run {case.id} (fp8_656 decode past {FEWHEAD_MAX_HEADS} heads is mla_fp8_decode's)")
            continue
        res = run_case(case, ctx)
        print(f"{res.status} {case.id} {res.duration_s:.2f}s {res.message[:300]}")
        bad += res.status != "passed"
    return bad


def _rows(gen: torch.Generator, n: int, poison: bool) -> torch.Tensor:
    kv = torch.randn(n, 576, generator=gen).bfloat16()
    if poison:
        kv[-1] = float("nan")  # where a dereferenced -1 lands; never selected below
    return kv


def check(name: str, got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> int:
    out, lse = got
    msg = None
    if out.shape != want[0].shape or out.dtype != torch.bfloat16 or lse.shape != want[1].shape:
        msg = f"shape/dtype {tuple(out.shape)} {out.dtype} {tuple(lse.shape)} vs {tuple(want[0].shape)}"
    elif not torch.equal(torch.isposinf(lse), torch.isposinf(want[1])):
        msg = "+inf pattern of lse differs"
    elif bool((out[torch.isposinf(want[1])] != 0).any()):
        msg = "an empty query has a non-zero output"
    else:
        msg = out_and_lse(out.float(), lse, want[0].float(), want[1], OUT_TOL, LSE_TOL)
    print(f"{'passed' if msg is None else 'failed'} direct/{name} {msg or ''}")
    return msg is not None


def prefill_checks(gen: torch.Generator) -> int:
    bad = 0
    kern = TritonSparseAttn()
    for heads in (1, 3, 16, 20, 128):
        for k in (64, 50):
            s = 90
            q = torch.randn(2, heads, 576, generator=gen).bfloat16()
            kv = _rows(gen, s, poison=True)
            idx = torch.randint(0, s - 1, (2, k), generator=gen, dtype=torch.int32)
            idx[1, ::3] = -1
            bad += check(f"prefill/h{heads}/k{k}", kern.prefill(q, kv, idx, SCALE), REF.prefill(q, kv, idx, SCALE))
    q = torch.randn(3, 20, 576, generator=gen).bfloat16()
    kv = _rows(gen, 40, poison=True)
    idx = torch.randint(0, 39, (3, 40), generator=gen, dtype=torch.int32)
    empty = idx.clone()
    empty[0] = -1
    empty[2] = -1
    bad += check("prefill/all_minus_one_rows", kern.prefill(q, kv, empty, SCALE), REF.prefill(q, kv, empty, SCALE))
    dup = idx.clone()
    dup[:, 1::2] = dup[:, 0::2]  # every index twice
    dup[1, :8] = 7
    bad += check("prefill/duplicates", kern.prefill(q, kv, dup, SCALE), REF.prefill(q, kv, dup, SCALE))
    bad += check("prefill/d_v256", kern.prefill(q, kv, idx, SCALE, 256), REF.prefill(q, kv, idx, SCALE, 256))
    for cfg in (AttnConfig(block_h=16, block_n=16, block_dv=256, num_warps=4, num_stages=1),
                AttnConfig(block_h=64, block_n=32, block_dv=512, num_warps=8, num_stages=2),  # the GPU default
                AttnConfig(block_h=32, block_n=64, block_dv=128, num_warps=4, num_stages=1),
                AttnConfig(64, 32, 512, 8, 2, "plain"), AttnConfig(64, 16, 256, 8, 3, "pipe"),
                AttnConfig(16, 32, 512, 4, 3, "pipe"), AttnConfig(64, 32, 512, 8, 4, "pipew")):
        bad += check(f"prefill/config_{cfg.label()}", TritonSparseAttn(cfg).prefill(q, kv, idx, SCALE),
                     REF.prefill(q, kv, idx, SCALE))
    # The pipe kernel's value halves: d_v below one half, between halves, and with duplicates and empty rows.
    for cfg in (AttnConfig(32, 16, 512, 4, 1, "pipe"), AttnConfig(16, 16, 256, 4, 1, "pipe"),
                AttnConfig(32, 16, 512, 4, 1, "pipew")):
        for d_v in (200, 384):
            bad += check(f"prefill/pipe_{cfg.label()}_d_v{d_v}", TritonSparseAttn(cfg).prefill(q, kv, dup, SCALE, d_v),
                         REF.prefill(q, kv, dup, SCALE, d_v))
        bad += check(f"prefill/pipe_{cfg.label()}_empty_rows", TritonSparseAttn(cfg).prefill(q, kv, empty, SCALE),
                     REF.prefill(q, kv, empty, SCALE))
    q32, kv32 = q.float(), kv.float()
    bad += check("prefill/fp32_inputs", kern.prefill(q32, kv32, idx, SCALE), REF.prefill(q32, kv32, idx, SCALE))
    none = torch.empty(3, 0, dtype=torch.int32)
    bad += check("prefill/k0", kern.prefill(q, kv, none, SCALE), REF.prefill(q, kv, none, SCALE))
    return bad


def decode_checks(gen: torch.Generator) -> int:
    bad = 0
    pages, page = 12, 16
    cache = torch.randn(pages, page, 576, generator=gen).bfloat16()
    cache[0, 0] = float("nan")
    cache[-1, -1] = float("nan")
    q = torch.randn(2, 2, 20, 576, generator=gen).bfloat16()
    idx = torch.randint(1, pages * page - 1, (2, 2, 300), generator=gen, dtype=torch.int32)
    idx[0, 1, 150:] = -1  # later splits of this row see nothing
    idx[1, 0] = -1  # an empty query: every split empty
    want = REF.decode(q, cache, idx, SCALE, layout="bf16")
    one = TritonSparseAttn(decode_splits=1).decode(q, cache, idx, SCALE, layout="bf16")
    bad += check("decode/unsplit", one, want)
    for n in (2, 3, 5):
        got = TritonSparseAttn(decode_splits=n).decode(q, cache, idx, SCALE, layout="bf16")
        bad += check(f"decode/splits{n}", got, want)
        if not torch.equal(torch.isposinf(got[1]), torch.isposinf(one[1])) or not torch.allclose(
            got[0].float(), one[0].float(), atol=2e-2, rtol=2e-2
        ) or not torch.allclose(got[1][~torch.isposinf(one[1])], one[1][~torch.isposinf(one[1])], rtol=1e-5):
            print(f"failed direct/decode/splits{n}_vs_unsplit")
            bad += 1
        else:
            print(f"passed direct/decode/splits{n}_vs_unsplit")
    for cfg in (AttnConfig(32, 32, 512, 4, 1, "pipe"), AttnConfig(16, 64, 256, 4, 1, "pipe"),
                AttnConfig(32, 32, 512, 4, 1, "pipew"),
                AttnConfig(32, 32, 512, 4, 1, "plain")):
        for n in (1, 3):
            bad += check(f"decode/{cfg.label()}_splits{n}",
                         TritonSparseAttn(cfg, decode_splits=n).decode(q, cache, idx, SCALE, layout="bf16"), want)
    flat_q, flat_idx = q.reshape(4, 20, 576), idx.reshape(4, 300)
    part = sparse_mla_forward(flat_q, cache.view(-1, 576), flat_idx, SCALE, num_splits=3)
    for block in (1, 4):  # the GPU's per-(row, head) programs and a partial last head block (80 = 20 x 4)
        out, lse = combine_splits(*part, block_hc=block)
        bad += check(f"decode/combine_block{block}", (out.view(2, 2, 20, 512), lse.view(2, 2, 20)), want)
    planned = TritonSparseAttn().decode(q, cache, idx, SCALE, layout="bf16")
    n_auto = plan_splits(4, 20, 300, 132, default_config(20, torch.bfloat16))
    bad += check(f"decode/planned_splits{n_auto}", planned, want)
    ok = n_auto > 1 and plan_splits(132 * 8, 128, 2048, 132, default_config(128, torch.bfloat16)) == 1
    print(f"{'passed' if ok else 'failed'} direct/decode/plan_splits ({n_auto} splits for 4 rows)")
    bad += not ok
    try:
        TritonSparseAttn().decode(q, cache, idx, SCALE, layout="fp9")
        print("failed direct/decode/bad_layout no error")
        bad += 1
    except ValueError:
        print("passed direct/decode/bad_layout")
    return bad


def fewhead_checks(gen: torch.Generator) -> int:
    """decode_fewhead on both layouts: one slice, slices merged in the launch (tickets) or by a second launch,
    short slices, d_v, a query whose later slices are empty, an empty query, the planner, the counters left zero."""
    bad = 0
    pages, page = 12, 16
    rows = torch.randn(pages * page, 576, generator=gen).bfloat16()
    caches = {"bf16": rows.clone(), "fp8_656": pack_mla_656(rows[:, :512], rows[:, 512:], "ue8m0")}
    caches["bf16"][0] = float("nan")  # slot 0 is never selected: a dereferenced -1 would read a poisoned row
    caches["fp8_656"][0, :512] = 0x7F  # e4m3 NaN
    # Two rows of two (MTP) queries: the interpreter's time grows with the queries.
    idx = torch.randint(1, pages * page, (2, 2, 200), generator=gen, dtype=torch.int32)
    idx[0, 1, 70:] = -1  # later slices of this query see nothing
    idx[1, 0] = -1  # an empty query: every slice empty
    configs = (FewHeadConfig(splits=1), FewHeadConfig(splits=3), FewHeadConfig(splits=3, fused=True),
               FewHeadConfig(block_n=16, splits=5), FewHeadConfig(64, 4, 2, splits=3, fused=True),
               FewHeadConfig(variant="fold", splits=1), FewHeadConfig(variant="fold", block_n=16, splits=4, fused=True))
    # Every config on both layouts at one of 8 / 32 heads (alternating), and the three-slice configs once more at
    # 20 and 64 heads on one layout each: every config, layout and head count, in half the interpreter's time of
    # the full cross product (the GPU kit runs the rest).
    runs = [(cfg, layout, (8, 32)[i % 2]) for i, cfg in enumerate(configs) for layout in caches]
    runs += [(cfg, tuple(caches)[j % 2], heads) for j, (cfg, heads) in
             enumerate((cfg, heads) for heads in (20, 64) for cfg in configs if cfg.splits == 3)]
    qs = {heads: torch.randn(2, 2, heads, 576, generator=gen).bfloat16() for heads in (8, 20, 32, 64)}
    for cfg, layout, heads in runs:
        cache = caches[layout].view(pages, page, -1)
        want = REF.decode(qs[heads], cache, idx, SCALE, layout=layout)
        got = decode_fewhead(qs[heads], cache, idx, SCALE, layout=layout, config=cfg)
        bad += check(f"fewhead/{layout}/h{heads}/{cfg.label}", got, want)
    q = torch.randn(2, 2, 16, 576, generator=gen).bfloat16()
    for layout, flat in caches.items():
        cache = flat.view(pages, page, -1)
        for variant in ("cols", "fold"):
            bad += check(f"fewhead/{layout}/{variant}/d_v200",
                         decode_fewhead(q, cache, idx, SCALE, 200, layout=layout,
                                        config=FewHeadConfig(variant=variant)),
                         REF.decode(q, cache, idx, SCALE, layout=layout, d_v=200))
    big = q * 2.0**18  # past fp16's range: fold divides each head by a power of two, then scales its scores back
    tiny = SCALE * 2.0**-18  # (a scale that keeps the softmax as well conditioned as at q's own size)
    for layout, flat in caches.items():
        cache = flat.view(pages, page, -1)
        bad += check(f"fewhead/{layout}/fold_q_past_fp16",
                     decode_fewhead(big, cache, idx, tiny, layout=layout, config=FewHeadConfig(variant="fold")),
                     REF.decode(big, cache, idx, tiny, layout=layout))
    zero = all(int(c.abs().sum()) == 0 for c in _COUNTERS.values())
    plan = (fewhead_splits(64, 2048, 132, 2), fewhead_splits(1, 2048, 132, 2), fewhead_splits(4096, 2048, 132, 2),
            fewhead_splits(64, 100, 132, 2), fewhead_splits(64, 2048, 132, 3))
    ok = zero and bool(_COUNTERS) and plan == (4, 16, 1, 1, 6)
    print(f"{'passed' if ok else 'failed'} direct/fewhead/counters_zero_and_plan ({zero}, {plan})")
    bad += not ok
    return bad


def merge_checks(gen: torch.Generator) -> int:
    """merge_slices with fp16 partials stored divided by a per-slice, per-128-column-block scale (the CUDA few-head
    kernel's partials) against the same partials multiplied back and merged unscaled; a bad scale shape refused."""
    mq, splits, heads = 3, 4, 5
    block_sizes = torch.tensor([1.0, 30.0, 0.01, 400.0]).repeat_interleave(128)  # column blocks of unlike magnitude
    part = torch.randn(mq, splits, heads, 512, generator=gen) * block_sizes
    scale = torch.rand(mq, splits, 4, generator=gen) * 50 + 0.01
    scale[0, 1] = 0.0  # a slice whose blocks saw no scaled rows: the kernel stores zeros there
    part[0, 1] = 0.0
    plse = torch.randn(mq, splits, heads, generator=gen) * 4
    plse[1, 2] = float("-inf")  # an empty slice
    plse[2] = float("-inf")  # a query with no valid slot
    stored = (part / scale.clamp_min(1e-30).repeat_interleave(128, dim=-1)[:, :, None]).half()
    assert torch.isfinite(stored).all()
    back = stored.float() * scale.repeat_interleave(128, dim=-1)[:, :, None]
    outs = []
    for p, sc in ((stored, scale), (back, None)):
        out = torch.full((mq, heads, 512), float("nan")).bfloat16()
        lse = torch.full((mq, heads), float("nan"))
        merge_slices(p, plse, out, lse, 512, part_scale=sc)
        outs.append((out, lse))
    (out_s, lse_s), (out_r, lse_r) = outs
    ok = torch.equal(lse_s, lse_r) and bool(torch.isinf(lse_s[2]).all()) and torch.allclose(
        out_s.float(), out_r.float(), rtol=1e-2, atol=1e-3) and not torch.isnan(out_s.float()).any()
    print(f"{'passed' if ok else 'failed'} direct/merge/fp16_scaled_partials")
    bad = not ok
    try:
        merge_slices(stored, plse, out_s, lse_s, 512, part_scale=scale[:, :, :2])
        print("failed direct/merge/bad_scale_shape no error")
        bad += 1
    except ValueError:
        print("passed direct/merge/bad_scale_shape")
    return bad


def main() -> int:
    bad = kit_cases()
    gen = torch.Generator().manual_seed(7)
    bad += prefill_checks(gen)
    bad += decode_checks(gen)
    bad += fewhead_checks(gen)
    bad += merge_checks(gen)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
