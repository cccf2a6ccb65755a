"""``sgl-bench``: the project's main job (see ``sgl-bench --help``)."""

from __future__ import annotations

import argparse
import sys

from sgl_core.cli import _hicache_cmd, _l3_cmd, _moe_cmd
from sgl_core.cli._checks import EXIT_STATUS, CliParser, UsageError
from sgl_core.errors import SGLError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(
        prog="sgl-bench",
        description="Benchmarks of the sgl device packages: host KV-cache transfers, MoE "
        "and L3 page stores.",
        epilog=EXIT_STATUS,
    )
    sub = parser.add_subparsers(dest="command", metavar="{hicache,moe,l3}")
    _hicache_cmd.add_parser(sub)
    _moe_cmd.add_parser(sub)
    _l3_cmd.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``sgl-bench``; returns 0, 1 (a verification failed) or 2 (bad usage)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse reports usage errors (and --help) by exiting
        return exc.code if isinstance(exc.code, int) else 2
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        code: int = args.run(args)
    except (UsageError, SGLError) as exc:
        message = " ".join(str(exc).split())  # one line, whatever the message holds
        print(f"sgl-bench {args.command}: error: {message}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
