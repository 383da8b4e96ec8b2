"""AsyncEngine: one stepping thread over a synchronous engine, outputs to asyncio consumers, aborts, drain."""

from __future__ import annotations

import asyncio

import pytest

from dsa_runtime.engine import SamplingParams
from dsa_runtime.engine.async_engine import AsyncEngine, EngineDeadError, EngineShuttingDown
from tests.server.scripted_engine import ScriptedEngine

TEXT = "The quick brown fox jumps over the lazy dog."


def _engine(**kwargs) -> AsyncEngine:
    engine = AsyncEngine(ScriptedEngine(lambda prompt: TEXT + prompt[-1], **kwargs), idle_wait_s=0.01)
    engine.start()
    return engine


def _prompt(engine: AsyncEngine, text: str) -> list[int]:
    return engine.engine.tokenizer.encode(text)


async def _collect(engine, prompt, params, rid):
    return [out async for out in engine.generate(prompt, params, rid)]


def test_concurrent_requests_stream_their_own_text_and_free_everything():
    async def main():
        engine = _engine()
        params = SamplingParams(max_tokens=200)
        results = await asyncio.gather(*[
            _collect(engine, _prompt(engine, f"q{i % 10}"), params, f"r{i}") for i in range(24)
        ])
        for i, outs in enumerate(results):
            assert outs[-1].finished and outs[-1].finish_reason == "stop"
            assert all(not o.finished for o in outs[:-1])
            assert "".join(o.new_text for o in outs) == outs[-1].text == TEXT + str(i % 10)
            assert {o.request_id for o in outs} == {f"r{i}"}
        stats = engine.stats()
        assert (stats.num_running, stats.num_waiting, stats.pages_used) == (0, 0, 0)
        await engine.shutdown(0)

    asyncio.run(main())


def test_leaving_the_loop_aborts_and_frees_pages():
    async def main():
        engine = _engine(step_delay_s=0.002)
        gen = engine.generate(_prompt(engine, "x"), SamplingParams(max_tokens=200), "cut")
        got = 0
        async for _ in gen:
            got += 1
            if got == 3:
                break
        await gen.aclose()
        for _ in range(500):
            s = engine.stats()
            if (s.num_running, s.num_waiting, s.pages_used) == (0, 0, 0) and engine.num_streams == 0:
                break
            await asyncio.sleep(0.01)
        assert (s.num_running, s.num_waiting, s.pages_used, engine.num_streams) == (0, 0, 0, 0)
        assert not engine.engine.has_unfinished()
        await engine.shutdown(0)

    asyncio.run(main())


def test_cancelled_consumer_task_aborts():
    async def main():
        engine = _engine(step_delay_s=0.005)
        task = asyncio.create_task(_collect(engine, _prompt(engine, "x"), SamplingParams(max_tokens=200), "c"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(500):
            if engine.stats().pages_used == 0 and engine.stats().num_running == 0:
                break
            await asyncio.sleep(0.01)
        assert engine.stats().pages_used == 0 and engine.stats().num_running == 0
        await engine.shutdown(0)

    asyncio.run(main())


def test_add_request_errors_reach_the_caller_and_the_loop_goes_on():
    async def main():
        engine = _engine(max_model_len=8)
        with pytest.raises(ValueError, match="does not fit"):
            await _collect(engine, _prompt(engine, "far too long a prompt"), SamplingParams(), "long")
        outs = await _collect(engine, _prompt(engine, "ok"), SamplingParams(max_tokens=3), "fine")
        assert outs[-1].finish_reason == "length" and outs[-1].text == TEXT[:3]
        await engine.shutdown(0)

    asyncio.run(main())


def test_duplicate_request_id_is_refused():
    async def main():
        engine = _engine(step_delay_s=0.005)
        first = asyncio.create_task(_collect(engine, _prompt(engine, "a"), SamplingParams(max_tokens=50), "same"))
        await asyncio.sleep(0.02)
        with pytest.raises(ValueError, match="already in use"):
            await _collect(engine, _prompt(engine, "b"), SamplingParams(), "same")
        assert (await first)[-1].finished
        await engine.shutdown(0)

    asyncio.run(main())


def test_explicit_abort_ends_the_stream_with_abort():
    async def main():
        engine = _engine(step_delay_s=0.005)
        outs = []
        async for out in engine.generate(_prompt(engine, "x"), SamplingParams(max_tokens=200), "ab"):
            outs.append(out)
            if len(outs) == 2:
                await engine.abort("ab")
        assert outs[-1].finished and outs[-1].finish_reason == "abort"
        assert len(outs) < 20 and engine.stats().pages_used == 0
        await engine.shutdown(0)

    asyncio.run(main())


def test_shutdown_drains_short_requests_and_aborts_long_ones():
    async def main():
        engine = _engine(step_delay_s=0.01)
        short = asyncio.create_task(_collect(engine, _prompt(engine, "s"), SamplingParams(max_tokens=5), "short"))
        # The scripted text is 46 tokens: longer than the drain window at 10 ms per step.
        long = asyncio.create_task(_collect(engine, _prompt(engine, "l"), SamplingParams(max_tokens=200), "long"))
        await asyncio.sleep(0.03)
        await engine.shutdown(drain_timeout=0.2)
        assert (await short)[-1].finish_reason == "length"
        assert (await long)[-1].finish_reason == "abort"
        assert engine.stats().pages_used == 0
        assert engine.engine.closed  # the engine (its process or its workers) stopped with the server
        with pytest.raises(EngineShuttingDown):
            await _collect(engine, _prompt(engine, "x"), SamplingParams(), "late")

    asyncio.run(main())


def test_a_failing_engine_step_fails_every_request_and_later_ones():
    class Broken(ScriptedEngine):
        def step(self):
            raise RuntimeError("device lost")

    async def main():
        engine = AsyncEngine(Broken(lambda p: "x"), idle_wait_s=0.01)
        engine.start()
        with pytest.raises(EngineDeadError, match="device lost"):
            await _collect(engine, [5, 6], SamplingParams(), "a")
        assert not engine.is_running and isinstance(engine.error, RuntimeError)
        with pytest.raises(EngineDeadError):
            await _collect(engine, [5, 6], SamplingParams(), "b")
        await engine.shutdown(0)

    asyncio.run(main())


def test_a_slow_consumer_gets_the_steps_it_missed_merged_into_one_output():
    async def main():
        engine = _engine()
        params = SamplingParams(max_tokens=200, logprobs=0)
        outs = []
        async for out in engine.generate(_prompt(engine, "q7"), params, "slow"):
            outs.append(out)
            await asyncio.sleep(0.05)  # the engine runs ahead: several steps queue between our reads
        assert outs[-1].finished and outs[-1].text == TEXT + "7"
        assert "".join(o.new_text for o in outs) == outs[-1].text
        ids = [t for o in outs for t in o.new_token_ids]
        assert ids == outs[-1].token_ids
        assert [lp.token_id for o in outs for lp in o.logprobs] == ids
        assert len(outs) < len(ids), "nothing was merged: every step reached the consumer on its own"
        await engine.shutdown(0)

    asyncio.run(main())
