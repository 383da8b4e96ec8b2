"""The static setmaxnreg check on hand-written CUDA in the shape TileLang generates (no tilelang, no GPU).

The first ws schedule asked ``setmaxnreg.inc 160`` in a warpgroup that launched with 168 registers and died on an
H200 with an illegal instruction; every rule of the check is exercised by one broken kernel here."""

from __future__ import annotations

import pytest

from dsa_runtime.plugins.cuda_hopper.tilelang.setmaxnreg_check import default_launch_regs, setmaxnreg_problems


def kernel(threads: int, score: str, value: str, gather: str, split: int = 128) -> str:
    """A three-way warp-specialised kernel body as TileLang writes it (if / else if as nested else blocks)."""
    return f"""
extern "C" __global__ void __launch_bounds__({threads}, 1) k(float* x) {{
  float acc[4];
  if (((int)threadIdx.x) < {split}) {{
    {score}
    for (int i = 0; i < 4; ++i) {{
      acc[i] = 0.f;
    }}
  }} else {{
    if (((int)threadIdx.x) < 256) {{
      {value}
    }} else {{
      {gather}
    }}
  }}
}}
"""


INC240, INC160, INC168, DEC56 = ("tl::warpgroup_reg_alloc<240>();", "tl::warpgroup_reg_alloc<160>();",
                                 "tl::warpgroup_reg_alloc<168>();", "tl::warpgroup_reg_dealloc<56>();")


def test_launch_counts():
    assert default_launch_regs(384) == 168 and default_launch_regs(512) == 128 and default_launch_regs(256) == 256


@pytest.mark.parametrize("value", ["", INC168])
def test_the_fixed_ws_split_passes(value):
    assert setmaxnreg_problems(kernel(384, INC240, value, DEC56)) == []


def test_no_setmaxnreg_no_problem():
    assert setmaxnreg_problems(kernel(384, "", "", "")) == []


def test_inc_below_the_launch_count_is_the_h200_illegal_instruction():
    problems = setmaxnreg_problems(kernel(384, INC240, INC160, DEC56))
    assert len(problems) == 1 and "inc 160" in problems[0] and "launch count 168" in problems[0]


def test_ptxas_count_overrides_the_default():
    # ptxas said 160 (not the default 168): inc 160 is then legal, and the pool is 160 * 384.
    assert setmaxnreg_problems(kernel(384, INC240, INC160, DEC56), launch_regs=160) == []
    problems = setmaxnreg_problems(kernel(384, INC240, INC168, DEC56), launch_regs=152)
    assert any("registers, the launch pool holds" in p for p in problems)


def test_dec_above_the_launch_count():
    problems = setmaxnreg_problems(kernel(512, "", "", "tl::warpgroup_reg_dealloc<136>();"))
    assert any("dec above the launch count 128" in p for p in problems)


def test_oversubscribed_pool_deadlocks():
    both = "tl::warpgroup_reg_alloc<232>();"
    problems = setmaxnreg_problems(kernel(384, both, both, "tl::warpgroup_reg_dealloc<80>();"))
    assert any("need 69632 registers" in p for p in problems)


def test_partial_warpgroup_is_refused():
    problems = setmaxnreg_problems(kernel(384, INC240, "", DEC56, split=96))
    assert any("threads 0-95" in p and "whole warpgroups" in p for p in problems)


def test_setmaxnreg_in_a_loop_or_under_data_is_refused():
    looped = kernel(384, "for (int r = 0; r < 2; ++r) {\n" + INC240 + "\n}", "", DEC56)
    assert any("loop or under a data-dependent condition" in p for p in setmaxnreg_problems(looped))
    data = kernel(384, "if (x[0] > 0.f) {\n" + INC240 + "\n}", "", DEC56)
    assert any("loop or under a data-dependent condition" in p for p in setmaxnreg_problems(data))


def test_bad_counts_and_missing_launch_bounds():
    odd = setmaxnreg_problems(kernel(384, "tl::warpgroup_reg_alloc<244>();", "", DEC56))
    assert any("multiple of 8" in p for p in odd)
    bare = kernel(384, INC240, "", DEC56).replace("__launch_bounds__(384, 1) ", "")
    assert setmaxnreg_problems(bare) == [
        "setmaxnreg in a kernel without __launch_bounds__ (ptxas ignores it or the pool is unknown)"]


def test_two_calls_on_one_warpgroup():
    problems = setmaxnreg_problems(kernel(384, INC240 + "\n" + INC240, "", DEC56))
    assert any("more than one setmaxnreg" in p for p in problems)
