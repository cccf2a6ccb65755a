"""Mutation testing of the modules that protect data (mutmut 3), area by area.

Run through ``scripts/mutation.sh`` (README, "Developing"). For each area this
lays out a scratch tree under ``.mutation/AREA/``: the three packages' sources
flattened into ``src/`` (mutmut names a mutant after its module path below
``src/``, so ``packages/*/src`` would give names that never match the imported
module) and the packages' tests, plus a copy of ``pyproject.toml`` with a
``[tool.mutmut]`` section naming the area's modules and test files. mutmut then
mutates those modules, maps every test to the functions it calls, and runs only
the covering tests against each mutant (forked from a server process, since
torch is not fork-safe after use).

A mutant counts as killed only when a test *fails* (pytest exit 1: an assertion
or a typed error escaping a test). Survivors, mutants no test reaches, timeouts
and crashes all count against the area unless ``scripts/mutation-allowlist.txt``
names them as equivalent (one name per line, then ``#`` and the reason why the
mutant cannot change behaviour). The kill rate is killed / (all - allowlisted).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWLIST = ROOT / "scripts" / "mutation-allowlist.txt"
PACKAGES = {"sgl_core": "core", "sgl_cuda": "cuda", "sgl_ascend": "ascend"}
THRESHOLD = 0.90

CORE = "packages/core/tests/"
L3 = "packages/core/tests/l3/"
CUDA = "packages/cuda/tests/"
ASCEND = "packages/ascend/tests/"


@dataclass(frozen=True)
class Area:
    modules: tuple[str, ...]  # paths below src/
    tests: tuple[str, ...]  # test files or directories, relative to the repository
    # mutmut name globs; empty means every function of the modules
    functions: tuple[str, ...] = ()


FI = "sgl_core.l3._file_index.xǁFileIndexǁ"
SG = "sgl_core.integrations.sglang."

# Only functions that check arguments, account for slots and bytes, merge runs
# or map keys to pages are mutated: on the shared 2-core machine a mutant costs
# about 6 s of wall time, so the whole modules (about 3,400 mutants) would take
# hours. docs/mutation.md lists what is left out.
AREAS: dict[str, Area] = {
    "validation": Area(
        modules=(
            "sgl_core/kv/_validation.py",
            "sgl_core/kv/host/_host_slots.py",
            "sgl_core/kv/host/_host_pool.py",
            "sgl_core/kv/host/_load_memo.py",
        ),
        tests=(
            CORE + "test_validation.py",
            CORE + "test_pools.py",
            CORE + "test_load_memo.py",
            CORE + "test_page_meta_inputs.py",
            CORE + "test_faults_transfer.py",
            CORE + "test_conformance_torch.py",
            CORE + "test_mutation_validation.py",
            CORE + "test_unique_check.py",
            CORE + "test_caller_indices.py",
        ),
        functions=(
            "sgl_core.kv._validation.x_check_index_bounds__*",
            "sgl_core.kv._validation.x_check_unique__*",
            "sgl_core.kv._validation.x_index_values__*",
            "sgl_core.kv._validation.x_check_page_runs__*",
            "sgl_core.kv._validation.x_check_layer_id__*",
            "sgl_core.kv.host._host_slots.xǁHostSlotsǁfree__*",
            "sgl_core.kv.host._host_slots.xǁHostSlotsǁalloc__*",
            "sgl_core.kv.host._host_slots.xǁHostSlotsǁ_check_page_start__*",
            "sgl_core.kv.host._host_pages.xǁTokenPagesǁget_page_buffer_meta__*",
        ),
    ),
    "copy": Area(
        modules=(
            "sgl_core/transfer/copy/_copy.py",
            "sgl_core/transfer/copy/_pieces.py",
            "sgl_core/transfer/copy/_engine.py",
            "sgl_core/transfer/_direct_mover.py",
        ),
        tests=(
            CORE + "test_copy_paths.py",
            CORE + "test_engine.py",
            CORE + "test_faults_transfer.py",
            CORE + "test_mutation_copy.py",
            CORE + "test_copy_threads.py",
            CORE + "test_shared_copy.py",
            CORE + "test_caller_indices.py",
            CORE + "test_unique_check.py",
            CORE + "test_stream_gather.py",
        ),
        functions=(
            "sgl_core.transfer.copy._pieces.x_merge_runs__*",
            "sgl_core.transfer.copy._pieces.x_index_array__*",
            "sgl_core.transfer.copy._pieces.xǁ_Interfaceǁ*",
            "sgl_core.transfer.copy._pieces.x_numpy_rows__*",
            "sgl_core.transfer.copy._pieces.x_page_numbers__*",
            "sgl_core.transfer.copy._pieces.x_distinct_count__*",
            "sgl_core.transfer.copy._pieces.x_in_range__*",
            "sgl_core.transfer.copy._pieces.xǁIndexRunsǁ*",
            "sgl_core.transfer.copy._copy.x_memmove_blocks__*",
            "sgl_core.transfer.copy._copy.x_copy_pieces__*",
            "sgl_core.transfer.copy._copy.x__spread__*",
            "sgl_core.transfer.copy._copy.x__share__*",
            # pieces cover every byte of a block exactly once (the calibrated copy threads)
            *(
                f"sgl_core.transfer.copy._pieces.x_{name}__*"
                for name in ("_cut", "split_pieces", "split_parts")
            ),
        ),
    ),
    "stream": Area(
        modules=(
            "sgl_core/transfer/copy/_stream.py",
            "sgl_core/transfer/copy/_stream_table.py",
            "sgl_core/transfer/copy/_steps.py",
            "sgl_core/transfer/_direct_load.py",
        ),
        tests=(
            CORE + "test_stream_copy.py",
            CORE + "test_stream_kernels.py",
            CORE + "test_stream_order.py",
            CORE + "test_load_steps.py",
            CORE + "test_cold_calibration.py",
            CORE + "test_copy_threads.py",
            CORE + "test_caller_indices.py",
        ),
        functions=(
            *(
                f"sgl_core.transfer.copy._stream.x_{name}__*"
                for name in (
                    "cpu_flags",
                    "pick_kernel",
                    "_map_code",
                    "_load",
                    "stream_copy",
                    "stream_each",
                )
            ),
            *(
                f"sgl_core.transfer.copy._stream_table.x_{name}__*"
                for name in (
                    "ops_table",
                    "_blocks_overlap",
                    "_byte_copyable",
                    "_unit_blocks",
                    "_units_table",
                    "_stretches",
                    "slice_ops",
                    "piece_bytes",
                    "_runs_continue",
                    "_run_spans",
                    "rows_ops",
                    "rows_table",
                )
            ),
            *(
                f"sgl_core.transfer.copy._steps.x_{name}__*"
                for name in (
                    "_resolve",
                    "memmove_step",
                    "slices_shape",
                    "slices_step",
                    "_stream_built",
                    "_take_parts",
                    "gather_step",
                )
            ),
            "sgl_core.transfer._direct_load.x_backup_slices__*",
            "sgl_core.transfer._direct_load.x_slices_may_copy__*",
            "sgl_core.transfer._direct_load.x_backup_path__*",
        ),
    ),
    # the streaming team: a kept table's parts taken once each, by seated threads
    "team": Area(
        modules=(
            "sgl_core/transfer/copy/_stream_team.py",
            "sgl_core/transfer/copy/_stream.py",
            "sgl_core/transfer/copy/_steps.py",
            "sgl_core/transfer/copy/_copy.py",
        ),
        tests=(
            CORE + "test_stream_team.py",
            CORE + "test_stream_copy.py",
            CORE + "test_stream_kernels.py",
            CORE + "test_copy_threads.py",
            CORE + "test_load_steps.py",
        ),
        functions=(
            "sgl_core.transfer.copy._stream_team.x_*",
            "sgl_core.transfer.copy._stream_team.xǁTeamǁ*",
            "sgl_core.transfer.copy._stream_team.xǁ_Helperǁ*",
            "sgl_core.transfer.copy._stream.x_map_page__*",
            "sgl_core.transfer.copy._stream.x_check_table__*",
            "sgl_core.transfer.copy._steps.x__stream_step__*",
            "sgl_core.transfer.copy._copy.x_shutdown_copy_threads__*",
            "sgl_core.transfer.copy._copy.x_at_shutdown__*",
        ),
    ),
    # the busy-core check: a calibrated ATen team runs only with a free core per thread
    "busy": Area(
        modules=(
            "sgl_core/transfer/copy/_busy.py",
            "sgl_core/transfer/copy/_calibrate.py",
            "sgl_core/transfer/copy/_calibration_cache.py",
            "sgl_core/transfer/copy/_decide.py",
            "sgl_core/transfer/copy/_turns.py",
            "sgl_core/transfer/copy/_auto_copy.py",
            "sgl_core/transfer/copy/_stream_gather.py",
        ),
        tests=(
            CORE + "test_busy_cores.py",
            CORE + "test_calibrate.py",
            CORE + "test_confirm_calls.py",
            CORE + "test_stream_gather.py",
            CORE + "test_shared_copy.py",
        ),
        functions=(
            "sgl_core.transfer.copy._busy.x_*",
            "sgl_core.transfer.copy._busy.xǁCoreWatchǁ*",
            "sgl_core.transfer.copy._decide.x_*",
            "sgl_core.transfer.copy._decide.xǁTrialǁ*",
            "sgl_core.transfer.copy._decide.xǁTrialsǁ*",
            "sgl_core.transfer.copy._turns.x_*",
            "sgl_core.transfer.copy._calibrate.xǁCalibratorǁchoose__*",
            "sgl_core.transfer.copy._calibrate.xǁCalibratorǁturn__*",
            "sgl_core.transfer.copy._calibrate.xǁCalibratorǁwithdraw__*",
            "sgl_core.transfer.copy._calibrate.xǁCalibratorǁconfirming__*",
            "sgl_core.transfer.copy._calibrate.xǁCalibratorǁobserve__*",
            "sgl_core.transfer.copy._calibrate.xǁCalibratorǁ_settle__*",
            "sgl_core.transfer.copy._calibrate.xǁCalibratorǁskip__*",
            "sgl_core.transfer.copy._calibrate.xǁCalibratorǁ_measure__*",
            "sgl_core.transfer.copy._calibrate.xǁCalibratorǁ_margin__*",
            "sgl_core.transfer.copy._calibrate.xǁCalibratorǁskipped__*",
            "sgl_core.transfer.copy._calibration_cache.x_host_id__*",
            "sgl_core.transfer.copy._auto_copy.x__run__*",
            "sgl_core.transfer.copy._auto_copy.x_thread_ranks__*",
            "sgl_core.transfer.copy._stream_gather.x_*",
        ),
    ),
    "l3": Area(
        modules=tuple(
            f"sgl_core/l3/{name}.py"
            for name in ("_file_store", "_file_index", "_file_disk", "_record", "_keys", "_pages")
        ),
        tests=(
            L3 + "test_l3_file_store.py",
            L3 + "test_l3_keys.py",
            L3 + "test_l3_faults.py",
            L3 + "test_l3_conformance.py",
            L3 + "test_mutation_l3.py",
        ),
        functions=(
            FI + "_drop_corrupt__*",
            FI + "_drop__*",
            FI + "_make_room__*",
            "sgl_core.l3._keys.x_page_keys__*",
            "sgl_core.l3._pages.x_check_keys__*",
            "sgl_core.l3._pages.x_resolve_pages__*",
        ),
    ),
    "l3read": Area(
        modules=tuple(
            f"sgl_core/l3/{name}.py" for name in ("_file_store", "_record", "_file_disk")
        ),
        tests=(
            # not test_l3_faults: its writer processes take a minute per surviving
            # mutant, and test_mutation_l3read covers every check of a read
            L3 + "test_l3_file_store.py",
            L3 + "test_l3_root_hold.py",
            L3 + "test_mutation_l3.py",
            L3 + "test_mutation_l3read.py",
        ),
        functions=(
            "sgl_core.l3._file_store.xǁFilePageStoreǁ_read_page__*",
            "sgl_core.l3._record.xǁPageHeaderǁ*",
            "sgl_core.l3._record.x_key_digest__*",
            "sgl_core.l3._file_disk.x_hold_root__*",
        ),
    ),
    "memo": Area(
        modules=("sgl_core/kv/host/_load_memo.py",),
        tests=(
            CORE + "test_load_memo.py",
            CORE + "test_mutation_validation.py",
            CORE + "test_mutation_memo.py",
        ),
    ),
    "hostkv": Area(
        modules=tuple(
            f"sgl_core/{name}.py"
            for name in (
                "kv/_spec",
                "kv/host/_host_args",
                "kv/host/_host_kinds",
                "kv/host/_host_pages",
                "kv/host/_token_host_pool",
                "kv/device/_indexer",
                "kv/host/_indexer_host",
            )
        ),
        tests=(
            CORE + "test_kv_spec.py",
            CORE + "test_pools.py",
            CORE + "test_mha_pools.py",
            CORE + "test_dsa_pools.py",
            CORE + "test_mutation_hostkv.py",
        ),
        functions=(
            "sgl_core.kv._spec.*",
            "sgl_core.kv.host._host_pool.xǁHostPoolBaseǁcheck_device_pool__*",
            "sgl_core.kv.host._host_slots.xǁHostSlotsǁpage_format_fields__*",
            "sgl_core.kv.host._host_kinds.xǁMHAHostPoolBaseǁ_read_shape__*",
            *(
                f"sgl_core.kv.host._token_host_pool.xǁTokenHostPoolǁ{name}__*"
                for name in ("_allocate_buffers", "_check_device_pool_kind", "_device_list")
            ),
            *(
                f"sgl_core.kv.host._host_pages.xǁTokenPagesǁ{name}__*"
                for name in (
                    "get_data_page",
                    "set_from_flat_data_page",
                    "get_page_buffer_meta",
                    "_objects",
                )
            ),
            "sgl_core.kv.device._indexer.xǁIndexerConfigǁ*",
            "sgl_core.kv.device._indexer.x_check_indexer__*",
            "sgl_core.kv.device._indexer.x_indexer_of__*",
            "sgl_core.kv.device._indexer.xǁIndexerRowsǁindexer_slot__*",
            "sgl_core.kv.host._indexer_host.x_check_device_indexer__*",
            "sgl_core.kv.host._indexer_host.xǁIndexerMoverǁload__*",
        ),
    ),
    "integrations": Area(
        modules=tuple(
            f"sgl_core/integrations/sglang/{name}.py"
            for name in ("_storage_config", "_storage", "_host")
        ),
        tests=(
            L3 + "test_l3_sglang_backend.py",
            L3 + "test_l3_sglang_v2.py",
            CORE + "test_sglang_adapters.py",
            CORE + "test_mutation_integrations.py",
        ),
        functions=(
            *(
                f"{SG}_storage_config.x_{name}__*"
                for name in ("shard_key_parts", "rank_root_name", "_rank", "_count", "_flag")
            ),
            *(
                f"{SG}_storage.xǁSGLangPageStorageǁ{name}__*"
                for name in (
                    "__init__",
                    "register_mem_pool_host",
                    "_keys",
                    "batch_exists",
                    "exists",
                    "register_mem_host_pool_v2",
                    "_entry",
                    "_move_v2",
                )
            ),
            f"{SG}_storage_config.x_transfer_slots__*",
            f"{SG}_host.xǁSGLangHostPoolǁ__init____*",
        ),
    ),
    "moe": Area(
        modules=("sgl_core/moe/_moe.py",),
        tests=(CORE + "test_moe.py", CORE + "test_faults_moe.py", CORE + "test_mutation_moe.py"),
        functions=(
            "sgl_core.moe._moe.x_check_routing__*",
            "sgl_core.moe._moe.x_maybe_fuse_routed_scale_and_shared_add__*",
            "sgl_core.moe._moe.x__capability__*",
            "sgl_core.moe._moe.x__finite_real__*",
            "sgl_core.moe._moe.x_folds_routed_scale__*",
            "sgl_core.moe._moe.xǁMoEWeightsǁ__post_init____*",
        ),
    ),
    "kvcacheio": Area(
        modules=("sgl_cuda/kvcacheio.py", "sgl_cuda/_kv_checks.py", "sgl_cuda/_direct.py"),
        tests=(
            CUDA + "test_kvcacheio.py",
            CUDA + "test_kvcacheio_mha.py",
            CUDA + "test_faults_cuda.py",
            CUDA + "test_mutation_kvcacheio.py",
        ),
        functions=(
            # The O(1) argument checks moved to _kv_checks (kvcacheio re-exports them
            # under their old names, which the tests use).
            *(
                f"sgl_cuda._kv_checks.x_{name}__*"
                for name in (
                    "words",
                    "check_indices",
                    "check_table",
                    "check_buffer",
                    "check_layer_id",
                    "check_page_size",
                    "check_head_num",
                )
            ),
            "sgl_cuda._kv_checks.x_side_words__*",
            "sgl_cuda.kvcacheio.x_transfer_kv_per_layer_mla_pf_lf__*",
        ),
    ),
    "ascend": Area(
        modules=("sgl_ascend/_transfer.py",),
        tests=(
            ASCEND + "test_ascend_pools.py",
            ASCEND + "test_faults_ascend.py",
            ASCEND + "test_kernel_ascend.py",
            ASCEND + "test_mutation_ascend.py",
            ASCEND + "test_ascend_mha_seam.py",
        ),
        functions=(
            "sgl_ascend._transfer.x_plan_pages__*",
            "sgl_ascend._transfer.x_backup_rows__*",
            "sgl_ascend._transfer.x__run_copies__*",
            "sgl_ascend._transfer.x__short_runs__*",
            "sgl_ascend._transfer.x__page_bytes__*",
            "sgl_ascend._transfer.x__row_addresses__*",
        ),
    ),
}

SKIPPED_LINES = [r"^\s*raise \w", r"^\s*logger\.\w+\("]
KILLED = {1, 3}
STATUS = {0: "survived", 33: "no tests", 5: "no tests", 34: "skipped", None: "not checked"}


def _status(code: int | None) -> str:
    if code in KILLED:
        return "killed"
    if code in (24, -24, 36, 152, 255):
        return "timeout"
    return STATUS.get(code, f"crashed ({code})")


def _module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def load_allowlist() -> dict[str, str]:
    allowed: dict[str, str] = {}
    if not ALLOWLIST.exists():
        return allowed
    for raw in ALLOWLIST.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, reason = line.partition("#")
        if not sep or not reason.strip():
            sys.exit(f"{ALLOWLIST.name}: every entry needs '# reason': {raw!r}")
        allowed[name.strip()] = reason.strip()
    return allowed


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(item) for item in items) + "]"


def _copy_tests(scratch: Path, spec: Area, baseline: bool = False) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in PACKAGES.values():
        shutil.copytree(
            ROOT / "packages" / folder / "tests",
            scratch / "packages" / folder / "tests",
            ignore=ignore,
            dirs_exist_ok=True,
        )
    # A test file not written yet stays in the selection as an empty module,
    # so a later --survivors run finds its new tests without a new baseline.
    for test in spec.tests:
        new = Path(test).name.startswith("test_mutation_")
        if not (scratch / test).exists() or (baseline and new):
            (scratch / test).write_text('"""Not written yet."""\n')


def lay_out(spec: Area, scratch: Path, baseline: bool) -> None:
    """The scratch tree: flattened sources, the tests, pyproject.toml with mutmut's section."""
    if scratch.exists():
        shutil.rmtree(scratch)
    (scratch / "src").mkdir(parents=True)
    # exists before the interpreter starts: a missing sys.path folder is cached
    # as "nothing here" and the installed, unmutated package would be imported
    (scratch / "mutants" / "src").mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package, folder in PACKAGES.items():
        shutil.copytree(
            ROOT / "packages" / folder / "src" / package, scratch / "src" / package, ignore=ignore
        )
    _copy_tests(scratch, spec, baseline)
    config = [
        "",
        "[tool.mutmut]",
        'source_paths = ["src"]',
        f"only_mutate = {_toml_list(['src/' + module for module in spec.modules])}",
        f"also_copy = {_toml_list(['packages/' + f + '/tests' for f in PACKAGES.values()])}",
        f"pytest_add_cli_args_test_selection = {_toml_list(list(spec.tests))}",
        'pytest_add_cli_args = ["-p", "no:cacheprovider"]',
        'process_isolation = "forkserver"',
        # error messages and log lines are not data: a raise or log statement
        # is left whole (whether the raise is reached is what the tests check)
        f"do_not_mutate_patterns = {_toml_list(SKIPPED_LINES)}",
        "use_git_change_detection = false",
        "",
    ]
    text = (ROOT / "pyproject.toml").read_text() + "\n".join(config)
    (scratch / "pyproject.toml").write_text(text)


