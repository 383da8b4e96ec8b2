"""``dsa-runtime`` entry point: global plugin options and lazily imported subcommands.

Each subcommand lives in its own module exposing ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``. Modules must import heavy dependencies inside ``run`` only.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from dsa_runtime import __version__
from dsa_runtime.errors import DSAError

SUBCOMMANDS: dict[str, str] = {
    "plugins": "dsa_runtime.cli.plugins_cmd",
    "conformance": "dsa_runtime.cli.conformance_cmd",
    "encode": "dsa_runtime.parsers.cli_encode",
    "parse": "dsa_runtime.parsers.cli_parse",
    "make-checkpoint": "dsa_runtime.cli.make_checkpoint_cmd",
    "inspect": "dsa_runtime.cli.inspect_cmd",
    "generate": "dsa_runtime.cli.generate_cmd",
    "serve": "dsa_runtime.cli.serve_cmd",
    "eval": "dsa_runtime.cli.eval_cmd",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsa-runtime", description="DeepSeek Sparse Attention runtime")
    parser.add_argument("--version", action="version", version=f"dsa-runtime {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level (choices, reasons)")
    parser.add_argument(
        "--plugins",
        metavar="NAMES",
        help="comma-separated allow-list of plugins to load (default: all installed; env DSA_PLUGINS)",
    )
    parser.add_argument(
        "--block-plugin",
        action="append",
        default=[],
        metavar="NAME",
        help="do not load this plugin (repeatable; env DSA_BLOCK_PLUGINS=a,b)",
    )
    parser.add_argument(
        "--trace-plugins", action="store_true", help="print every hook call (env DSA_TRACE_PLUGINS=1)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        sp = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(sp)
        sp.set_defaults(_run=module.run)
    return parser


def _apply_plugin_options(args: argparse.Namespace) -> None:
    # The plugin manager reads the environment, so CLI flags are passed the same way.
    if args.plugins is not None:
        os.environ["DSA_PLUGINS"] = args.plugins
    if args.block_plugin:
        blocked = [b for b in os.environ.get("DSA_BLOCK_PLUGINS", "").split(",") if b]
        os.environ["DSA_BLOCK_PLUGINS"] = ",".join(blocked + args.block_plugin)
    if args.trace_plugins:
        os.environ["DSA_TRACE_PLUGINS"] = "1"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    _apply_plugin_options(args)
    try:
        return int(args._run(args) or 0)
    except DSAError as exc:
        print(f"dsa-runtime: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("dsa-runtime: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
