"""Skip a server test module, with the reason, when the [server] extra is not installed."""

from __future__ import annotations

import pytest


def server_extra() -> None:
    for module in ("fastapi", "uvicorn", "prometheus_client", "httpx"):
        pytest.importorskip(module, reason="server tests need: pip install -e '.[server,test]'")
