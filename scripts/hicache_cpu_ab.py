"""CPU-time A/B of ``sgl-bench hicache`` cases between two trees, for a loaded machine.

Wall-clock rounds cannot resolve 10-30% while other processes load the cores.
This runs the bench's own cases (``_Bench``: same pools, indices, host-slot
mode and contiguous-copy baseline) and times each op with process CPU time,
which leaves out the time other processes hold the cores. Run it on one torch
thread, once per (tree, host mode, page size), alternating the trees::

    OMP_NUM_THREADS=1 PYTHONPATH=<tree>/packages/core/src:<tree>/packages/cuda/src:\\
<tree>/packages/ascend/src python scripts/hicache_cpu_ab.py \\
        run 1 1024 5 0 out/before_r1_s0_p1.json [KINDS [BACKENDS [LAYERS]]]

then ``python scripts/hicache_cpu_ab.py table out`` (file names start with the
tree's name and ``_``). ``KINDS`` is a comma list of ``mla`` (the bench's
DeepSeek-V3 rows, 61 layers), ``mha`` (llama3-70b K/V rows, V as wide as K)
and ``mha_v64`` (the same heads with V of head_dim 64, K and V rows of
different sizes); default all three. ``BACKENDS`` (default ``torch,ascend``)
and ``LAYERS`` (a comma list of ``layout`` or ``layout/io``; default every
pair the backend builds for the kind) narrow a focused re-run. MHA pools have
``MHA_LAYERS`` layers. Per process: ratio = min copy CPU time / min sgl CPU
time over the repeats (higher is better); the table gives per row the median
and best over processes, after/before, and ``noise``, the larger relative
spread (max - min) / median of either tree's ratios.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _cli_module(*names: str) -> Any:
    """A module of the bench CLI: ``sgl_core.cli`` (since the KV-model folders) or
    ``sgl_core._cli`` (trees before them), so one script measures both; the first of
    ``names`` that exists."""
    import importlib

    for name in names:
        for package in ("sgl_core.cli", "sgl_core._cli"):
            try:
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError:
                pass
    raise ModuleNotFoundError(f"no bench CLI module of {names} in this tree")


_MODELS = ("_hicache_models", "_hicache_plan")  # model shapes: before, since the merge


KINDS = ("mla", "mha", "mha_v64")
MHA_MODEL = "llama3-70b"  # 8 KV heads x 128
MHA_LAYERS = 16  # a fraction of the model's 80: pools of 4 KiB a token and layer
NARROW_V = 64


def _narrow_v_pools(v_head_dim: int) -> None:
    """Make the bench's MHA device pools have V rows of ``v_head_dim``.

    The bench's models keep V as wide as K; every tree measured here takes
    ``v_head_dim`` in ``create_mha_device_pool``, so the script swaps the
    bench module's pool factory for one that passes it.
    """
    _hicache = _cli_module("_hicache")
    original = _hicache.create_device_pool

    def create(backend: Any, cfg: Any, **kw: Any) -> Any:
        shape = _cli_module(*_MODELS).MODELS[cfg.model]
        if not shape.is_mha:
            return original(backend, cfg, **kw)
        return backend.create_mha_device_pool(
            size=kw["size"],
            page_size=kw["page_size"],
            dtype=shape.dtype,
            head_num=shape.head_num,
            head_dim=shape.head_dim,
            layer_num=cfg.layers,
            device=cfg.device,
            v_head_dim=v_head_dim,
        )

    _hicache.create_device_pool = create


def _wanted(layout: str, io: str, layouts: set[str] | None) -> bool:
    return layouts is None or layout in layouts or f"{layout}/{io}" in layouts


def run(
    page_size: int,
    tokens: int,
    repeats: int,
    shuffle: bool,
    out: Path,
    kinds: tuple[str, ...] = KINDS,
    backends: tuple[str, ...] = ("torch", "ascend"),
    layouts: set[str] | None = None,
) -> None:
    import sgl_core

    bench = _cli_module("_hicache")
    Case, HicacheConfig, _Bench = bench.Case, bench.HicacheConfig, bench._Bench

    records: list[dict[str, object]] = []
    for kind in kinds:
        if kind == "mha_v64":
            _narrow_v_pools(NARROW_V)
        mha = kind != "mla"
        for name in backends:
            backend = sgl_core.get_backend(name)
            pairs = backend.supported_mha_pairs if mha else backend.supported_pairs
            for layout, ios in dict(pairs).items():
                for io in sorted(ios, key=lambda i: i.value):
                    if not _wanted(layout.value, io.value, layouts):
                        continue
                    if mha:
                        cfg = HicacheConfig(
                            tokens=tokens, shuffle_host=shuffle, model=MHA_MODEL, layers=MHA_LAYERS
                        )
                    else:
                        cfg = HicacheConfig(tokens=tokens, shuffle_host=shuffle)
                    bench = _Bench(Case(backend, layout, io, page_size), cfg)
                    host, dev = bench.copy_host, bench.copy_dev
                    ops: dict[str, Callable[[], object]] = {
                        "copy_backup": functools.partial(host.copy_, dev, non_blocking=True),
                        "sgl_backup": bench.sgl_backup,
                        "copy_load": functools.partial(dev.copy_, host, non_blocking=True),
                        "sgl_load": bench.sgl_load,
                    }
                    times: dict[str, list[float]] = {k: [] for k in ops}
                    for op in ops.values():  # warm-up
                        op()
                    for _ in range(repeats):
                        for key, op in ops.items():
                            start = time.process_time()
                            op()
                            times[key].append(time.process_time() - start)
                    for direction in ("backup", "load"):
                        sgl, copy = times["sgl_" + direction], times["copy_" + direction]
                        records.append(
                            {
                                "kind": kind,
                                "backend": name,
                                "layout": layout.value,
                                "io": io.value,
                                "page_size": page_size,
                                "direction": direction,
                                "shuffle": shuffle,
                                "ratio_min": min(copy) / min(sgl),
                            }
                        )
                    del bench
    out.write_text(json.dumps(records))


def table(folder: Path) -> None:
    Key = tuple[bool, str, str, str, int, str]
    rows: dict[Key, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(folder.glob("*.json")):
        side = path.stem.split("_")[0]
        for r in json.loads(path.read_text()):
            # files of the MLA-only script: no kind, no io (one io per layout there)
            layout = r["layout"] + ("/" + r["io"] if "io" in r else "")
            key: Key = (
                r["shuffle"],
                r.get("kind", "mla"),
                r["backend"],
                layout,
                r["page_size"],
                r["direction"],
            )
            rows[key][side].append(r["ratio_min"])
    print(
        "| host | kind | backend | layout/io | page | dir | n | before | after | a/b | best"
        " | noise | slower |"
    )
    print("|" + "---|" * 13)
    for key in sorted(rows):
        b, a = rows[key]["before"], rows[key]["after"]
        if not a or not b:
            continue
        mb, ma = statistics.median(b), statistics.median(a)
        noise = max((max(b) - min(b)) / mb, (max(a) - min(a)) / ma)
        host = "shuffle" if key[0] else "alloc"
        # slower beyond noise: the median ratio dropped by more than the larger spread
        slower = "**yes**" if ma / mb < 1 - noise else ""
        print(
            f"| {host} | {key[1]} | {key[2]} | {key[3]} | {key[4]} | {key[5]} "
            f"| {min(len(a), len(b))} | {mb:.3f} | {ma:.3f} | {ma / mb:.2f} "
            f"| {max(a) / max(b):.2f} | {noise:.2f} | {slower} |"
        )


def main(argv: list[str]) -> None:
    if argv[:1] == ["run"] and 6 <= len(argv) <= 9:
        run(
            int(argv[1]),
            int(argv[2]),
            int(argv[3]),
            argv[4] == "1",
            Path(argv[5]),
            tuple(argv[6].split(",")) if len(argv) > 6 else KINDS,
            tuple(argv[7].split(",")) if len(argv) > 7 else ("torch", "ascend"),
            set(argv[8].split(",")) if len(argv) > 8 else None,
        )
    elif argv[:1] == ["table"] and len(argv) == 2:
        table(Path(argv[1]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
