"""The small built-in world: word lists the generator draws from, and the held-out split.

Facts are public knowledge written out by hand. Entities listed under ``HELDOUT_*`` never appear in
training conversations; the evaluation uses them to check that tool arguments are copied from the request
rather than remembered.
"""

from __future__ import annotations

# (country, capital, continent, language, currency)
COUNTRIES: tuple[tuple[str, str, str, str, str], ...] = (
    ("France", "Paris", "Europe", "French", "euro"),
    ("Germany", "Berlin", "Europe", "German", "euro"),
    ("Italy", "Rome", "Europe", "Italian", "euro"),
    ("Spain", "Madrid", "Europe", "Spanish", "euro"),
    ("Portugal", "Lisbon", "Europe", "Portuguese", "euro"),
    ("Poland", "Warsaw", "Europe", "Polish", "zloty"),
    ("Sweden", "Stockholm", "Europe", "Swedish", "krona"),
    ("Norway", "Oslo", "Europe", "Norwegian", "krone"),
    ("Greece", "Athens", "Europe", "Greek", "euro"),
    ("Ireland", "Dublin", "Europe", "English", "euro"),
    ("Japan", "Tokyo", "Asia", "Japanese", "yen"),
    ("China", "Beijing", "Asia", "Chinese", "yuan"),
    ("India", "New Delhi", "Asia", "Hindi", "rupee"),
    ("Thailand", "Bangkok", "Asia", "Thai", "baht"),
    ("Vietnam", "Hanoi", "Asia", "Vietnamese", "dong"),
    ("Egypt", "Cairo", "Africa", "Arabic", "pound"),
    ("Kenya", "Nairobi", "Africa", "Swahili", "shilling"),
    ("Nigeria", "Abuja", "Africa", "English", "naira"),
    ("Morocco", "Rabat", "Africa", "Arabic", "dirham"),
    ("Brazil", "Brasilia", "South America", "Portuguese", "real"),
    ("Argentina", "Buenos Aires", "South America", "Spanish", "peso"),
    ("Peru", "Lima", "South America", "Spanish", "sol"),
    ("Chile", "Santiago", "South America", "Spanish", "peso"),
    ("Canada", "Ottawa", "North America", "English", "dollar"),
    ("Mexico", "Mexico City", "North America", "Spanish", "peso"),
    ("Cuba", "Havana", "North America", "Spanish", "peso"),
    ("Australia", "Canberra", "Oceania", "English", "dollar"),
    ("Fiji", "Suva", "Oceania", "English", "dollar"),
)

# Cities used as tool arguments (weather, time, travel); the held-out ones are only in the evaluation.
CITIES: tuple[str, ...] = (
    "Paris", "Berlin", "Rome", "Madrid", "Lisbon", "Warsaw", "Stockholm", "Oslo", "Athens", "Dublin",
    "Tokyo", "Beijing", "Bangkok", "Hanoi", "Cairo", "Nairobi", "Lima", "Santiago", "Ottawa", "Havana",
    "London", "Vienna", "Prague", "Munich", "Milan", "Naples", "Porto", "Seville", "Valencia", "Lyon",
    "Marseille", "Hamburg", "Zurich", "Geneva", "Brussels", "Amsterdam", "Copenhagen", "Helsinki",
    "Budapest", "Krakow", "Istanbul", "Dubai", "Mumbai", "Delhi", "Seoul", "Osaka", "Kyoto", "Shanghai",
    "Sydney", "Melbourne", "Toronto", "Vancouver", "Chicago", "Boston", "Denver", "Seattle", "Miami",
    "Austin", "Houston", "Phoenix", "Dallas", "Atlanta", "Montreal", "Quito", "Bogota", "Caracas",
    "Accra", "Lagos", "Dakar", "Tunis", "Algiers", "Doha", "Riyadh", "Tehran", "Karachi", "Dhaka",
    "Manila", "Jakarta", "Singapore", "Perth", "Auckland", "Wellington", "Reykjavik", "Tallinn", "Riga",
    "Vilnius", "Sofia", "Bucharest", "Belgrade", "Zagreb", "Ljubljana", "Bratislava", "Salzburg",
    "Florence", "Venice", "Turin", "Bologna", "Granada", "Bilbao", "Nice", "Bordeaux", "Cologne",
    "Leipzig", "Dresden", "Antwerp", "Rotterdam", "Utrecht", "Bergen", "Gothenburg", "Malmo", "Aarhus",
)
HELDOUT_CITIES: tuple[str, ...] = (
    "Kigali", "Windhoek", "Tbilisi", "Yerevan", "Almaty", "Tashkent", "Ulaanbaatar", "Kathmandu",
    "Colombo", "Hobart", "Cusco", "Montevideo", "Asuncion", "La Paz", "Valletta", "Nicosia", "Split",
    "Gdansk", "Tampere", "Trondheim",
)

