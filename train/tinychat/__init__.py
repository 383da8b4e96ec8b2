"""Synthetic chat data to train the embedded tiny V3.2 model (``train/train_tiny.py``, ``train_nextn.py``).

Training code, not part of the installed ``dsa_runtime`` package: import it as ``train.tinychat`` with the
checkout on ``sys.path`` (the training scripts add it; pytest does for the tests). Everything is generated
from the word lists and templates in this package (no downloads):

* :mod:`~train.tinychat.world` -- the small built-in world (cities, countries, facts, names);
* :mod:`~train.tinychat.tools` -- a pool of ~30 tools with JSON schemas, argument samplers and results;
* :mod:`~train.tinychat.dialogs` -- conversation builders (greetings, facts, arithmetic and unit
  conversions with reasoning, tool use);
* :mod:`~train.tinychat.json_answers` -- requests for JSON (a schema in the prompt, its keys, or none) and
  short valid documents, the share that teaches constrained JSON output to end;
* :mod:`~train.tinychat.dataset` -- rendering in the V3.2 encoding of :mod:`dsa_runtime.parsers`,
  with the character spans of the assistant turns (the loss mask), and the train / held-out split;
* :mod:`~train.tinychat.tokenizer` -- the 3072-id BPE tokenizer trained on those chats (the embedded model's).
"""
