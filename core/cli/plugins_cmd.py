"""``dsa-runtime plugins``: every plugin, its hardware, the families it provides and why others are missing."""

from __future__ import annotations

import argparse
import json
import sys

from dsa_runtime.families import FAMILIES, METHODS

HELP = "list plugins, platforms, backends and parsers, with availability and reasons"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument(
        "--resolve", action="store_true", help="also show what each kernel family resolves to on this machine"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --resolve: a KernelConfig field (platform, device, kv_layout, indexer, topk, sparse_attn, "
        "kv_quant, moe, sparse_attn_prefill, sparse_attn_decode) or a method (sparse_attn.prefill, "
        "topk.topk_transform...) instead of auto, e.g. --set sparse_attn.decode=reference, or a model need "
        "checked against the claims (heads, index_heads, k, page_size, decode_queries, scale_fmt, weight_dtype), "
        "e.g. --set heads=128 (repeatable)",
    )


def parse_settings(items: list[str]) -> dict[str, object]:
    """``["topk=reference", "sparse_attn.prefill=x", "heads=128", ...]`` -> KernelConfig keyword arguments
    (methods go into ``methods``, model needs into ``needs``: not a KernelConfig field, see :func:`collect`);
    unknown keys are a ConfigError."""
    from dsa_runtime.errors import ConfigError
    from dsa_runtime.families import METHODS
    from dsa_runtime.kernel_needs import NEED_KEYS
    from dsa_runtime.resolve import config_fields

    valid = config_fields()
    settings: dict[str, object] = {}
    methods: dict[str, str] = {}
    needs: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not value or (key not in valid and key not in METHODS and key not in NEED_KEYS):
            raise ConfigError(
                f"--set {item!r}: expected KEY=VALUE with KEY one of {', '.join(valid)}, a method "
                f"({', '.join(METHODS)}) or a model need ({', '.join(NEED_KEYS)})"
            )
        if key in METHODS:
            methods[key] = value
        elif key in NEED_KEYS:
            needs[key] = int(value) if value.isdigit() else value
        else:
            settings[key] = value
    if methods:
        settings["methods"] = methods
    if needs:
        settings["needs"] = needs
    return settings


def collect(resolve: bool = False, settings: dict[str, object] | None = None) -> dict:
    """Everything ``plugins`` shows, as plain data."""
    from dsa_runtime.plugin_manager import BUILTIN_PLUGINS, GROUPS, get_manager

    manager = get_manager()
    plugins = []
    builtin_order = list(BUILTIN_PLUGINS)
    ordered = sorted(
        manager.reports.items(),
        key=lambda kv: (GROUPS.index(kv[1].group) if kv[1].group in GROUPS else 9, builtin_order.index(kv[0]) if kv[0] in builtin_order else len(builtin_order), kv[0]),
    )
    for key, report in ordered:
        entry: dict = {
            "name": report.name,
            "group": report.group,
            "source": report.source,
            "status": report.status,
            "reason": report.reason,
            "problems": list(report.problems),
            "platforms": [],
            "backends": [],
            "parsers": [],
        }
        for platform in manager.platforms.values():
            if platform.plugin != key:
                continue
            detection = platform.detect()
            provided = sorted(
                {f for b in manager.backends.values() if b.platform == platform.name for f in b.kernels}
            )
            entry["platforms"].append(
                {
                    "name": platform.name,
                    "description": platform.description,
                    "present": detection.present,
                    "reason": detection.reason,
                    "details": dict(detection.details),
                    "families_provided": provided,
                    "families_unavailable": {
                        f: platform.family_notes.get(f, "no kernel registered") for f in FAMILIES if f not in provided
                    },
                }
            )
        for backend in manager.backends.values():
            if backend.plugin != key:
                continue
            ok, why = backend.available()
            caps = backend.capabilities
            entry["backends"].append(
                {
                    "name": backend.name,
                    "platform": backend.platform,
                    "description": backend.description,
                    "available": ok,
                    "reason": why,
                    "families": sorted(backend.kernels),
                    "devices": sorted(caps.devices),
                    "methods": caps.describe(),
                    "not_provided": {
                        f: caps.not_claimed.get(f, "not provided") for f in FAMILIES if f not in backend.kernels
                    }
                    | {
                        m: caps.unclaimed_reason(m) or ""
                        for m in METHODS
                        if m.split(".")[0] in backend.kernels and caps.claim(m) is None
                    },
                }
            )
        for spec in manager.parsers.values():
            if spec.plugin == key:
                entry["parsers"].append({"name": spec.name, "kind": spec.kind, "aliases": list(spec.aliases)})
        plugins.append(entry)
    result: dict = {"plugins": plugins}
    if resolve:
        from dsa_runtime.resolve import KernelConfig, resolve_kernels

        fields = dict(settings or {})
        needs = fields.pop("needs", None)
        resolved = resolve_kernels(KernelConfig(**fields), manager=manager, needs=needs)  # type: ignore[arg-type]
        result["resolved"] = {
            "platform": resolved.platform,
            "device": resolved.device,
            "kv_layout": resolved.kv_layout,
            "needs": dict(resolved.needs),
            "choices": {m: {"backend": c.backend, "reason": c.reason} for m, c in resolved.choices.items()},
        }
    return result


def _print_text(data: dict, out=None) -> None:
    out = out or sys.stdout
    for plugin in data["plugins"]:
        status = plugin["status"] + (f": {plugin['reason']}" if plugin["reason"] else "")
        print(f"{plugin['name']}  [{plugin['group']}]  {plugin['source']}  -- {status}", file=out)
        for problem in plugin["problems"]:
            print(f"    ! {problem}", file=out)
        for p in plugin["platforms"]:
            mark = "present" if p["present"] else "absent"
            print(f"    platform {p['name']}: {mark} ({p['reason']})", file=out)
            libs = ", ".join(f"{k} {v}" for k, v in p["details"].items())
            if libs:
                print(f"      libraries: {libs}", file=out)
            print(f"      families provided: {', '.join(p['families_provided']) or 'none'}", file=out)
            for family, why in p["families_unavailable"].items():
                print(f"      {family}: {why}", file=out)
        for b in plugin["backends"]:
            mark = "available" if b["available"] else f"unavailable: {b['reason']}"
            print(
                f"    backend {b['name']}: {mark}; families {', '.join(b['families'])}; devices {', '.join(b['devices'])}",
                file=out,
            )
            partial = {f for f in b["families"] if any(m.split(".")[0] == f for m in b["not_provided"])}
            for method, claim in b["methods"].items():
                if method.split(".")[0] in partial:  # a family claimed in part: say what is claimed
                    print(f"      {method}: claimed ({claim})", file=out)
            for family, why in b["not_provided"].items():
                print(f"      {family}: {why}", file=out)
        if plugin["parsers"]:
            listed = ", ".join(f"{p['kind']}:{p['name']}" for p in plugin["parsers"])
            print(f"    parsers: {listed}", file=out)
    if "resolved" in data:
        r = data["resolved"]
        print(f"\nresolved on this machine: platform {r['platform']}, device {r['device']}, KV {r['kv_layout']}", file=out)
        print(f"    checked against: {', '.join(f'{k} {v}' for k, v in r['needs'].items())}", file=out)
        for method, choice in r["choices"].items():
            print(f"    {method:<28} -> {choice['backend']} ({choice['reason']})", file=out)


def run(args: argparse.Namespace) -> int:
    settings = parse_settings(args.set)
    if settings and not args.resolve:
        from dsa_runtime.errors import ConfigError

        raise ConfigError("--set only makes sense with --resolve")
    data = collect(resolve=args.resolve, settings=settings)
    if args.json:
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_text(data)
    failed = [p["name"] for p in data["plugins"] if p["status"] == "failed" or p["problems"]]
    return 1 if failed else 0