FIRST_NAMES: tuple[str, ...] = (
    "Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry", "Irene", "Jack", "Karen", "Leo",
    "Maria", "Nina", "Oscar", "Paula", "Quinn", "Rosa", "Sam", "Tina", "Umar", "Vera", "Walter", "Xena",
    "Yusuf", "Zoe", "Anna", "Ben", "Chloe", "Dan", "Eva", "Felix", "Hugo", "Ivy", "Jonas", "Kim", "Lara",
    "Mia", "Noah", "Olga", "Pedro", "Ruth", "Sara", "Tom", "Ugo", "Victor", "Wendy", "Yara",
)
HELDOUT_NAMES: tuple[str, ...] = ("Bartholomew", "Esmeralda", "Ignatius", "Philippa", "Thaddeus", "Wilhelmina")

LAST_NAMES: tuple[str, ...] = (
    "Smith", "Garcia", "Muller", "Rossi", "Novak", "Silva", "Kim", "Chen", "Tanaka", "Okafor", "Larsen",
    "Dubois", "Kowalski", "Moreau", "Jensen", "Costa", "Ivanova", "Nakamura", "Haddad", "Brown",
)

# Search topics / product words / notes.
TOPICS: tuple[str, ...] = (
    "solar panels", "electric cars", "sourdough bread", "chess openings", "jazz history", "mountain bikes",
    "coffee beans", "house plants", "rock climbing", "ancient Rome", "black holes", "sea turtles",
    "python decorators", "vegan recipes", "marathon training", "bird watching", "wind power", "honey bees",
    "pottery", "sailing knots", "volcanoes", "rainforests", "tea ceremonies", "film cameras", "board games",
)
HELDOUT_TOPICS: tuple[str, ...] = ("glacier caves", "origami cranes", "moon rocks", "desert foxes")

ITEMS: tuple[str, ...] = (
    "milk", "eggs", "bread", "apples", "rice", "cheese", "tomatoes", "onions", "coffee", "butter", "pasta",
    "bananas", "carrots", "yogurt", "lemons", "flour", "sugar", "beans", "tea", "honey",
)
HELDOUT_ITEMS: tuple[str, ...] = ("figs", "quinoa", "saffron", "walnuts")

TICKERS: tuple[str, ...] = ("ACME", "BOLT", "CRUX", "DYNA", "EPIC", "FLUX", "GLOW", "HALO", "IRIS", "JADE",
                            "KITE", "LUNA", "MOXY", "NOVA", "ORCA", "PIXL")
HELDOUT_TICKERS: tuple[str, ...] = ("QUBE", "RAVN", "SKYE")

LANGUAGES: tuple[str, ...] = ("French", "German", "Spanish", "Italian", "Japanese", "Portuguese", "Dutch",
                              "Swedish", "Polish", "Greek")
PHRASES: tuple[str, ...] = ("good morning", "thank you", "where is the station", "how much is this",
                            "see you tomorrow", "I am hungry", "the bill please", "happy birthday",
                            "good night", "nice to meet you")
HELDOUT_PHRASES: tuple[str, ...] = ("the train is late", "I lost my keys")

WEEKDAYS: tuple[str, ...] = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS: tuple[str, ...] = ("January", "February", "March", "April", "May", "June", "July", "August",
                           "September", "October", "November", "December")
CONDITIONS: tuple[str, ...] = ("sunny", "cloudy", "rainy", "windy", "foggy", "snowy", "clear", "stormy")
TIMEZONES: tuple[str, ...] = ("UTC", "CET", "EST", "PST", "JST", "IST", "GMT", "AEST")
COLORS: tuple[str, ...] = ("red", "blue", "green", "yellow", "purple", "orange", "black", "white")
ROOMS: tuple[str, ...] = ("kitchen", "bedroom", "living room", "office", "garage", "hallway", "bathroom")
