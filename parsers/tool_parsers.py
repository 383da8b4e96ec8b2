"""The registered tool-call parsers: a primary wire format plus the other one's unambiguous starts.

Each is a :class:`~dsa_runtime.parsers.scanner.ToolParser`: one instance per request, ``feed(text)`` /
``finish(truncated)`` returning events. Most callers want :class:`dsa_runtime.parsers.OutputParser`.
"""

from __future__ import annotations

from dsa_runtime.parsers.dsml import DsmlFormat
from dsa_runtime.parsers.markers import DSML_STARTS, TOKEN_STARTS
from dsa_runtime.parsers.scanner import ToolParser
from dsa_runtime.parsers.v31 import TokenFormat


class DeepSeekV32ToolParser(ToolParser):
    """DeepSeek-V3.2 DSML blocks; also V3.1-style token blocks (a V3.2-Exp model or V3.1 template; upstream bug 5)."""

    name = "deepseekv32"
    formats = (DsmlFormat, TokenFormat)
    reasoning_stops = DSML_STARTS + TOKEN_STARTS


class DeepSeekV31ToolParser(ToolParser):
    """DeepSeek-V3.1 / V3.2-Exp special-token calls; also DSML blocks (a V3.2 model behind it; upstream bug 6)."""

    name = "deepseekv31"
    formats = (TokenFormat, DsmlFormat)
    reasoning_stops = TOKEN_STARTS + DSML_STARTS


class DeepSeekV3ToolParser(DeepSeekV31ToolParser):
    """DeepSeek-V3 (0324) / R1-0528 fenced calls; the same token format reads V3 and V3.1 call layouts."""

    name = "deepseekv3"
