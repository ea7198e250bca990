"""The `pyinfer` command line: `pyinfer info | pull`."""

from __future__ import annotations

import argparse
import json
import sys

from pyinfer.errors import GGUFError
from pyinfer.models import DEFAULT_MODEL, KNOWN_MODELS, ModelNotFoundError, pull, resolve_model


def _cmd_info(args: argparse.Namespace) -> int:
    from pyinfer.gguf import GGUFReader
    from pyinfer.info import format_info, model_info

    with GGUFReader(resolve_model(args.model)) as r:
        info = model_info(r)
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        print(format_info(info, tensors=args.tensors))
    return 0


def _cmd_pull(args: argparse.Namespace) -> int:
    if args.list:
        for m in KNOWN_MODELS.values():
            default = " (default)" if m.name == DEFAULT_MODEL else ""
            print(f"{m.name:<12} {m.description}{default}")
        return 0
    print(pull(args.name, force=args.force))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pyinfer", description="Fast LLM inference on CPUs.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    info = sub.add_parser("info", help="describe a model: dimensions, tensors, bytes per token")
    info.add_argument("model", nargs="?", default=None, help="GGUF path or known model name (default: smollm2)")
    info.add_argument("--json", action="store_true", help="print machine-readable JSON")
    info.add_argument("--tensors", action="store_true", help="list every tensor")
    info.set_defaults(func=_cmd_info)

    pl = sub.add_parser("pull", help="fetch a known model into the cache")
    pl.add_argument("name", nargs="?", default=DEFAULT_MODEL, help="model name (default: %(default)s)")
    pl.add_argument("--list", action="store_true", help="list the known models")
    pl.add_argument("--force", action="store_true", help="fetch again even if present")
    pl.set_defaults(func=_cmd_pull)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (GGUFError, ModelNotFoundError, RuntimeError, ValueError) as e:
        print(f"pyinfer {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
