"""Synthetic chat data for the embedded tiny V3.2 model (issue 13).

Everything is generated from the word lists and templates in this package (no downloads):

* :mod:`~dsa_runtime.tinychat.world` -- the small built-in world (cities, countries, facts, names);
* :mod:`~dsa_runtime.tinychat.tools` -- a pool of ~30 tools with JSON schemas, argument samplers and results;
* :mod:`~dsa_runtime.tinychat.dialogs` -- conversation builders (greetings, facts, arithmetic and unit
  conversions with reasoning, tool use);
* :mod:`~dsa_runtime.tinychat.dataset` -- rendering in the V3.2 encoding of :mod:`dsa_runtime.parsers`,
  with the character spans of the assistant turns (the loss mask), and the train / held-out split.
"""
