"""annotation and ncu mode give the same figures for the same kernel: both read them from the same
ncu metrics (ncu mode asks for annotation mode's list on top of the full set). The fixtures are two
separate captures of the same warm iteration, so times and rates differ by run-to-run noise only;
instruction counts and launch facts must be equal."""
import pytest

from app.analysis.kernel_metrics import kernel_table
from app.kernel.plan import get_plan_class
from app.runtime.profiling.parsers.ncu_csv import parse_raw
from tests.conftest import fixture_text


def close(a, b, abs_tol, rel_tol):
    return abs(a - b) <= max(abs_tol, rel_tol * max(abs(a), abs(b)))


@pytest.mark.parametrize("kernel", ["join", "overlay"])
def test_same_kernel_same_figures_in_both_modes(kernel):
    stages = [s.name for s in get_plan_class(kernel, "v2")().stages]
    ann = kernel_table(parse_raw(fixture_text(f"ncu/{kernel}.annotation.csv"))[0], kernel, stages, "NVIDIA H200")
    full = kernel_table(parse_raw(fixture_text(f"ncu/{kernel}.full.raw.csv"))[0], kernel, stages, "NVIDIA H200")
    assert ann["kernel"].tolist() == full["kernel"].tolist()
    assert ann["stage"].tolist() == full["stage"].tolist() and ann["stage"].notna().all()
    for a, f in zip(ann.itertuples(), full.itertuples()):
        assert (a.fp64_flops, a.fp32_flops, a.registers, a.block_threads, a.grid_blocks) == \
               (f.fp64_flops, f.fp32_flops, f.registers, f.block_threads, f.grid_blocks), a.kernel
        assert close(a.duration_us, f.duration_us, 1.0, 0.15), a.kernel
        # Achieved occupancy of a launch under one wave follows when its blocks happen to finish (slot_sort, half
        # a wave in 5 us: 23% and 31% in the two captures); from a full wave on it is the code's.
        occupancy_tol = 3.0 if a.waves_per_sm >= 1 else 10.0
        assert close(a.achieved_occupancy_pct, f.achieved_occupancy_pct, occupancy_tol, 0.06), a.kernel
        # A throughput percentage moves with the run's time (the same work in 6.0 or 6.7 us reads 15.1% or 13.6%):
        # it may differ by as much as the two times do, and 10% besides.
        moved = abs(a.duration_us - f.duration_us) / max(a.duration_us, f.duration_us)
        for col in ("dram_pct", "sm_pct"):
            assert close(getattr(a, col), getattr(f, col), 0.5, 0.10 + moved), (a.kernel, col)
        assert close(a.local_spill_bytes, f.local_spill_bytes, 0, 0.01), a.kernel
        assert a.bottleneck == f.bottleneck, (a.kernel, a.bottleneck, f.bottleneck)
