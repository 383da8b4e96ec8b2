"""Prefix caching (the radix tree over full KV pages): the tree's bookkeeping, and through the embedded model in
float32 on the CPU, greedy outputs identical with and without the cache for shared system prompts, multi-turn
chats, prompts that diverge inside a page, aborted requests whose pages were shared and eviction under a small
cache; afterwards no page is in use and no node is referenced."""

from __future__ import annotations

import random

import pytest

from dsa_runtime.cache import PageAllocator
from dsa_runtime.cache.radix import RadixCache
from dsa_runtime.engine import Engine, EngineConfig, SamplingParams
from tests.engine.helpers import run_all

PS = 16  # page size of these tests


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every test here runs on one torch thread (tests/conftest.py)."""


# --- the tree -------------------------------------------------------------------------------------------------
def test_match_insert_release_and_lru_eviction():
    alloc = PageAllocator(16)
    cache = RadixCache(alloc, 4)
    a = list(range(100, 111))  # 11 tokens: 2 full pages + 3
    pages_a = alloc.alloc(3)
    held = cache.insert(a, pages_a, 11, [])  # prompt computed, request still running
    assert [n.page for n in held] == pages_a[:2] and cache.num_nodes == 2 and cache.evictable == 0
    cache.release(a, pages_a, 11, held)  # finished: the partial third page is freed, the two full ones cached
    assert alloc.num_used == 2 and cache.evictable == 2

    b = a[:8] + [7, 7, 7]  # same two pages, then its own tokens
    path = cache.match(b)
    assert [n.page for n in path] == pages_a[:2] and cache.evictable == 0
    assert cache.match(a[:8]) == path[:1]  # one token is always left to compute: 8 tokens match 1 page
    cache.release(a[:8], [path[0].page], 4, path[:1])
    pages_b = [n.page for n in path] + alloc.alloc(1)
    cache.release(b, pages_b, 11, path)
    assert alloc.num_used == 2 and cache.evictable == 2

    c = [1, 2, 3, 4, 5]  # another root page, used last
    pages_c = alloc.alloc(2)
    cache.release(c, pages_c, 5, cache.insert(c, pages_c, 5, []))
    assert cache.num_nodes == 3 and alloc.num_used == 3
    assert cache.evict(1) == 1 and cache.num_nodes == 2
    # The least recently used leaf went first (a's second page), not c's page touched after it.
    assert cache.match(c + [0]) and [n.page for n in cache.match(a + [0])] == pages_a[:1]


def test_a_page_cached_twice_stays_with_the_second_request():
    alloc = PageAllocator(16)
    cache = RadixCache(alloc, 4)
    tokens = list(range(9))
    first, second = alloc.alloc(3), alloc.alloc(3)
    held_1 = cache.insert(tokens, first, 9, [])
    held_2 = cache.insert(tokens, second, 9, [])  # computed the same pages before the first was cached
    assert [n.page for n in held_2] == first[:2] and cache.num_nodes == 2
    cache.release(tokens, second, 9, held_2)  # its duplicates are freed, the tree keeps the first request's pages
    cache.release(tokens, first, 9, held_1)
    assert alloc.num_used == 2 and cache.evictable == 2
    assert cache.evict(5) == 2 and alloc.num_used == 0 and cache.num_nodes == 0


# --- through the engine ---------------------------------------------------------------------------------------
def _engine(cache: bool, **fields) -> Engine:
    return Engine(EngineConfig(dtype="float32", page_size=PS, max_running_requests=8, disable_radix_cache=not cache,
                               **fields))


def _params(n: int = 12) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def _check_idle(engine: Engine) -> None:
    stats = engine.stats()
    assert stats.pages_used == 0 and stats.num_running == 0
    cache = engine.prefix_cache
    if cache is not None:
        assert cache.evictable == cache.num_nodes == stats.pages_cached == engine.allocator.num_used


def _serve(engine: Engine, waves: list[list[list[int]]]) -> list[list[int]]:
    """Each wave's prompts run together, waves one after another; generated tokens in prompt order."""
    out = []
    for w, wave in enumerate(waves):
        for i, prompt in enumerate(wave):
            engine.add_request(f"w{w}-{i}", prompt, _params())
        seen = run_all(engine)
        out += [seen[f"w{w}-{i}"][-1].token_ids for i in range(len(wave))]
    _check_idle(engine)
    return out


def _tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 3000) for _ in range(n)]


@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3"])
def test_shared_system_prompt_hits_and_gives_the_uncached_tokens(kv):
    system = _tokens(3 * PS + 5, 1)
    waves = [[system + _tokens(7, 2)], [system + _tokens(9, 3), system + _tokens(4, 4)], [system + _tokens(6, 5)]]
    want = _serve(_engine(False, kv_cache_dtype=kv), waves)
    engine = _engine(True, kv_cache_dtype=kv)
    assert _serve(engine, waves) == want
    stats = engine.stats()
    # The first request computes everything; the three later ones find the system prompt's 3 full pages.
    assert stats.prefix_cache_hits_total == 3 * 3 * PS
    assert stats.prefix_cache_queries_total == sum(len(p) for wave in waves for p in wave)


