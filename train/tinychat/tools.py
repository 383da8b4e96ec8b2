"""The tool pool: 31 tools with JSON schemas, each with a request sampler, a fake result and an answer.

A :class:`Task` is one tool call a user asks for: the request sentence, the exact arguments (every value
is written in the request or follows from a word in it), the tool's JSON result and the sentence that
answers from that result. :class:`Pick` draws values from the training or the held-out word lists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from train.tinychat import world as W
from train.tinychat.pick import Pick


@dataclass
class Task:
    tool: str
    request: str
    arguments: dict[str, Any]
    result: dict[str, Any]
    answer: str
    thought: str  # why this call (thinking mode)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    properties: dict[str, Any]
    required: tuple[str, ...]
    sample: Callable[[Pick], Task]

    def schema(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object", "properties": self.properties, "required": list(self.required)}}}


S = {"type": "string"}
I = {"type": "integer"}  # noqa: E741
N = {"type": "number"}
B = {"type": "boolean"}
SA = {"type": "array", "items": {"type": "string"}}


def _t(tool: str, request: str, args: dict, result: dict, answer: str, why: str) -> Task:
    return Task(tool, request, args, result, answer, why)


def _weather(p: Pick) -> Task:
    city = p.city()
    unit = p.choice(("celsius", "fahrenheit"))
    temp, cond = p.int(-5, 35) if unit == "celsius" else p.int(25, 95), p.choice(W.CONDITIONS)
    req = p.choice((f"What's the weather in {city} in {unit}?", f"How is the weather in {city}? Use {unit}.",
                    f"Tell me the current weather for {city} in {unit}, please."))
    return _t("get_weather", req, {"city": city, "unit": unit},
              {"city": city, "temperature": temp, "unit": unit, "condition": cond},
              f"It is {temp} degrees {unit} and {cond} in {city}.", f"The user wants the weather in {city} in {unit}.")


def _weather_simple(p: Pick) -> Task:
    city = p.city()
    temp, cond = p.int(-5, 35), p.choice(W.CONDITIONS)
    req = p.choice((f"What's the weather like in {city}?", f"Is it cold in {city} today?",
                    f"weather in {city}", f"How warm is it in {city} right now?"))
    return _t("get_weather", req, {"city": city},
              {"city": city, "temperature": temp, "unit": "celsius", "condition": cond},
              f"It is {temp} degrees celsius and {cond} in {city}.", f"The user asks about the weather in {city}.")


def _forecast(p: Pick) -> Task:
    city, days = p.city(), p.int(2, 7)
    temps = [p.int(0, 30) for _ in range(days)]
    req = p.choice((f"Give me the {days}-day forecast for {city}.", f"What will the weather be in {city} over the next {days} days?"))
    return _t("get_forecast", req, {"city": city, "days": days}, {"city": city, "daily_high": temps},
              f"Over the next {days} days the highs in {city} are {', '.join(map(str, temps))} degrees.",
              f"A {days}-day forecast for {city}.")


def _time(p: Pick) -> Task:
    city, clock = p.city(), p.clock()
    req = p.choice((f"What time is it in {city}?", f"Tell me the local time in {city}.", f"current time {city}"))
    return _t("get_time", req, {"city": city}, {"city": city, "local_time": clock},
              f"It is {clock} in {city}.", f"The user wants the local time in {city}.")


def _tz(p: Pick) -> Task:
    clock, a, b = p.clock(), *p.rng.sample(W.TIMEZONES, 2)
    out = f"{p.int(0, 23):02d}:{clock[3:]}"
    req = p.choice((f"Convert {clock} {a} to {b}.", f"What is {clock} {a} in {b} time?"))
    return _t("convert_timezone", req, {"time": clock, "from_tz": a, "to_tz": b}, {"time": out, "timezone": b},
              f"{clock} {a} is {out} {b}.", f"Convert {clock} from {a} to {b}.")


_UNITS = (("km", "miles"), ("kg", "pounds"), ("liters", "gallons"), ("meters", "feet"), ("celsius", "fahrenheit"))


def _units(p: Pick) -> Task:
    a, b = p.choice(_UNITS)
    if p.bool():
        a, b = b, a
    value = p.choice((p.int(1, 500), round(p.int(1, 999) / 10, 1)))
    out = round(value * p.choice((0.45, 0.62, 1.61, 2.2, 3.28, 3.79)), 2)
    req = p.choice((f"Use the converter: {value} {a} in {b}?", f"Convert {value} {a} to {b} with the tool."))
    return _t("convert_units", req, {"value": value, "from_unit": a, "to_unit": b}, {"result": out, "unit": b},
              f"{value} {a} is {out} {b}.", f"Convert {value} {a} to {b}.")


def _search(p: Pick) -> Task:
    topic, n = p.topic(), p.int(1, 5)
    titles = [f"{topic.title()} guide part {i}" for i in range(1, min(n, 3) + 1)]
    req = p.choice((f"Search the web for {topic}, top {n} results.", f"Find {n} articles about {topic}."))
    return _t("web_search", req, {"query": topic, "max_results": n}, {"results": titles},
              f"I found: {'; '.join(titles)}.", f"Search for {topic} with {n} results.")


def _event(p: Pick) -> Task:
    title = p.choice(("team meeting", "dentist", "lunch", "yoga class", "project review", "call with mom"))
    date, start = p.date(), p.clock()
    end = f"{min(int(start[:2]) + 1, 23):02d}:{start[3:]}"
    people = sorted({p.name() for _ in range(p.int(1, 3))})
    req = (f"Create an event '{title}' on {date} from {start} to {end} with {' and '.join(people)}.")
    return _t("create_event", req, {"title": title, "date": date, "time": {"start": start, "end": end},
                                    "attendees": people}, {"status": "created", "id": p.int(100, 999)},
              f"Done: '{title}' is on your calendar on {date} from {start} to {end}.",
              f"Create '{title}' on {date}, {start}-{end}, attendees {', '.join(people)}.")


def _list_events(p: Pick) -> Task:
    date = p.date()
    events = [f"{p.clock()} {p.choice(('standup', 'gym', 'lunch', 'review'))}" for _ in range(p.int(1, 3))]
    req = p.choice((f"What's on my calendar on {date}?", f"List my events for {date}."))
    return _t("list_events", req, {"date": date}, {"events": events},
              f"On {date} you have: {', '.join(events)}.", f"List the events of {date}.")


def _email(p: Pick) -> Task:
    name = p.name()
    subject = p.choice(("Lunch", "Report", "Weekend plans", "Invoice", "Meeting notes"))
    body = p.choice(("See you at noon.", "The report is attached.", "Are you free on Saturday?",
                     "Thanks for your help.", "Please call me back."))
    to = f"{name.lower()}@example.com"
    req = f"Email {to} with subject '{subject}' saying: {body}"
    return _t("send_email", req, {"to": to, "subject": subject, "body": body}, {"status": "sent"},
              f"Your email to {to} was sent.", f"Send an email to {to}.")


def _alarm(p: Pick) -> Task:
    clock, label = p.clock(), p.choice(("wake up", "medicine", "gym", "call Bob", "leave for work"))
    repeat = p.bool()
    req = f"Set an alarm for {clock} called '{label}'" + (", every day." if repeat else ", just once.")
    return _t("set_alarm", req, {"time": clock, "label": label, "repeat": repeat}, {"status": "set"},
              f"Alarm '{label}' set for {clock}" + (", repeating daily." if repeat else "."),
              f"Alarm at {clock}, label {label}, repeat {str(repeat).lower()}.")


def _timer(p: Pick) -> Task:
    m = p.int(1, 90)
    req = p.choice((f"Set a timer for {m} minutes.", f"Start a {m} minute timer."))
    return _t("set_timer", req, {"minutes": m}, {"status": "running"}, f"Your {m} minute timer is running.",
              f"A timer of {m} minutes.")


def _shopping(p: Pick) -> Task:
    items = p.items(p.int(1, 4))
    req = p.choice((f"Add {', '.join(items)} to my shopping list.", f"Put {' and '.join(items)} on the shopping list."))
    return _t("add_to_shopping_list", req, {"items": items}, {"status": "added", "count": len(items)},
              f"Added {len(items)} items to your shopping list.", f"Add {', '.join(items)}.")


def _stock(p: Pick) -> Task:
    t, price = p.ticker(), round(p.int(1000, 50000) / 100, 2)
    req = p.choice((f"What's the stock price of {t}?", f"How much is {t} trading at?"))
    return _t("get_stock_price", req, {"ticker": t}, {"ticker": t, "price": price}, f"{t} trades at {price} dollars.",
              f"Price of {t}.")


def _compare(p: Pick) -> Task:
    ts = p.rng.sample(W.TICKERS if not p.heldout else W.TICKERS + W.HELDOUT_TICKERS, p.int(2, 3))
    if p.invent > 0:
        ts = list(dict.fromkeys(p.ticker() if p._fresh() else t for t in ts))
    best = p.choice(ts)
    req = f"Compare the stocks {', '.join(ts)}."
    return _t("compare_stocks", req, {"tickers": ts}, {"best_performer": best}, f"{best} did best this week.",
              f"Compare {', '.join(ts)}.")


_TRANSL = {"good morning": "bonjour", "thank you": "merci"}


def _translate(p: Pick) -> Task:
    phrase, lang = p.phrase(), p.choice(W.LANGUAGES)
    out = f"[{lang} for '{phrase}']"
    req = p.choice((f"Translate '{phrase}' into {lang}.", f"How do you say '{phrase}' in {lang}?"))
    return _t("translate", req, {"text": phrase, "target_language": lang}, {"translation": out},
              f"In {lang}: {out}.", f"Translate '{phrase}' to {lang}.")


def _calc(p: Pick) -> Task:
    a, b, op = p.int(100, 9999), p.int(100, 9999), p.choice(("*", "/"))
    expr = f"{a} {op} {b}"
    val = a * b if op == "*" else round(a / b, 4)
    req = p.choice((f"Use the calculator for {expr}.", f"Calculate {expr} with the calculator tool."))
    return _t("calculate", req, {"expression": expr}, {"value": val}, f"{expr} = {val}.", f"Compute {expr}.")


def _book_table(p: Pick) -> Task:
    rest = p.choice(("Luigi's", "The Blue Door", "Sakura", "El Toro", "Green Leaf", "Casa Mia"))
    people, date, outdoor = p.int(1, 8), p.date(), p.bool()
    req = f"Book a table at {rest} for {people} on {date}" + (", outside." if outdoor else ", inside.")
    return _t("book_table", req, {"restaurant": rest, "people": people, "date": date, "outdoor": outdoor},
              {"status": "confirmed"}, f"Your table at {rest} for {people} on {date} is confirmed.",
              f"Table at {rest}, {people} people, {date}, outdoor {str(outdoor).lower()}.")


def _restaurants(p: Pick) -> Task:
    city, cuisine, price = p.city(), p.choice(("Italian", "Thai", "Mexican", "Indian", "Japanese")), p.int(10, 80)
    names = [f"{cuisine} House", f"Little {city}"]
    req = f"Find {cuisine} restaurants in {city} under {price} dollars."
    return _t("find_restaurants", req, {"city": city, "cuisine": cuisine, "max_price": price}, {"restaurants": names},
              f"Try {names[0]} or {names[1]}.", f"{cuisine} food in {city} under {price}.")


def _flight(p: Pick) -> Task:
    a, b = p.city(), p.city()
    while b == a:
        b = p.city()
    date, adults, kids = p.date(), p.int(1, 4), p.int(0, 3)
    req = f"Book a flight from {a} to {b} on {date} for {adults} adults and {kids} children."
    return _t("book_flight", req, {"origin": a, "destination": b, "date": date,
                                   "passengers": {"adults": adults, "children": kids}},
              {"status": "booked", "flight": f"DS{p.int(100, 999)}"},
              f"Your flight from {a} to {b} on {date} is booked.", f"Flight {a} to {b} on {date}.")


def _fx(p: Pick) -> Task:
    a, b = p.rng.sample(("USD", "EUR", "JPY", "GBP", "CHF", "SEK", "CAD", "AUD"), 2)
    rate = round(p.int(10, 20000) / 1000, 3)
    req = p.choice((f"What's the exchange rate from {a} to {b}?", f"How many {b} for one {a}?"))
    return _t("get_exchange_rate", req, {"base": a, "target": b}, {"rate": rate},
              f"One {a} is {rate} {b}.", f"Rate {a} to {b}.")


def _music(p: Pick) -> Task:
    genre, shuffle = p.choice(("jazz", "rock", "classical", "pop", "blues", "reggae", "folk")), p.bool()
    req = f"Play some {genre}" + (" on shuffle." if shuffle else " in order.")
    return _t("play_music", req, {"genre": genre, "shuffle": shuffle}, {"status": "playing"},
              f"Playing {genre} now.", f"Play {genre}, shuffle {str(shuffle).lower()}.")


def _thermo(p: Pick) -> Task:
    room, temp = p.choice(W.ROOMS), p.choice((p.int(16, 26), p.int(160, 260) / 10))
    req = f"Set the {room} thermostat to {temp} degrees."
    return _t("set_thermostat", req, {"room": room, "temperature": temp}, {"status": "ok"},
              f"The {room} is set to {temp} degrees.", f"Thermostat {room} {temp}.")


def _lights(p: Pick) -> Task:
    room, level, color = p.choice(W.ROOMS), p.int(10, 100), p.choice(W.COLORS)
    req = f"Turn on the {room} lights at {level} percent in {color}."
    return _t("turn_on_lights", req, {"room": room, "brightness": level, "color": color}, {"status": "on"},
              f"The {room} lights are on.", f"Lights in {room}, {level}, {color}.")


def _note(p: Pick) -> Task:
    title = p.choice(("ideas", "books", "trip", "recipe", "todo"))
    content = p.choice(("buy a new lamp", "read more poetry", "visit the museum", "fix the bike"))
    tags = sorted(p.rng.sample(("home", "work", "fun", "urgent", "later"), p.int(1, 2)))
    req = f"Make a note titled '{title}' that says '{content}', tagged {' and '.join(tags)}."
    return _t("create_note", req, {"title": title, "content": content, "tags": tags}, {"status": "saved"},
              f"Saved the note '{title}'.", f"Note '{title}' with tags {', '.join(tags)}.")


def _news(p: Pick) -> Task:
    topic, n = p.topic(), p.int(1, 5)
    req = f"Get me {n} news stories about {topic}."
    heads = [f"New study on {topic}", f"{topic.title()} in the spotlight"][:n]
    return _t("get_news", req, {"topic": topic, "count": n}, {"headlines": heads},
              f"Headlines: {'; '.join(heads)}.", f"{n} stories on {topic}.")


def _directions(p: Pick) -> Task:
    a, b = p.city(), p.city()
    mode = p.choice(("walking", "driving", "transit"))
    mins = p.int(10, 600)
    req = f"How do I get from {a} to {b} by {mode}?"
    return _t("get_directions", req, {"origin": a, "destination": b, "mode": mode}, {"duration_minutes": mins},
              f"By {mode}, {a} to {b} takes about {mins} minutes.", f"Route {a} to {b}, {mode}.")


def _reminder(p: Pick) -> Task:
    text = p.choice(("pay rent", "water the plants", "call the bank", "pick up the kids", "buy a gift"))
    date, clock = p.date(), p.clock()
    req = f"Remind me to {text} on {date} at {clock}."
    return _t("create_reminder", req, {"text": text, "when": {"date": date, "time": clock}}, {"status": "scheduled"},
              f"I'll remind you to {text} on {date} at {clock}.", f"Reminder '{text}' at {date} {clock}.")


def _population(p: Pick) -> Task:
    city, pop = p.city(), p.int(50, 9000) * 1000
    req = p.choice((f"What is the population of {city}?", f"How many people live in {city}?"))
    return _t("get_population", req, {"city": city}, {"city": city, "population": pop},
              f"About {pop} people live in {city}.", f"Population of {city}.")


def _contact(p: Pick) -> Task:
    name = p.name()
    phone = f"555-{p.int(1000, 9999)}"
    req = p.choice((f"Look up {name}'s phone number.", f"What is {name}'s number?"))
    return _t("lookup_contact", req, {"name": name}, {"name": name, "phone": phone}, f"{name}'s number is {phone}.",
              f"Find {name} in contacts.")


def _taxi(p: Pick) -> Task:
    a = p.choice(("home", "the office", "the airport", "the station", "the hotel"))
    b = p.choice(("the museum", "the airport", "downtown", "the stadium", "the beach"))
    seats, premium = p.int(1, 6), p.bool()
    req = f"Order a {'premium' if premium else 'regular'} taxi from {a} to {b} for {seats} people."
    return _t("order_taxi", req, {"pickup": a, "destination": b, "seats": seats, "premium": premium},
              {"status": "on the way", "eta_minutes": p.int(2, 15)}, f"Your taxi from {a} to {b} is on the way.",
              f"Taxi {a} to {b}, {seats} seats, premium {str(premium).lower()}.")


def _air(p: Pick) -> Task:
    city, aqi = p.city(), p.int(5, 180)
    req = f"How is the air quality in {city}?"
    return _t("get_air_quality", req, {"city": city}, {"city": city, "aqi": aqi},
              f"The air quality index in {city} is {aqi}.", f"Air quality in {city}.")


def _en(*values: str) -> dict:
    return {"type": "string", "enum": list(values)}


TOOLS: tuple[Tool, ...] = (
    Tool("get_weather", "Get the current weather in a city", {"city": S, "unit": _en("celsius", "fahrenheit")},
         ("city",), lambda p: _weather(p) if p.bool() else _weather_simple(p)),
    Tool("get_forecast", "Daily forecast for a city", {"city": S, "days": I}, ("city", "days"), _forecast),
    Tool("get_time", "Local time in a city", {"city": S}, ("city",), _time),
    Tool("convert_timezone", "Convert a clock time between time zones", {"time": S, "from_tz": S, "to_tz": S},
         ("time", "from_tz", "to_tz"), _tz),
    Tool("convert_units", "Convert a value between units", {"value": N, "from_unit": S, "to_unit": S},
         ("value", "from_unit", "to_unit"), _units),
    Tool("web_search", "Search the web", {"query": S, "max_results": I}, ("query",), _search),
    Tool("create_event", "Create a calendar event",
         {"title": S, "date": S, "time": {"type": "object", "properties": {"start": S, "end": S}}, "attendees": SA},
         ("title", "date", "time"), _event),
    Tool("list_events", "List calendar events of a day", {"date": S}, ("date",), _list_events),
    Tool("send_email", "Send an email", {"to": S, "subject": S, "body": S}, ("to", "subject", "body"), _email),
    Tool("set_alarm", "Set an alarm", {"time": S, "label": S, "repeat": B}, ("time",), _alarm),
    Tool("set_timer", "Start a countdown timer", {"minutes": I}, ("minutes",), _timer),
    Tool("add_to_shopping_list", "Add items to the shopping list", {"items": SA}, ("items",), _shopping),
    Tool("get_stock_price", "Latest stock price", {"ticker": S}, ("ticker",), _stock),
    Tool("compare_stocks", "Compare several stocks", {"tickers": SA}, ("tickers",), _compare),
    Tool("translate", "Translate text", {"text": S, "target_language": S}, ("text", "target_language"), _translate),
    Tool("calculate", "Evaluate an arithmetic expression", {"expression": S}, ("expression",), _calc),
    Tool("book_table", "Reserve a restaurant table",
         {"restaurant": S, "people": I, "date": S, "outdoor": B}, ("restaurant", "people", "date"), _book_table),
    Tool("find_restaurants", "Find restaurants", {"city": S, "cuisine": S, "max_price": I}, ("city",), _restaurants),
    Tool("book_flight", "Book a flight", {"origin": S, "destination": S, "date": S, "passengers": {
        "type": "object", "properties": {"adults": I, "children": I}}}, ("origin", "destination", "date"), _flight),
    Tool("get_exchange_rate", "Currency exchange rate", {"base": S, "target": S}, ("base", "target"), _fx),
    Tool("play_music", "Play music", {"genre": S, "shuffle": B}, ("genre",), _music),
    Tool("set_thermostat", "Set a room thermostat", {"room": S, "temperature": N}, ("room", "temperature"), _thermo),
    Tool("turn_on_lights", "Turn on lights", {"room": S, "brightness": I, "color": S}, ("room",), _lights),
    Tool("create_note", "Save a note", {"title": S, "content": S, "tags": SA}, ("title", "content"), _note),
    Tool("get_news", "Latest news headlines", {"topic": S, "count": I}, ("topic",), _news),
    Tool("get_directions", "Travel directions", {"origin": S, "destination": S,
                                                 "mode": _en("walking", "driving", "transit")},
         ("origin", "destination"), _directions),
    Tool("create_reminder", "Create a reminder", {"text": S, "when": {
        "type": "object", "properties": {"date": S, "time": S}}}, ("text", "when"), _reminder),
    Tool("get_population", "Population of a city", {"city": S}, ("city",), _population),
    Tool("lookup_contact", "Find a contact's phone number", {"name": S}, ("name",), _contact),
    Tool("order_taxi", "Order a taxi", {"pickup": S, "destination": S, "seats": I, "premium": B},
         ("pickup", "destination"), _taxi),
    Tool("get_air_quality", "Air quality index of a city", {"city": S}, ("city",), _air),
)
TOOL_BY_NAME: dict[str, Tool] = {t.name: t for t in TOOLS}

# Tool pairs only ever offered together in the held-out set.
HELDOUT_PAIRS: frozenset[frozenset[str]] = frozenset({
    frozenset({"get_weather", "get_stock_price"}), frozenset({"get_time", "translate"}),
    frozenset({"set_timer", "get_news"}), frozenset({"get_population", "play_music"}),
})
