"""JSON answers: requests that ask for a JSON document and a short reply that is one.

A request is a question -- a country fact, a sum, a unit conversion, details to pull out of a sentence, a list
to name, or a record to make up -- plus the way it asks for JSON: the schema in a system turn or after the
question, the keys in words, or only "Reply as JSON." (``response_format`` sends the schema to the grammar,
not to the model, so the prompt may hold none). The assistant's content is the document as the server's
grammar lets it be written (compact, ``", "`` and ``": "`` separators: ``json.dumps``), its properties in the
schema's order. Numbers have few digits (at most two decimals), strings are one to six words, arrays hold one
to four items: what the model learns here is to end each value, so that a constrained request whose schema
leaves numbers, strings and arrays unbounded finishes.

Key names, record kinds and the wording of the JSON request come from separate training and held-out pools:
a held-out schema's keys never appear in a training conversation (``tests/tinychat/test_json_answers.py``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from train.tinychat import world as W
from train.tinychat.dialogs import Conversation, arith, convert
from train.tinychat.pick import Pick

Schema = dict[str, Any]

# ---------------------------------------------------------------------------------------------- key pools
# kind -> (training keys, held-out keys). No held-out key is a key of the tool schemas or results either.
KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "person": (("name", "full_name", "author", "owner", "customer", "contact", "manager", "player", "artist",
                "host"), ("guest", "speaker", "captain", "coach")),
    "city": (("city", "location", "hometown", "place", "home_city"), ("birthplace", "harbor", "venue_city")),
    "word": (("color", "category", "kind", "level", "mood", "size", "shape", "weather", "priority", "state",
              "style"), ("flavor", "tier", "rarity", "texture")),
    "text": (("description", "summary", "note", "comment", "message", "reason", "headline", "bio"),
             ("tagline", "remark", "motto", "caption")),
    "date": (("due_date", "created", "birthday", "start_date", "day_of"), ("deadline", "release_date", "expiry")),
    "int": (("age", "quantity", "year", "rooms", "pages", "rank", "total", "votes", "floor", "points", "stock",
             "members", "number"), ("episodes", "calories", "laps", "wins", "tickets")),
    "number": (("score", "rating", "weight", "height", "distance", "speed", "ratio", "amount", "cost", "balance",
                "length", "width", "average"), ("elevation", "budget", "humidity", "mileage", "voltage")),
    "bool": (("active", "available", "verified", "done", "public", "paid", "enabled", "urgent", "sold_out"),
             ("vegan", "archived", "featured", "insured")),
    "words": (("labels", "colors", "skills", "languages", "cities", "friends", "topics", "names"),
              ("ingredients", "hobbies", "keywords", "instruments")),
    "numbers": (("scores", "values", "prices", "temperatures", "weights", "marks"),
                ("readings", "lap_times", "measurements")),
    "object": (("address", "details", "stats", "meta", "info", "dimensions", "profile", "settings"),
               ("specs", "venue", "coordinates", "extras")),
    "objects": (("entries", "records", "rows", "products", "orders", "members_list"),
                ("tracks", "stops", "courses")),
}
LEAVES = ("person", "city", "word", "text", "date", "int", "number", "bool", "words", "numbers")

# What a made-up record is of; what a list names.
THINGS = (("user", "product", "book", "order", "event", "pet", "car", "hotel", "student", "task", "employee",
           "song", "restaurant", "team", "invoice", "game", "shop", "trip"),
          ("movie", "lighthouse", "bicycle", "podcast", "telescope", "boat"))
FACT_KEYS = {"capital": (("capital",), ("capital_city",)), "continent": (("continent",), ("landmass",)),
             "language": (("language",), ("spoken_language",)), "currency": (("currency",), ("money",)),
             "country": (("country",), ("nation_name",))}
RESULT_KEYS = (("result", "answer", "value", "total"), ("solution", "outcome"))
EXTRACT_KEYS = {"person": (("name", "full_name", "person"), ("individual",)),
                "int": (("age", "years"), ("age_in_years",)),
                "city": (("city", "lives_in", "home_city"), ("residence",)),
                "word": (("color", "favorite_color"), ("favourite_colour",))}
LIST_KEYS = (("list", "items", "names"), ("picks", "selection"))
# Suffixes of made-up keys, by kind (see _key).
SUFFIXES = {"person": ("name", "owner", "contact"), "city": ("city", "town", "place"),
            "word": ("type", "kind", "mode", "status"), "text": ("note", "text", "info"), "date": ("date", "day"),
            "int": ("count", "total", "num", "year"), "number": ("score", "rate", "amount", "value"),
            "bool": ("ok", "flag", "enabled"), "words": ("list", "tags", "names"),
            "numbers": ("values", "scores", "series"), "object": ("info", "data", "details"),
            "objects": ("entries", "items", "records")}
HELDOUT_KEYS = frozenset(k for pools in (*KEYS.values(), *FACT_KEYS.values(), *EXTRACT_KEYS.values(), RESULT_KEYS,
                                         LIST_KEYS) for k in pools[1])

_WORDS = ("red", "blue", "green", "small", "large", "new", "old", "fast", "quiet", "bright", "open", "closed",
          "high", "low", "medium", "round", "square", "happy", "calm", "busy", "sunny", "cloudy", "gold", "silver")
_NOUNS = ("house", "garden", "river", "window", "coffee", "train", "book", "song", "street", "lamp", "market",
          "park", "team", "plan", "letter", "road", "bridge", "ticket", "meal", "room")
_ENUMS = (("low", "medium", "high"), ("small", "medium", "large"), ("yes", "no"), ("todo", "doing", "done"),
          ("red", "green", "blue"), ("new", "used"), ("north", "south", "east", "west"), ("cold", "warm", "hot"),
          ("draft", "final"), ("bronze", "silver", "gold"))
_LISTS = {"colors": W.COLORS, "days": W.WEEKDAYS, "months": W.MONTHS, "cities": W.CITIES, "foods": W.ITEMS,
          "languages": W.LANGUAGES, "countries": tuple(c[0] for c in W.COUNTRIES), "rooms": W.ROOMS}

# How the request asks for JSON: {q} the question, {s} the schema, {k} the keys in words. Training / held-out.
SYSTEM = (("Reply with JSON that matches this schema: {s}", "You answer in JSON only. Schema: {s}",
           "Output a JSON object following this JSON schema: {s}"),
          ("Return only JSON that validates against: {s}",))
WITH_SCHEMA = (("{q}\nReply in JSON matching this schema: {s}", "{q} Use this JSON schema: {s}",
                "{q}\n\nSchema: {s}"),
               ("{q} Format the answer as JSON, schema: {s}",))
WITH_KEYS = (("{q} Reply as JSON with the keys {k}.", "{q} Answer in JSON with the fields {k}.",
              "{q} Give me a JSON object with {k}."),
             ("{q} Put {k} in a JSON object.",))
PLAIN = (("{q} Reply as JSON.", "{q} Answer in JSON.", "{q} Respond with a JSON object.", "{q} JSON only, please.",
          "{q} (json)"),
         ("{q} Please reply in JSON format.", "{q} Output JSON."))


def _key(p: Pick, pools: tuple[tuple[str, ...], tuple[str, ...]], suffixes: tuple[str, ...]) -> str:
    """A key from the training or held-out pool or, in training with ``invent`` > 0, sometimes a made-up one
    (a word, or a word and one of ``suffixes``: ``lamp_count``, ``zorbRate``): the model must then take the
    keys from the schema, and write a short value for a key it has never seen, as for every held-out key."""
    if p.invent > 0 and p.rng.random() < 0.6 * p.invent:
        while True:
            stem = p.word(1, 2) if p.bool() else p.choice(_NOUNS + _WORDS)
            suffix = p.choice(suffixes)
            key = p.choice((stem, f"{stem}_{suffix}", f"{stem}_{suffix}", f"{stem}{suffix.capitalize()}"))
            if key not in HELDOUT_KEYS:
                return key
    return p.choice(pools[p.heldout])


def _new_key(p: Pick, used: dict[str, Any], pools: tuple[tuple[str, ...], tuple[str, ...]],
             suffixes: tuple[str, ...]) -> str:
    """:func:`_key`, drawn again while it is one of ``used``."""
    while True:
        key = _key(p, pools, suffixes)
        if key not in used:
            return key


def _phrase(p: Pick) -> str:
    words = [p.choice(_WORDS) for _ in range(p.int(0, 2))] + [p.choice(_NOUNS)]
    out = " ".join(words)
    return p.choice((out, f"a {out}", f"the {out} in {p.city()}", f"{out} for {p.name()}"))


def _number(p: Pick) -> float | int:
    """A number with few digits: an integer, or one or two decimals."""
    x = p.rng.choice((p.int(0, 9), p.int(10, 99), p.int(100, 999), p.int(1000, 9999)))
    decimals = p.choice((0, 1, 1, 2))
    return x if decimals == 0 else round(x / 10**decimals, decimals)


def _leaf(p: Pick, kind: str, plain: bool = False, made_up: bool = False) -> tuple[Schema, Any]:
    """(schema, value) of one leaf field; most schemas leave the value unbounded, as users write them
    (``plain``: always, and no enums). A ``made_up`` key's word or text is often made up too: whatever the
    model writes for a key it does not know, the string ends after a word or two."""
    bound = not plain and p.rng.random() < 0.25
    if made_up and kind in ("word", "text") and p.bool():
        return {"type": "string"}, " ".join(p.word() for _ in range(p.int(1, 2)))
    if kind == "person":
        name = p.name() if p.bool() else f"{p.name()} {p.choice(W.LAST_NAMES)}"
        return {"type": "string"}, name
    if kind == "city":
        return {"type": "string"}, p.city()
    if kind == "word":
        if not plain and p.rng.random() < 0.4:
            options = list(p.choice(_ENUMS))
            return {"type": "string", "enum": options} if p.bool() else {"enum": options}, p.choice(options)
        return {"type": "string"}, p.choice(_WORDS + W.CONDITIONS)
    if kind == "text":
        text = _phrase(p)
        return ({"type": "string", "maxLength": len(text) + p.int(0, 40)} if bound else {"type": "string"}), text
    if kind == "date":
        return {"type": "string"}, p.date()
    if kind == "int":
        value = p.choice((p.int(0, 20), p.int(0, 200), p.int(1900, 2030)))
        if bound:
            return {"type": "integer", "minimum": 0, "maximum": max(value, p.choice((10, 100, 1000, 10000)))}, value
        return {"type": "integer"}, value
    if kind == "number":
        value = _number(p)
        if bound:
            return {"type": "number", "minimum": 0, "maximum": max(value, p.choice((1, 10, 100, 10000)))}, value
        return {"type": "number"}, value
    if kind == "bool":
        return {"type": "boolean"}, p.bool()
    n = p.int(1, 4)
    if kind == "words":
        pool = p.choice(tuple(_LISTS.values()))
        schema: Schema = {"type": "array", "items": {"type": "string"}}
        value: list[Any] = p.rng.sample(pool, n)
    else:
        schema = {"type": "array", "items": {"type": p.choice(("number", "integer"))}}
        value = [_number(p) if schema["items"]["type"] == "number" else p.int(0, 100) for _ in range(n)]
    if bound:
        schema["maxItems"] = n + p.int(0, 3)
    return schema, value


def _object(p: Pick, n_fields: int, depth: int, copies: int = 1) -> tuple[Schema, list[dict[str, Any]]]:
    """A random object schema of ``n_fields`` fields with distinct keys and ``copies`` documents of it; nests
    one level below the top. Copies (the items of an array of objects) have unbounded leaves, no enums."""
    kinds = list(LEAVES) + (["object", "objects"] if depth == 0 else [])
    props: dict[str, Schema] = {}
    docs: list[dict[str, Any]] = [{} for _ in range(copies)]
    while len(props) < n_fields:
        kind = p.choice(kinds)
        key = _new_key(p, props, KEYS[kind], SUFFIXES[kind])
        if kind == "object":
            props[key], values = _object(p, p.int(2, 3), depth + 1)
        elif kind == "objects":
            item, values = _object(p, 2, depth + 1, copies=p.int(1, 3))
            props[key], values = {"type": "array", "items": item}, [values]
        else:
            made_up = key not in KEYS[kind][p.heldout]
            props[key], first = _leaf(p, kind, copies > 1, made_up)
            values = [first]
            while len(values) < copies:  # number arrays draw number or integer items: keep the schema's
                sub, v = _leaf(p, kind, True, made_up)
                if sub == props[key]:
                    values.append(v)
        for doc, v in zip(docs, values, strict=True):
            doc[key] = v
    return _closed(p, props), docs


def _closed(p: Pick, props: dict[str, Schema]) -> Schema:
    schema: Schema = {"type": "object", "properties": props, "required": list(props)}
    if p.bool():
        schema["additionalProperties"] = False
    return schema


# ---------------------------------------------------------------------------------------------- questions
def _record(p: Pick, mode: str) -> tuple[str, str, Schema, dict[str, Any]]:
    thing = p.choice(THINGS[p.heldout])
    schema, (doc,) = _object(p, p.int(1, 5), 0)
    q = p.choice((f"Make up a sample {thing}.", f"Create an example {thing} record.", f"Give me a fake {thing} "
                  "for testing.", f"Describe a {thing}.", f"Generate test data for one {thing}.")
                 if not p.heldout else (f"Invent a {thing} for my demo.", f"I need a placeholder {thing}."))
    return q, "The user wants JSON. I keep each value short.", schema, doc


def _fact(p: Pick, mode: str) -> tuple[str, str, Schema, dict[str, Any]]:
    row = p.choice(W.COUNTRIES)
    values = {"country": row[0], "capital": row[1], "continent": row[2], "language": row[3], "currency": row[4]}
    fields = p.rng.sample(("capital", "continent", "language", "currency"), p.int(1, 3))
    if p.bool():
        fields.insert(0, "country")
    what = " and ".join(f for f in fields if f != "country")
    q = p.choice((f"What is the {what} of {row[0]}?", f"Tell me the {what} of {row[0]}.", f"{row[0]}: {what}?"))
    doc: dict[str, Any] = {}
    for f in fields:
        doc[_new_key(p, doc, FACT_KEYS[f], ("name", "value"))] = values[f]
    schema = _closed(p, {k: {"type": "string"} for k in doc})
    thought = " ".join(f"The {f} of {row[0]} is {values[f]}." for f in fields if f != "country")
    return q, thought, schema, doc


def _math(p: Pick, mode: str) -> tuple[str, str, Schema, dict[str, Any]]:
    conv = p.choice((arith, convert))(p, mode)  # the held-out split draws held-out operand pairs
    answer = int(conv.expect["answer"])
    key = _key(p, RESULT_KEYS, ("result", "value"))
    schema = _closed(p, {key: {"type": p.choice(("number", "integer"))}})
    thought = conv.messages[-1].get("reasoning_content", "I work it out.")
    return conv.messages[0]["content"], thought, schema, {key: answer}


def _extract(p: Pick, mode: str) -> tuple[str, str, Schema, dict[str, Any]]:
    name, age, city = p.name(), p.int(18, 90), p.city()
    colour = p.choice(W.COLORS)
    said = p.choice((f"{name} is {age} years old and lives in {city}.",
                     f"My friend {name} ({age}) moved to {city} last year.",
                     f"{name}, aged {age}, from {city}, likes the color {colour}."))
    fields = [("person", name), ("int", age), ("city", city)]
    if "color" in said:
        fields.append(("word", colour))
    p.rng.shuffle(fields)
    props, doc = {}, {}
    for kind, value in fields:
        key = _new_key(p, props, EXTRACT_KEYS[kind], SUFFIXES[kind])
        props[key] = {"type": "integer"} if kind == "int" else {"type": "string"}
        doc[key] = value
    q = p.choice((f'Extract the details from this text: "{said}"', f"Pull the facts out of: {said}",
                  f"{said} Turn that into data."))
    return q, "I copy the values from the text.", _closed(p, props), doc


def _list(p: Pick, mode: str) -> tuple[str, str, Schema, dict[str, Any]]:
    what, pool = p.choice(tuple(_LISTS.items()))
    n = p.int(2, 4)
    items = p.rng.sample(pool, n)
    key = _key(p, ((what, *LIST_KEYS[0]), LIST_KEYS[1]), SUFFIXES["words"])
    schema = _closed(p, {key: {"type": "array", "items": {"type": "string"}}})
    q = p.choice((f"Name {n} {what}.", f"List {n} {what}.", f"Give me {n} {what}, please."))
    return q, f"I list {n} {what}.", schema, {key: items}


QUESTIONS: dict[str, Callable[[Pick, str], tuple[str, str, Schema, dict[str, Any]]]] = {
    "record": _record, "fact": _fact, "math": _math, "extract": _extract, "list": _list}
SHARES = {"record": 0.45, "fact": 0.15, "math": 0.15, "extract": 0.1, "list": 0.15}


def _spoken(keys: list[str]) -> str:
    return keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + " and " + keys[-1]


def json_answer(p: Pick, mode: str) -> Conversation:
    """One JSON-answer conversation; ``expect``: ``schema``, ``answer`` (the document), ``question`` (a key of
    :data:`QUESTIONS`) and ``style`` (where the request puts the schema: ``system``, ``schema`` (after the
    question), ``keys`` (their names only) or ``plain`` (nowhere))."""
    kind = p.rng.choices(list(SHARES), weights=list(SHARES.values()))[0]
    q, thought, schema, doc = QUESTIONS[kind](p, mode)
    s = json.dumps(schema)
    x = p.rng.random()
    messages: list[dict[str, Any]] = []
    if x < 0.25:
        style = "system"
        messages.append({"role": "system", "content": p.choice(SYSTEM[p.heldout]).format(s=s)})
        messages.append({"role": "user", "content": q})
    elif x < 0.5:
        style = "schema"
        messages.append({"role": "user", "content": p.choice(WITH_SCHEMA[p.heldout]).format(q=q, s=s)})
    elif x < 0.7:
        style = "keys"
        text = p.choice(WITH_KEYS[p.heldout]).format(q=q, k=_spoken(list(schema["properties"])))
        messages.append({"role": "user", "content": text})
    else:
        style = "plain"
        messages.append({"role": "user", "content": p.choice(PLAIN[p.heldout]).format(q=q)})
    reply: dict[str, Any] = {"role": "assistant", "content": json.dumps(doc)}
    if mode == "thinking":
        reply["reasoning_content"] = thought
    messages.append(reply)
    return Conversation("json", mode, messages,
                        expect={"schema": schema, "answer": doc, "question": kind, "style": style})


def sample_json(rng: random.Random, heldout: bool, mode: str | None = None, invent: float = 0.0) -> Conversation:
    """One JSON-answer conversation in ``mode`` (thinking in a third when None)."""
    p = Pick(rng, heldout, invent)
    if mode is None:
        mode = "thinking" if rng.random() < 1 / 3 else "chat"
    return json_answer(p, mode)


def schema_features(schema: dict[str, Any], depth: int = 0) -> set[str]:
    """What a schema leaves open: ``number`` / ``string`` / ``array`` (no bound), and ``nested``, ``enum``,
    ``boolean`` where it holds one."""
    out: set[str] = set()
    kind = schema.get("type")
    if "enum" in schema:
        out.add("enum")
    elif kind in ("number", "integer") and "maximum" not in schema:
        out.add("number")
    elif kind == "string" and "maxLength" not in schema:
        out.add("string")
    elif kind == "boolean":
        out.add("boolean")
    elif kind == "array":
        if "maxItems" not in schema:
            out.add("array")
        out |= schema_features(schema["items"], depth + 1)
    elif kind == "object":
        if depth:
            out.add("nested")
        for sub in schema["properties"].values():
            out |= schema_features(sub, depth + 1)
    return out


HELDOUT_SEED = 5150


def heldout_set(n: int = 48, seed: int = HELDOUT_SEED) -> list[Conversation]:
    """``n`` held-out JSON requests (held-out keys, record kinds and wordings; a quarter in thinking mode),
    deterministic per seed: the set of ``bench/json_finish.py``."""
    rng = random.Random(f"{seed}-json")
    return [sample_json(rng, heldout=True, mode="thinking" if i % 4 == 3 else "chat") for i in range(n)]