def test_multi_turn_chat_reuses_the_conversation_so_far():
    cached_engine, plain = _engine(True), _engine(False)
    history = {"cached": _tokens(2 * PS + 3, 7), "plain": _tokens(2 * PS + 3, 7)}
    computed_before = 0  # tokens of the previous turn in the cache: its prompt and answer but the last token
    for turn in range(3):
        for name, engine in (("cached", cached_engine), ("plain", plain)):
            engine.add_request(f"t{turn}", history[name], _params(10))
            last = run_all(engine)[f"t{turn}"][-1]
            if name == "cached":
                assert last.num_cached_tokens == PS * (computed_before // PS) > 0 or turn == 0
                computed_before = len(history[name]) + len(last.token_ids) - 1
            history[name] = history[name] + last.token_ids + _tokens(5, 100 + turn)  # answer + next question
        assert history["cached"] == history["plain"]
    _check_idle(cached_engine)


def test_prompts_that_diverge_inside_a_page_share_only_the_full_pages_before():
    base = _tokens(2 * PS + 10, 11)
    other = base[: 2 * PS + 4] + _tokens(8, 12)  # same first 2 pages + 4 tokens, then different
    waves = [[base], [other]]
    want = _serve(_engine(False), waves)
    engine = _engine(True)
    engine.add_request("a", base, _params())
    run_all(engine)
    engine.add_request("b", other, _params())
    outs = run_all(engine)["b"]
    assert outs[-1].num_cached_tokens == 2 * PS
    assert [want[0], outs[-1].token_ids] == [want[0], want[1]]
    _check_idle(engine)


def test_an_aborted_request_whose_pages_were_shared_frees_nothing_another_uses():
    system = _tokens(4 * PS, 21)
    engine = _engine(True)
    engine.add_request("seed", system + [5], _params(2))  # caches the system prompt's pages
    run_all(engine)
    engine.add_request("a", system + _tokens(6, 22), _params(30))
    engine.add_request("b", system + _tokens(6, 23), _params(12))
    for _ in range(4):
        engine.step()
    engine.abort("a")  # shares the cached pages with b
    outs = run_all(engine)
    assert outs["a"][-1].finish_reason == "abort"
    plain = _engine(False)
    plain.add_request("b", system + _tokens(6, 23), _params(12))
    assert outs["b"][-1].token_ids == run_all(plain)["b"][-1].token_ids
    assert outs["b"][-1].num_cached_tokens == 4 * PS
    _check_idle(engine)


def test_eviction_under_a_small_cache_keeps_outputs_and_never_refuses_work():
    # 24 usable pages of 16 tokens; 10 distinct prompts of ~3 pages each cached one after another.
    prompts = [_tokens(2 * PS + 8, 30 + i) for i in range(10)]
    waves = [[p] for p in prompts] + [[prompts[-1]], prompts[:4]]
    want = _serve(_engine(False, max_total_tokens=24 * PS), waves)
    engine = _engine(True, max_total_tokens=24 * PS)
    assert _serve(engine, waves) == want
    stats = engine.stats()
    assert stats.pages_cached <= 24 and stats.prefix_cache_hits_total >= 2 * PS  # the repeated last prompt hit
    assert stats.num_preemptions == 0 and engine.prefix_cache.evicted_pages > 0


def test_a_thinking_turn_reuses_the_conversation_up_to_its_dropped_reasoning():
    """V3.2's chat encoding drops an earlier turn's reasoning, so the next prompt departs from what the engine
    computed right after the previous prompt (``</think>`` where the cache holds ``<think>`` and the reasoning);
    everything in full pages before that point is still reused."""
    from dsa_runtime.parsers.encoding_v32 import encode_messages

    engine = _engine(True)
    encode = engine.tokenizer.encode
    turn1 = [{"role": "system", "content": "You are a careful assistant. " * 12}, {"role": "user", "content": "2+2?"}]
    first = encode(encode_messages(turn1, "thinking"))
    engine.add_request("t1", first, _params(8))
    run_all(engine)
    turn2 = turn1 + [{"role": "assistant", "content": "4", "reasoning_content": "two and two"},
                     {"role": "user", "content": "And 3+3?"}]
    second = encode(encode_messages(turn2, "thinking"))
    common = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert common >= len(first) - 2  # only the turn's opening differs: the reasoning is not in the new prompt
    engine.add_request("t2", second, _params(4))
    out = run_all(engine)["t2"][-1]
    assert out.num_cached_tokens == PS * (common // PS) > 0
    _check_idle(engine)
