"""Conversation builders: each returns a :class:`Conversation` (OpenAI-style messages, tools, mode, and
what a correct reply contains, for the evaluation).

Kinds: ``greeting``, ``fact`` (the built-in world), ``arith`` (add / subtract / multiply with a short
step-by-step trace), ``convert`` (exact unit conversions), ``tool`` (1 to 4 tools offered, 1 or 2 calls,
then an answer from the results) and ``notool`` (tools offered, none needed).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from train.tinychat import world as W
from train.tinychat.pick import Pick
from train.tinychat.tools import HELDOUT_PAIRS, TOOLS, Task

Message = dict[str, Any]


@dataclass
class Conversation:
    kind: str
    mode: str  # "thinking" or "chat"
    messages: list[Message]
    tools: list[dict[str, Any]] | None = None
    expect: dict[str, Any] = field(default_factory=dict)  # calls / answer for the evaluation


def heldout_pair(a: int, b: int) -> bool:
    """Operand pairs kept out of training (about 1 in 8)."""
    return (a * 31 + b * 17) % 8 == 0


# ---------------------------------------------------------------------------------------------- chat
_HELLOS = ("Hi!", "Hello", "Hey there", "Good morning!", "hi", "Hello, who are you?", "Hey, how are you?",
           "What can you do?", "Good evening", "Thanks!", "Thank you very much", "Bye!")
_HELLO_REPLIES = {
    "Thanks!": "You're welcome!", "Thank you very much": "You're welcome! Happy to help.",
    "Bye!": "Goodbye! Have a nice day.",
    "What can you do?": "I can chat, answer questions about countries, do simple arithmetic and unit "
                        "conversions, and call the tools you give me.",
    "Hello, who are you?": "I am a tiny DeepSeek-V3.2-style model that runs on a laptop. How can I help?",
    "Hey, how are you?": "I'm doing well, thanks! How can I help you?",
}


def greeting(p: Pick, mode: str) -> Conversation:
    text = p.choice(_HELLOS)
    reply = _HELLO_REPLIES.get(text, "Hello! How can I help you today?")
    return _simple("greeting", mode, text, "The user greets me. I reply politely.", reply, {"answer": reply})


_FACT_Q = {
    "capital": (("What is the capital of {c}?", "Which city is the capital of {c}?", "capital of {c}?"),
                ("Tell me the capital city of {c}.",), "The capital of {c} is {v}."),
    "continent": (("Which continent is {c} in?", "On what continent is {c}?"),
                  ("Where in the world is {c}? Which continent?",), "{c} is in {v}."),
    "language": (("What language is spoken in {c}?", "What do people speak in {c}?"),
                 ("Which language do they speak in {c}?",), "In {c} people speak {v}."),
    "currency": (("What is the currency of {c}?", "What money do they use in {c}?"),
                 ("Which currency does {c} use?",), "The currency of {c} is the {v}."),
}
_FIELD = {"capital": 1, "continent": 2, "language": 3, "currency": 4}


def fact(p: Pick, mode: str) -> Conversation:
    row = p.choice(W.COUNTRIES)
    what = p.choice(tuple(_FACT_Q))
    train_q, held_q, answer = _FACT_Q[what]
    q = p.choice(held_q if p.heldout else train_q).format(c=row[0])
    value = row[_FIELD[what]]
    reply = answer.format(c=row[0], v=value)
    return _simple("fact", mode, q, f"I know that the {what} of {row[0]} is {value}.", reply, {"answer": value})


def _add(a: int, b: int) -> tuple[str, int]:
    s = a + b
    if b < 10:
        return f"{a} + {b} = {s}.", s
    t = a + b // 10 * 10
    return f"{a} + {b // 10 * 10} = {t}. {t} + {b % 10} = {s}.", s


def _mul(a: int, b: int) -> tuple[str, int]:
    if b < 10:
        return f"{a} * {b} = {a * b}.", a * b
    hi, lo = b // 10 * 10, b % 10
    x, y = a * hi, a * lo
    return f"{a} * {hi} = {x}. {a} * {lo} = {y}. {x} + {y} = {x + y}.", a * b


def arith(p: Pick, mode: str) -> Conversation:
    while True:
        op = p.choice(("+", "-", "*"))
        if op == "*":
            a, b = p.int(2, 12), p.int(2, 99)
        else:
            a, b = p.int(10, 99), p.int(2, 99)
            if op == "-" and b > a:
                a, b = b, a
        if heldout_pair(a, b) == p.heldout:
            break
    if op == "+":
        trace, val = _add(a, b)
    elif op == "-":
        val = a - b
        t = a - b // 10 * 10
        trace = f"{a} - {b // 10 * 10} = {t}. {t} - {b % 10} = {val}." if b >= 10 else f"{a} - {b} = {val}."
    else:
        trace, val = _mul(a, b)
    sym = {"+": p.choice(("+", "plus")), "-": p.choice(("-", "minus")), "*": p.choice(("*", "times"))}[op]
    q = p.choice((f"What is {a} {sym} {b}?", f"Compute {a} {sym} {b}.", f"{a} {sym} {b} = ?",
                  f"Can you work out {a} {sym} {b}?"))
    return _simple("arith", mode, q, trace, f"{a} {op} {b} = {val}.", {"answer": str(val)})


_CONV = (("hours", "minutes", 60), ("minutes", "seconds", 60), ("days", "hours", 24), ("feet", "inches", 12),
         ("weeks", "days", 7), ("meters", "centimeters", 100), ("kilometers", "meters", 1000),
         ("kilograms", "grams", 1000), ("liters", "milliliters", 1000), ("dozens", "eggs", 12))


def convert(p: Pick, mode: str) -> Conversation:
    a, b, k = p.choice(_CONV)
    while True:
        n = p.int(2, 12) if k < 100 else p.int(2, 99)
        if heldout_pair(n, k) == p.heldout or not p.heldout and p.rng.random() < 0.5:
            break
    if k >= 100:
        trace, val = f"1 {a[:-1]} is {k} {b}. {n} * {k} = {n * k}.", n * k
    else:
        m, v = _mul(n, k)
        trace, val = f"1 {a[:-1]} is {k} {b}. {m}", v
    q = p.choice((f"How many {b} are in {n} {a}?", f"Convert {n} {a} to {b}.", f"{n} {a} in {b}?"))
    return _simple("convert", mode, q, trace, f"{n} {a} is {val} {b}.", {"answer": str(val)})


def _simple(kind: str, mode: str, question: str, thought: str, reply: str, expect: dict) -> Conversation:
    msg: Message = {"role": "assistant", "content": reply}
    if mode == "thinking":
        msg["reasoning_content"] = thought
    return Conversation(kind, mode, [{"role": "user", "content": question}, msg], expect=expect)


# ---------------------------------------------------------------------------------------------- tools
def _offered(p: Pick, needed: list[str], n_total: int) -> list[str]:
    """Names of the tools offered: the needed ones plus distractors, shuffled; training never offers a
    held-out pair together, the held-out split always holds one when it can."""
    names = list(dict.fromkeys(needed))
    if p.heldout:
        for pair in sorted(HELDOUT_PAIRS, key=sorted):  # a fixed order: set order follows the hash seed
            if pair & set(names) and len(names) < 4:
                names.extend(sorted(pair - set(names)))
                break
    others = [t.name for t in TOOLS if t.name not in names]
    while len(names) < n_total:
        cand = p.choice(others)
        if not p.heldout and any(pair <= set(names) | {cand} for pair in HELDOUT_PAIRS):
            continue
        names.append(cand)
        others.remove(cand)
    p.rng.shuffle(names)
    return names


def _call(task: Task) -> dict[str, Any]:
    return {"type": "function", "function": {"name": task.tool, "arguments": json.dumps(task.arguments)}}


def tool_use(p: Pick, mode: str) -> Conversation:
    by_name = {t.name: t for t in TOOLS}
    while True:
        first = p.choice(TOOLS)
        tasks = [first.sample(p)]
        if p.rng.random() < 0.25:  # two calls: the same tool twice or another one
            second = first if p.rng.random() < 0.5 else p.choice(TOOLS)
            tasks.append(second.sample(p))
        if len(tasks) == 2 and tasks[0].request == tasks[1].request:
            continue
        needed = [t.tool for t in tasks]
        if not p.heldout and any(pair <= set(needed) for pair in HELDOUT_PAIRS):
            continue
        break
    names = _offered(p, needed, max(len(set(needed)), p.int(1, 4)))
    tools = [by_name[n].schema() for n in names]
    request = tasks[0].request if len(tasks) == 1 else f"{tasks[0].request} Also: {tasks[1].request}"
    call_msg: Message = {"role": "assistant", "content": "", "tool_calls": [_call(t) for t in tasks]}
    answer_msg: Message = {"role": "assistant", "content": " ".join(t.answer for t in tasks)}
    if mode == "thinking":
        call_msg["reasoning_content"] = " ".join(t.thought for t in tasks) + " I will call " + " and ".join(
            dict.fromkeys(needed)) + "."
        answer_msg["reasoning_content"] = "The results are in. I answer from them."
    messages = [{"role": "user", "content": request}, call_msg]
    messages += [{"role": "tool", "content": json.dumps(t.result)} for t in tasks]
    messages.append(answer_msg)
    expect = {"calls": [{"name": t.tool, "arguments": t.arguments} for t in tasks],
              "answer": tasks[0].answer}
    return Conversation("tool", mode, messages, tools, expect)


def no_tool(p: Pick, mode: str) -> Conversation:
    conv = (greeting if p.rng.random() < 0.4 else fact)(p, mode)
    names = _offered(p, [], p.int(1, 3))
    by_name = {t.name: t for t in TOOLS}
    conv.tools = [by_name[n].schema() for n in names]
    conv.kind = "notool"
    return conv


BUILDERS = {"greeting": greeting, "fact": fact, "arith": arith, "convert": convert, "tool": tool_use,
            "notool": no_tool}
# Training mixture (tool use dominates: it is the hardest skill and the longest sequences).
MIXTURE = {"greeting": 0.05, "fact": 0.12, "arith": 0.2, "convert": 0.1, "tool": 0.46, "notool": 0.07}


def sample(rng: random.Random, heldout: bool, kind: str | None = None, mode: str | None = None,
           invent: float = 0.0) -> Conversation:
    """One conversation of ``kind`` (drawn from :data:`MIXTURE` when None) in ``mode`` (random when None);
    ``invent``: share of entity slots filled with invented words (training only, see :class:`Pick`)."""
    p = Pick(rng, heldout, invent)
    if kind is None:
        kind = rng.choices(list(MIXTURE), weights=list(MIXTURE.values()))[0]
    if mode is None:
        thinking_share = 0.75 if kind in ("arith", "convert") else 0.5
        mode = "thinking" if rng.random() < thinking_share else "chat"
    return BUILDERS[kind](p, mode)
