"""The engine on the real tiny V3.2 checkpoint (reference kernels, CPU): batching, abort, score, chat, CLI.

Float32 model dtype for the token-equality tests: kernel outputs are bf16 by contract, and with bf16
activations a batch of different size can round differently and flip a near-tie of the random-weight model's
flat logits (batch variance of the model, not the scheduler; the scheduler's exactness is tested with the
toy runner in test_engine_batching.py).
"""

from __future__ import annotations

import random
import time

import pytest

from dsa_runtime.engine import Engine, EngineConfig, SamplingParams
from dsa_runtime.engine.llm import LLM

CFG = {"dtype": "float32", "max_total_tokens": 2048, "chunked_prefill_size": 24, "max_running_requests": 8}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread for this module (restored after): the tiny model's ops are too small to split, and
    on a machine whose 2 cores are busy two threads run up to ~50x slower here (spin-waits)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    # (the package attribute make_checkpoint is shadowed by its submodule once that is imported)
    from dsa_runtime.loader.make_checkpoint import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-v32", "tiny-v32", seed=0)


@pytest.fixture(scope="module")
def engine(checkpoint) -> Engine:
    return Engine(EngineConfig(model=str(checkpoint), **CFG))


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(0)
    # mixed lengths: below, at and above the chunk budget and index_topk (32)
    return [[rng.randrange(3, 1000) for _ in range(n)] for n in (3, 9, 17, 24, 31, 40, 52, 5)]


PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def alone(engine, prompts) -> list[list[int]]:
    out = []
    for i, p in enumerate(prompts):
        engine.add_request(f"alone{i}", p, PARAMS)
        while engine.has_unfinished():
            for o in engine.step():
                last = o
        out.append(last.token_ids)
    assert engine.stats().pages_used == 0
    return out


def _staggered(engine, prompts, abort: tuple[str, ...] = ()) -> dict[str, object]:
    """Requests arrive over several steps; ids in ``abort`` are aborted right after their first token."""
    arrivals = [0, 0, 1, 1, 2, 3, 3, 5]
    final: dict[str, object] = {}
    step = 0
    while step <= max(arrivals) or engine.has_unfinished():
        for i, at in enumerate(arrivals):
            if at == step:
                engine.add_request(f"b{i}", prompts[i], PARAMS)
        for o in engine.step():
            if o.finished:
                final[o.request_id] = o
            elif o.request_id in abort and o.token_ids:
                engine.abort(o.request_id)
        step += 1
    return final


def test_greedy_alone_equals_staggered_batch_of_8(engine, prompts, alone):
    final = _staggered(engine, prompts)
    for i, want in enumerate(alone):
        assert final[f"b{i}"].token_ids == want, f"request {i} (prompt {len(prompts[i])} tokens)"
    assert engine.stats().pages_used == 0


def test_abort_mid_decode_leaves_the_others_unchanged(engine, prompts, alone):
    final = _staggered(engine, prompts, abort=("b1", "b6"))
    for rid in ("b1", "b6"):
        assert final[rid].finish_reason == "abort" and len(final[rid].token_ids) == 1
    for i in (0, 2, 3, 4, 5, 7):
        assert final[f"b{i}"].token_ids == alone[i]
    assert engine.stats().pages_used == 0


def test_preemption_in_a_small_paged_cache_keeps_tokens(checkpoint, prompts, alone):
    # 8 pages of 16 tokens for 8 requests of up to 60 tokens: some are preempted and recomputed.
    small = Engine(EngineConfig(model=str(checkpoint), **{**CFG, "max_total_tokens": 128, "page_size": 16}))
    final = _staggered(small, prompts)
    assert small.stats().num_preemptions > 0 and small.stats().pages_used == 0
    for i, want in enumerate(alone):
        assert final[f"b{i}"].token_ids == want, f"request {i}"


def test_score_last_row_gives_the_first_greedy_token(engine, prompts, alone):
    logits = engine.score(prompts[5])
    assert logits.shape == (len(prompts[5]), engine.model_config.vocab_size)
    assert int(logits[-1].argmax()) == alone[5][0]
    assert engine.stats().pages_used == 0


def test_chat_and_text_through_the_real_tokenizer(engine):
    llm = LLM(engine=engine)
    result = llm.chat([{"role": "user", "content": "Hi"}], thinking=True, sampling_params=PARAMS)
    assert result.prompt.endswith("<｜Assistant｜><think>")
    assert result.output is not None and len(result.output.token_ids) == PARAMS.max_tokens
    # random weights: the text is noise, but the result is the parsers' reading of exactly that text
    again = llm.chat_parser(thinking=True).parse(result.text, truncated=True)
    assert (result.content, result.reasoning_content) == (again.content, again.reasoning_content)
    assert result.text == engine.tokenizer.decode(result.output.token_ids, skip_special_tokens=True)
    (out,) = llm.generate("Hello", PARAMS)
    assert out.prompt_token_ids[0] == engine.tokenizer.bos_id
    assert out.prompt_token_ids[1:] == engine.tokenizer.encode("Hello")
    assert out.text == engine.tokenizer.decode(out.token_ids, skip_special_tokens=True)


def test_cli_generate_on_the_embedded_default(monkeypatch, tmp_path, capsys):
    from dsa_runtime.cli.main import main
    from dsa_runtime.loader import default_model_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    default_model_path()  # created once here so the timing below is the answer itself
    capsys.readouterr()
    started = time.monotonic()
    code = main(["generate", "--prompt", "Hello", "--max-tokens", "8", "--seed", "3"])
    elapsed = time.monotonic() - started
    captured = capsys.readouterr()
    assert code == 0
    assert "[8 tokens, finish: length" in captured.err
    assert captured.out.endswith("\n") and len(captured.out) > 1
    assert elapsed < 20, f"generate took {elapsed:.1f} s"
