"""Accuracy evaluation of a chat endpoint (``dsa-runtime eval``): question sets, prompts, answer checks.

* :mod:`~dsa_runtime.evals.extract` -- numbers out of replies and references, the tool-call check;
* :mod:`~dsa_runtime.evals.datasets` -- ``--data``: JSONL files, the downloaded gsm8k, the shipped sets;
* :mod:`~dsa_runtime.evals.prompts` -- few-shot chat messages;
* :mod:`~dsa_runtime.evals.clients` -- one chat turn over HTTP (OpenAI API) or on an in-process engine;
* :mod:`~dsa_runtime.evals.runner` -- N concurrent clients, per-question records, the summary.
"""
