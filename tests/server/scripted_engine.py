"""A scripted stand-in for the engine interface of docs/server.md, used only by the server wiring tests.

It emits a given completion token by token (one token per request per ``step``), with the real engine's
bookkeeping: page allocation per request, ``max_tokens`` / stop strings / EOS handling, ``abort`` freeing
pages at once, ``stats()``. Which completion a request gets is chosen by ``script(prompt_text)``.
The tokenizer is character level, with DeepSeek's special tokens as single ids, so markup such as
``<｜DSML｜invoke`` arrives in many small pieces, exercising the parsers' hold-back.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dsa_runtime.engine import EngineStats, RequestMetrics, RequestOutput, SamplingParams, TokenLogprob

SPECIALS = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
)


class CharTokenizer:
    """Special tokens are ids 0..len(SPECIALS)-1; any other character c is ``len(SPECIALS) + ord(c)``."""

    def __init__(self) -> None:
        self.special_ids = set(range(len(SPECIALS)))
        self.added_tokens: dict[str, int] = {}  # text -> id of tokens added past the base vocabulary: none
        self.bos_id, self.eos_id = 0, 1
        self.vocab_size = len(SPECIALS) + 0x110000

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = [self.bos_id] if add_special_tokens else []
        i = 0
        while i < len(text):
            for k, special in enumerate(SPECIALS):
                if text.startswith(special, i):
                    ids.append(k)
                    i += len(special)
                    break
            else:
                ids.append(len(SPECIALS) + ord(text[i]))
                i += 1
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        out = []
        for t in ids:
            if t < len(SPECIALS):
                if not skip_special_tokens:
                    out.append(SPECIALS[t])
            else:
                out.append(chr(t - len(SPECIALS)))
        return "".join(out)

    def token_to_id(self, token: str) -> int | None:
        """The id of a one-token string (a special token or one character), else None."""
        if token in SPECIALS:
            return SPECIALS.index(token)
        return len(SPECIALS) + ord(token) if len(token) == 1 else None


@dataclass
class _Req:
    rid: str
    prompt: list[int]
    params: SamplingParams
    script: list[int]
    arrival: float
    pages: int = 0
    pos: int = 0
    out_ids: list[int] = field(default_factory=list)
    text: str = ""
    aborted: bool = False
    scheduled: float | None = None
    sent: int = 0  # characters of text already reported (a possible stop-string start is held back)


class ScriptedEngine:
    """Engine-interface test double; see the module docstring.

    Args:
        script: prompt text -> completion text (EOS is appended unless the text already ends the turn).
        max_model_len, page_size, num_pages, max_running: the limits the real engine also has.
        step_delay_s: sleep per step, to make generation last long enough to cut streams mid-way.
    """

    def __init__(
        self,
        script: Callable[[str], str],
        *,
        max_model_len: int = 4096,
        page_size: int = 16,
        num_pages: int = 4096,
        max_running: int = 64,
        step_delay_s: float = 0.0,
    ) -> None:
        self.tokenizer = CharTokenizer()
        self.script = script
        self.max_model_len = max_model_len
        self.model_config = None
        self.model_path: str | None = None  # no checkpoint behind the script
        self.kernel_log: tuple[str, ...] = ()
        self.page_size, self.num_pages, self.max_running = page_size, num_pages, max_running
        self.step_delay_s = step_delay_s
        self.pages_used = 0
        self.waiting: list[_Req] = []
        self.running: list[_Req] = []
        self.added: list[str] = []
        self.closed = False  # set by close(): the server stopped its engine

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if len(prompt_token_ids) >= self.max_model_len:
            raise ValueError(f"prompt of {len(prompt_token_ids)} tokens does not fit {self.max_model_len}")
        text = self.script(self.tokenizer.decode(prompt_token_ids))
        ids = self.tokenizer.encode(text) + [self.tokenizer.eos_id]
        self.waiting.append(_Req(request_id, list(prompt_token_ids), params, ids, time.monotonic()))
        self.added.append(request_id)

    def abort(self, request_id: str) -> None:
        for req in self.waiting + self.running:
            if req.rid == request_id:
                req.aborted = True
                self._free(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def close(self) -> None:
        self.closed = True

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=len(self.running), num_waiting=len(self.waiting), pages_used=self.pages_used,
            pages_total=self.num_pages, kv_usage=self.pages_used / self.num_pages, page_size=self.page_size,
            max_model_len=self.max_model_len,
        )

    def step(self) -> list[RequestOutput]:
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        outputs = []
        for req in [r for r in self.waiting if r.aborted]:
            self.waiting.remove(req)
            outputs.append(self._output(req, [], "", "abort"))
        while self.waiting and len(self.running) < self.max_running:
            req = self.waiting[0]
            need = math.ceil((len(req.prompt) + req.params.max_tokens) / self.page_size)
            if self.pages_used + need > self.num_pages:
                break
            self.waiting.pop(0)
            req.pages, req.scheduled = need, time.monotonic()
            self.pages_used += need
            self.running.append(req)
        for req in list(self.running):
            if req.aborted:
                self.running.remove(req)
                outputs.append(self._output(req, [], "", "abort"))
                continue
            outputs.append(self._advance(req))
        return outputs

    def _advance(self, req: _Req) -> RequestOutput:
        token = req.script[req.pos]
        req.pos += 1
        eos = token == self.tokenizer.eos_id and not req.params.ignore_eos
        if eos:
            return self._finish(req, [], "", "stop", self.tokenizer.eos_id)
        if token in req.params.stop_token_ids:
            return self._finish(req, [token], "", "stop", token)
        piece = self.tokenizer.decode([token], skip_special_tokens=req.params.skip_special_tokens)
        req.out_ids.append(token)
        before = len(req.text)
        req.text += piece
        for stop in req.params.stop:
            at = req.text.find(stop, max(0, before - len(stop)))
            if at >= 0:
                keep = at + len(stop) if req.params.include_stop_str_in_output else at
                req.text = req.text[:keep]
                return self._finish(req, [token], self._take(req, keep), "stop", stop)
        if len(req.out_ids) >= req.params.max_tokens or req.pos >= len(req.script):
            return self._finish(req, [token], self._take(req, len(req.text)), "length", None)
        held = max((k for stop in req.params.stop for k in range(1, len(stop)) if req.text.endswith(stop[:k])),
                   default=0)
        return self._output(req, [token], self._take(req, len(req.text) - held), None)

    @staticmethod
    def _take(req: _Req, upto: int) -> str:
        """Text from what was already reported up to ``upto`` (like the real engine's stop hold-back)."""
        upto = max(upto, req.sent)
        piece, req.sent = req.text[req.sent : upto], upto
        return piece

    def _finish(self, req: _Req, new_ids: list[int], new_text: str, reason: str, stop: str | int | None):
        self.running.remove(req)
        self._free(req)
        return self._output(req, new_ids, new_text, reason, stop)

    def _free(self, req: _Req) -> None:
        self.pages_used -= req.pages
        req.pages = 0

    def _output(self, req, new_ids, new_text, reason, stop=None) -> RequestOutput:
        logprobs = []
        if req.params.logprobs is not None:
            for t in new_ids:
                top = [(t, -0.25)] + [(t + k, -1.0 - k) for k in range(1, req.params.logprobs)]
                logprobs.append(TokenLogprob(t, -0.25, top[: req.params.logprobs]))
        now = time.monotonic()
        return RequestOutput(
            request_id=req.rid, prompt_token_ids=req.prompt, token_ids=list(req.out_ids), text=req.text,
            new_token_ids=list(new_ids), new_text=new_text, finished=reason is not None, finish_reason=reason,
            stop_reason=stop, logprobs=logprobs,
            metrics=RequestMetrics(arrival=req.arrival, scheduled=req.scheduled, last_token=now),
        )


@dataclass(frozen=True)
class ScriptedReply:
    """A picklable recipe for a ScriptedEngine that answers every prompt with ``reply``: with
    :func:`build_scripted`, the scripted engine runs in an engine process (``EngineProcess(recipe,
    build=build_scripted)``), so tests cover the server's engine-process path too."""

    reply: str
    step_delay_s: float = 0.0
    max_model_len: int = 4096
    num_pages: int = 4096


def build_scripted(recipe: ScriptedReply) -> ScriptedEngine:
    return ScriptedEngine(lambda _prompt: recipe.reply, step_delay_s=recipe.step_delay_s,
                          max_model_len=recipe.max_model_len, num_pages=recipe.num_pages)
