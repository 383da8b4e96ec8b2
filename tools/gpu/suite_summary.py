"""Summaries for tools/gpu/run_gpu_suite.sh (plain Python, no dsa_runtime import: it reads reports only).

    python3 tools/gpu/suite_summary.py backends          # available backends that claim CUDA, one a line
    python3 tools/gpu/suite_summary.py junit REPORT.xml  # "pytest -m gpu: N passed, F failed, E errors, S skipped"
    python3 tools/gpu/suite_summary.py kit REPORT.json   # "passed/claimed" of one conformance report
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET


def backends() -> list[str]:
    out = subprocess.run([sys.executable, "-m", "dsa_runtime.cli.main", "plugins", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return [b["name"] for plugin in json.loads(out)["plugins"] for b in plugin.get("backends") or []
            if b["available"] and "cuda" in b["devices"]]


def junit(path: str) -> str:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return "pytest -m gpu: no report"
    suites = [root] if root.tag == "testsuite" else list(root)
    tot = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    passed = tot["tests"] - tot["failures"] - tot["errors"] - tot["skipped"]
    return (f"pytest -m gpu: {passed} passed, {tot['failures']} failed, {tot['errors']} errors, "
            f"{tot['skipped']} skipped")


def kit(path: str) -> str:
    try:
        with open(path) as f:
            s = json.load(f)["summary"]
    except (OSError, ValueError, KeyError):
        return "no report"
    bad = s["failed"] + s["errors"] + s["crashed"]
    return f"{s['passed']}/{s['passed'] + bad}" + (f" ({bad} not passed)" if bad else "")


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "backends":
        print("\n".join(backends()))
    elif what == "junit":
        print(junit(sys.argv[2]))
    elif what == "kit":
        print(kit(sys.argv[2]))
    else:
        sys.exit(f"unknown summary {what!r}")
