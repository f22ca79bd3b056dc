"""Column maps: tool CSV headers -> our snake_case names, one table per tool version.

A new Nsight release that renames a column is a new table here, not a hunt through code.
"""
from __future__ import annotations

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


def ncu_columns(version: str | None = None) -> dict:
    """The map for an ncu version string like '2025.3.1.0'; the newest map otherwise."""
    if version:
        for key, table in COLUMN_MAPS.items():
            if version.startswith(key):
                return table
    return COLUMN_MAPS[max(COLUMN_MAPS)]
