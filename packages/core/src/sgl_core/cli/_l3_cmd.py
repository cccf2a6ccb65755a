"""The ``l3`` subcommand: L3 page-store set/get bandwidth (``sgl_core.l3._bench``)."""

from __future__ import annotations

import argparse
import importlib
import time

from sgl_core.backends._backend_base import backend as torch_backend
from sgl_core.cli._checks import CliParser, UsageError, check_args, check_memory, exit_status
from sgl_core.cli._report import print_table, write_outputs
from sgl_core.kv._enums import HostLayout

__all__ = ["add_parser", "left_out_stores", "run"]

_ROW_BYTES = (512 + 64) * 2  # one token of one layer: DeepSeek-V3 MLA in bf16


def add_parser(sub: argparse._SubParsersAction[CliParser]) -> None:
    p = sub.add_parser(
        "l3",
        help="L3 page-store set/get GB/s vs memcpy",
        description=(
            "Store pages of a torch-backend host pool in each L3 page store that can run here "
            "(a file store in a temporary directory; Mooncake on 127.0.0.1 when its client is "
            "installed, run only inside a private network namespace with nothing but loopback, "
            "which needs root, since its client listens on every interface), read them back "
            "into other host pages, check them bit for bit, and compare GB/s with a memcpy of "
            "the same bytes. Stores that cannot run are listed with the reason."
        ),
        epilog=exit_status("every page read back bit for bit"),
    )
    p.add_argument("--page-size", type=int, default=64, help="tokens per page (default 64)")
    p.add_argument("--pages", type=int, default=32, help="pages per batch (default 32)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats (default 5)")
    p.add_argument("--layout", default="page_first_direct", help="host layout of the pool")
    p.add_argument("--json", metavar="PATH", help="write {machine, records} as JSON")
    p.add_argument("--layers", type=int, default=61, help=argparse.SUPPRESS)
    p.set_defaults(run=run)


def left_out_stores() -> dict[str, str]:
    """Stores the benchmark cannot run here, each with the reason (and how to add it)."""
    from sgl_core.l3._mooncake_lib import MOONCAKE_INSTALL

    try:
        importlib.import_module("mooncake.store")
    except ImportError as exc:
        hint = (
            "install libibverbs1 (apt-get install -y libibverbs1)"
            if "libibverbs" in str(exc)
            else MOONCAKE_INSTALL
        )
        return {"mooncake": f"its client does not import ({exc}); {hint}"}
    return {}


def run(args: argparse.Namespace) -> int:
    check_args(args, ("page_size", "pages", "repeats", "layers"))  # all checks before any work
    try:
        layout = HostLayout.parse(args.layout, argument="--layout")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if layout not in torch_backend.supported_pairs:
        built = ", ".join(x.value for x in torch_backend.supported_pairs)
        raise UsageError(f"--layout {layout.value!r}: the bench's torch host pool builds {built}")
    batch = args.pages * args.page_size * args.layers * _ROW_BYTES
    # device pool 1x, host pool 2x, a stored copy in memory or page cache 1x
    check_memory("--pages/--page-size", 4 * batch, "the run")
    from sgl_core.l3._bench import run_l3_bench

    skipped = left_out_stores()
    for name, why in skipped.items():
        print(f"note: store {name!r} left out: {why}")
    started = time.perf_counter()
    notes: list[str] = []
    records = run_l3_bench(
        page_size=args.page_size,
        pages=args.pages,
        repeats=args.repeats,
        layout=args.layout,
        layer_num=args.layers,
        notes=notes,
    )
    for note in notes:
        print(note)
    keys = list(dict.fromkeys(k for r in records for k in r))
    rows = [
        [f"{r[k]:.3g}" if isinstance(r.get(k), float) else str(r.get(k, "")) for k in keys]
        for r in records
    ]
    print_table("sgl-bench l3", keys, rows)
    ran = sorted({str(r["store"]) for r in records} - {"memcpy"})
    print(f"stores run: {', '.join(ran) or 'none'}; memcpy = the same bytes by ctypes.memmove")
    if skipped:
        print(f"stores left out: {', '.join(sorted(skipped))} (reasons above)")
    print(f"wall time: {time.perf_counter() - started:.1f} s")
    ok = all(r.get("verified", True) is not False for r in records)
    return write_outputs(args, records, ok, notes=notes, left_out=skipped)
