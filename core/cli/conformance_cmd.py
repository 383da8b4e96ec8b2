"""``dsa-runtime conformance NAME``: run the conformance kit against a backend and print the results.

Exit status: 0 when at least one case ran and no case failed, raised or crashed; 1 otherwise (a backend
that claims no case of the selection fails, saying why); 130 when interrupted (Ctrl-C; the table and the
JSON report of the cases run so far are still written); an unknown or unavailable backend is a
``ConfigError`` (one line, exit 2, printed by the CLI's main). torch is imported only inside :func:`run`.
"""

from __future__ import annotations

import argparse
import sys

from dsa_runtime.families import FAMILIES

HELP = "run the conformance kit against a backend (vs the reference backend)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name", metavar="NAME",
        help="backend name (see 'dsa-runtime plugins'), or 'module:callable' returning a Backend",
    )
    parser.add_argument("--full", action="store_true", help="add the full tier: V3.2's real shapes (GPU)")
    parser.add_argument("--json", metavar="PATH", help="also write the JSON report here (atomically)")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="device of the backend (default: cuda when claimed and available, else cpu)",
    )
    parser.add_argument(
        "--oracle-device", choices=("cpu", "cuda"), help="device of the reference (default: same as --device)"
    )
    parser.add_argument(
        "--family",
        action="append",
        choices=FAMILIES,
        metavar="F",
        help=f"only this family (repeatable; {', '.join(FAMILIES)})",
    )
    parser.add_argument("-k", dest="keyword", metavar="SUBSTRING", help="only cases whose id contains SUBSTRING")
    parser.add_argument(
        "--isolate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the cases in a worker process replaced after a crash (segfault, illegal memory access); "
        "default: on when the device is cuda",
    )
    parser.add_argument(
        "--case-timeout", type=float, metavar="SECONDS", help="with --isolate: kill and report a case running longer"
    )
    parser.add_argument("--failures-only", action="store_true", help="list only cases that did not pass")
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress on stderr (default: when stderr is a terminal)",
    )


def run(args: argparse.Namespace) -> int:
    from dsa_runtime.testing.runner import run_conformance

    report = run_conformance(
        args.name,
        full=args.full,
        device=args.device,
        families=args.family,
        oracle_device=args.oracle_device,
        keyword=args.keyword,
        progress=args.progress,
        isolate=args.isolate,
        json_path=args.json,
        case_timeout_s=args.case_timeout,
    )
    print(report.format_table(show_passed=not args.failures_only))
    if args.json:  # written by the run (after every case and at the end)
        print(f"JSON report written to {args.json}", file=sys.stderr)
    if reason := report.nothing_claimed:
        print(f"dsa-runtime: {reason}", file=sys.stderr)
    if report.interrupted:
        return 130
    return 0 if report.ok else 1
