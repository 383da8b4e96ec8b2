"""Special tokens and the fixed English text of the DeepSeek-V3.2 tools block.

The tools-block wording below is the text of the golden prompt (``tests/parsers/golden/dsv32_encoding_output.txt``),
one tuple entry per line so that blank lines are visible: a port that collapsed them drifted from what the
model was trained on (upstream bug 24 in docs/parsers.md). ``tests/parsers/test_encoding_v32.py`` checks it against the
golden file byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_START = "<think>"
THINK_END = "</think>"

DSML = "｜DSML｜"
FUNCTION_CALLS_START = f"<{DSML}function_calls>"
FUNCTION_CALLS_END = f"</{DSML}function_calls>"
INVOKE_END = f"</{DSML}invoke>"
PARAMETER_END = f"</{DSML}parameter>"

# Lines of the tools block up to and including ``<functions>``; the JSON schema lines and
# ``</functions>`` follow (see render_tools_block).
_TOOLS_PREAMBLE_LINES: tuple[str, ...] = (
    "## Tools",
    "",
    "You have access to a set of tools you can use to answer the user's question.",
    f'You can invoke functions by writing a "<{DSML}function_calls>" block like the following as part of'
    " your reply to the user:",
    f"<{DSML}function_calls>",
    f'<{DSML}invoke name="$FUNCTION_NAME">',
    f'<{DSML}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{DSML}parameter>',
    "...",
    f"</{DSML}invoke>",
    f'<{DSML}invoke name="$FUNCTION_NAME2">',
    "...",
    f"</{DSML}invoke>",
    f"</{DSML}function_calls>",
    "",
    "String and scalar parameters should be specified as is without any escaping or quotes, while lists and"
    ' objects should use JSON format. The "string" attribute should be set to "true" for string type'
    ' parameters and "false" for other types (numbers, booleans, arrays, objects).',
    "",
    "If the thinking_mode is enabled, then after function results you should strongly consider outputting a"
    " thinking block. Here is an example:",
    "",
    f"<{DSML}function_calls>",
    "...",
    f"</{DSML}function_calls>",
    "",
    "<function_results>",
    "...",
    "</function_results>",
    "",
    "<think>...thinking about results</think>",
    "",
    "Here are the functions available in JSONSchema format:",
    "<functions>",
)
TOOLS_PREAMBLE = "\n".join(_TOOLS_PREAMBLE_LINES) + "\n"
TOOLS_EPILOGUE = "</functions>\n"

RESPONSE_FORMAT_PREAMBLE = (
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
)


def to_json(value: Any) -> str:
    """JSON the way the official encoder writes it: default separators, non-ASCII kept as is."""
    return json.dumps(value, ensure_ascii=False)


def render_tools_block(functions: Sequence[Mapping[str, Any]]) -> str:
    """The tools block for already-unwrapped function schemas (``tool["function"]`` of OpenAI tools).

    Ends with ``</functions>\\n``; the caller adds the ``\\n\\n`` that separates it from what precedes.
    """
    schema_lines = "\n".join(to_json(dict(fn)) for fn in functions)
    return TOOLS_PREAMBLE + schema_lines + "\n" + TOOLS_EPILOGUE


def render_response_format(response_format: Any) -> str:
    """The response-format section (schema as one JSON line, no trailing newline)."""
    return RESPONSE_FORMAT_PREAMBLE + to_json(response_format)