def _patterns(spec: Area, only: list[str] | None = None) -> list[str]:
    if only:
        return only
    return list(spec.functions) or [_module_name(m) + ".*" for m in spec.modules]


def run_area(
    area: str,
    spec: Area,
    scratch: Path,
    jobs: int,
    survivors: bool,
    baseline: bool,
    only: list[str] | None = None,
) -> None:
    if survivors:
        allowed = load_allowlist()
        names = [
            n
            for n, c in collect(spec, scratch, only).items()
            if _status(c) != "killed" and n not in allowed
        ]
        if not names:
            return
        _copy_tests(scratch, spec)
    else:
        lay_out(spec, scratch, baseline)
        names = _patterns(spec, only)
    env = dict(os.environ)
    paths = [str(scratch / "mutants" / "src")]
    if env.get("MUTMUT_SITE"):
        paths.append(env["MUTMUT_SITE"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["TRITON_INTERPRET"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")  # small tensors; spare the shared cores
    log = scratch / "mutmut.log"
    with log.open("a" if survivors else "w") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs), *names],
            cwd=scratch,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if proc.returncode != 0:
        print(f"[{area}] mutmut exited {proc.returncode}; see {log}", file=sys.stderr)


def collect(spec: Area, scratch: Path, only: list[str] | None = None) -> dict[str, int | None]:
    codes: dict[str, int | None] = {}
    patterns = _patterns(spec, only)
    for module in spec.modules:
        meta = scratch / "mutants" / "src" / (module + ".meta")
        if not meta.exists():
            continue
        data = json.loads(meta.read_text())
        for name, code in data["exit_code_by_key"].items():
            if any(fnmatch(name, pattern) for pattern in patterns):
                codes[name] = code
    return codes


def report(area: str, codes: dict[str, int | None], allowed: dict[str, str]) -> float:
    total = len(codes)
    equivalent = [name for name in codes if name in allowed]
    counted = {n: c for n, c in codes.items() if n not in allowed}
    killed = sum(1 for c in counted.values() if _status(c) == "killed")
    rate = killed / len(counted) if counted else 0.0
    print(
        f"{area:<11} mutants {total:4d}  allowlisted {len(equivalent):3d}  "
        f"killed {killed:4d}/{len(counted):<4d} {rate:7.1%}"
    )
    by_function: dict[tuple[str, str], int] = {}
    for name, code in counted.items():
        status = _status(code)
        if status != "killed":
            key = (name.partition("__mutmut_")[0], status)
            by_function[key] = by_function.get(key, 0) + 1
    for (function, status), count in sorted(by_function.items()):
        print(f"    {count:3d} {status:<12} {function}")
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("areas", nargs="*", help=f"default: all of {', '.join(AREAS)}")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2)))
    parser.add_argument("--out", type=Path, default=ROOT / ".mutation")
    parser.add_argument(
        "--report-only", action="store_true", help="summarize the last run, run nothing"
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="run without the test_mutation_*.py files (the 'before' numbers)",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="GLOB",
        help="run and report only the area's mutants whose names match GLOB (repeatable)",
    )
    parser.add_argument(
        "--survivors",
        action="store_true",
        help="rerun only the last run's non-killed mutants, with the current tests",
    )
    args = parser.parse_args()
    unknown = [area for area in args.areas if area not in AREAS]
    if unknown:
        parser.error(f"unknown area(s) {unknown}; choose from {list(AREAS)}")
    allowed = load_allowlist()
    rates: dict[str, float] = {}
    for area in args.areas or list(AREAS):
        spec = AREAS[area]
        scratch = args.out / area
        if not args.report_only:
            run_area(area, spec, scratch, args.jobs, args.survivors, args.baseline, args.only)
        codes = collect(spec, scratch, args.only)
        rates[area] = report(area, codes, allowed) if codes else 0.0
        if not codes:
            print(f"{area:<11} no results (see {scratch / 'mutmut.log'})")
    low = [area for area, rate in rates.items() if rate < THRESHOLD]
    if low:
        print(f"below {THRESHOLD:.0%}: {', '.join(low)}")
        return 1
    print(f"every area at or above {THRESHOLD:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
