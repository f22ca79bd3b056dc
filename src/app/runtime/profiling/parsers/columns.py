"""Column maps: tool CSV headers -> our snake_case names, one table per tool version.

A new Nsight release that renames a column is a new table here, not a hunt through code.
"""
from __future__ import annotations

import re
import sys

from app.errors import ToolNotFound

NCU_2025_3 = {
    "ID": "id",
    "Process ID": "pid",
    "Kernel Name": "kernel",
    "Block Size": "block",
    "Grid Size": "grid",
    "Device": "device",
    "CC": "cc",
    "Context": "context",
    "Stream": "stream",
    "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg": "nvtx",
    "Section Name": "section",
    "Metric Name": "metric",
    "Metric Unit": "unit",
    "Metric Value": "value",
    "Rule Name": "rule",
    "Rule Type": "rule_type",
    "Rule Description": "rule_description",
    "Estimated Speedup Type": "speedup_type",
    "Estimated Speedup": "speedup_pct",
    # metrics (raw page)
    "gpu__time_duration.sum": "duration_ns",
    "dram__bytes_read.sum": "dram_read_bytes",
    "dram__bytes_write.sum": "dram_write_bytes",
    "sm__sass_thread_inst_executed_op_ffma_pred_on.sum": "ffma",
    "sm__sass_thread_inst_executed_op_fadd_pred_on.sum": "fadd",
    "sm__sass_thread_inst_executed_op_fmul_pred_on.sum": "fmul",
    "sm__sass_thread_inst_executed_op_dfma_pred_on.sum": "dfma",
    "sm__sass_thread_inst_executed_op_dadd_pred_on.sum": "dadd",
    "sm__sass_thread_inst_executed_op_dmul_pred_on.sum": "dmul",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    # The full section set has no dram__throughput; its Speed Of Light "DRAM Throughput" is this one.
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct_sol",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "lts__t_sector_hit_rate.pct": "l2_hit_pct",
    "local__spill_bytes": "local_spill_bytes",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum": "local_load_bytes",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum": "local_store_bytes",
    "launch__waves_per_multiprocessor": "waves_per_sm",
    "launch__registers_per_thread": "registers",
    "launch__block_size": "block_threads",
    "launch__grid_size": "grid_blocks",
}

# The metric set annotation mode asks for (one short replay, no sections).
ANNOTATION_METRICS = [k for k in NCU_2025_3 if "__" in k and k != "local__spill_bytes"]

COLUMN_MAPS = {"2025.3": NCU_2025_3}

# The units of the metrics read from the raw page. ncu prints base units with --print-units base (what
# both counter modes ask for: "ns", "byte", "%", "inst", "register/thread", and no unit for a count); with
# other settings it scales by SI prefixes ("usecond", "Kbyte", "Mbyte", ...). A value in a listed unit is
# scaled to the base unit the column's name states; one in any other unit is not read at all (missing,
# with its unit named), never taken as the base unit.
_TIME = {"ns": 1.0, "nsecond": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}
_BYTES = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12}
_INST = {"inst": 1.0, "Kinst": 1e3, "Minst": 1e6, "Ginst": 1e9}
_PERCENT = {"%": 1.0}
_COUNT = {"": 1.0}
METRIC_UNITS = {
    "duration_ns": _TIME,
    "dram_read_bytes": _BYTES, "dram_write_bytes": _BYTES, "local_spill_bytes": _BYTES,
    "local_load_bytes": _BYTES, "local_store_bytes": _BYTES,
    "ffma": _INST, "fadd": _INST, "fmul": _INST, "dfma": _INST, "dadd": _INST, "dmul": _INST,
    "sm_pct": _PERCENT, "dram_pct": _PERCENT, "dram_pct_sol": _PERCENT, "achieved_occupancy_pct": _PERCENT,
    "l2_hit_pct": _PERCENT,
    "waves_per_sm": _COUNT, "block_threads": _COUNT, "grid_blocks": _COUNT,
    "registers": {"register/thread": 1.0},
}


def unit_factor(column: str, unit: str | None) -> float | None:
    """What turns a value of ``column`` printed in ``unit`` into the column's base unit; None for a unit
    this tool does not know for it. A column without a listed unit (not a metric read) is taken as is."""
    units = METRIC_UNITS.get(column)
    if units is None:
        return 1.0
    return units.get((unit or "").strip())


def unit_problem(column: str, unit: str | None) -> str | None:
    """A missing reading's reason when ``column`` came in a unit this tool cannot convert, else None."""
    if unit_factor(column, unit) is not None:
        return None
    known = ", ".join(repr(u) for u in METRIC_UNITS[column])
    return f"unit {(unit or '').strip()!r} not understood (expected one of {known})"


def _version_key(version: str) -> tuple[int, ...]:
    """'2025.3.1.0' -> (2025, 3, 1, 0); the leading dotted numbers only ('2025.3.1.0-fake' -> the same)."""
    m = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(p) for p in m.group(0).split(".")) if m else ()


def oldest_ncu() -> str:
    """The oldest ncu release the column maps describe: an older one runs with a warning."""
    return min(COLUMN_MAPS, key=_version_key)


def check_ncu_version(version: str | None, path: str) -> str:
    """``version`` (from ``ncu --version``); a ToolNotFound where none can be read (not an ncu, or a broken one).
    A release older than every column map runs, read with the oldest map, after a warning: the metric names
    these maps read have been stable for years (CUDA 12's ncu 2024.x prints the same), and a column it names
    otherwise is a named missing reading in the report, never a wrong number; refusing it would turn away every
    CUDA 12 install for no evidence."""
    oldest = oldest_ncu()
    key = _version_key(version or "")
    if len(key) < 2:
        raise ToolNotFound(f"could not read the version of ncu at {path} (`ncu --version` printed "
                           f"{repr(version) if version else 'nothing'}); pass --ncu PATH to Nsight Compute {oldest} "
                           "or newer")
    if key < _version_key(oldest):
        print(f"warning: ncu {version} ({path}) is older than {oldest}, the oldest release this tool's CSV columns "
              f"were checked against: its readings are taken with {oldest}'s columns, and any it names otherwise "
              "is shown as missing (--ncu PATH picks another ncu)", file=sys.stderr)
    return version


def ncu_columns(version: str | None = None) -> dict:
    """The map for an ncu version string like '2025.3.1.0'; for a release newer than every map, the newest; for
    one older than every map, the oldest (check_ncu_version warned about it before the run)."""
    if version:
        for key, table in COLUMN_MAPS.items():
            if version.startswith(key):
                return table
        if _version_key(version) and _version_key(version) < _version_key(oldest_ncu()):
            return COLUMN_MAPS[oldest_ncu()]
    return COLUMN_MAPS[max(COLUMN_MAPS, key=_version_key)]
