"""ncu counts the report and trace.json must not contradict (this project's own H200 captures, tests/fixtures/ncu and
tests/data/ncu): an L2 hit rate is withheld for an impossible count only where that count enters it, and a stage of
copies, which ncu cannot time, has no time rather than a time of zero."""
import json
from pathlib import Path

import pytest

from app.analysis.baseline import launched_no_kernels, read_trace
from app.analysis.compare import compare_traces
from app.analysis.kernel_metrics import L2_HIT_RATE_TERMS, kernel_table
from app.errors import BadParameter
from app.runtime.profiling.parsers.ncu_csv import parse_raw
from tests.conftest import fixture_text

HIT, SECTORS = L2_HIT_RATE_TERMS
DATA = Path(__file__).resolve().parents[1] / "data" / "ncu"


@pytest.mark.parametrize("capture", ["join", "overlay", "overlay_v3"])
def test_the_l2_hit_rate_is_lookup_hits_over_sectors_on_every_kernel(capture):
    """What the withholding rests on: ncu's rate is these two counts' ratio (to its two decimals), so a breakdown
    below zero is not in it."""
    raw, _ = parse_raw(fixture_text(f"ncu/{capture}.full.raw.csv"))
    ratio = 100 * raw[HIT].astype(float) / raw[SECTORS].astype(float)
    assert ((ratio - raw["l2_hit_pct"].astype(float)).abs() <= 0.0051).all()


def test_a_negative_breakdown_outside_the_ratio_keeps_the_rate_and_says_why():
    """overlay v3's corner_cells_grid: lts__t_sectors_srcunit_tex_op_red_lookup_hit.sum read -5, a breakdown of
    reductions; its hit rate is 5,984 / 12,123 sectors, both readable, and 5 sectors would move it by 0.04 points:
    kept (it was withheld as "a ratio of L2 sector counts, this one among them")."""
    raw, _ = parse_raw(fixture_text("ncu/overlay_v3.full.raw.csv"))
    k = kernel_table(raw, "overlay", [], "NVIDIA H200").set_index("kernel")
    flags = k.loc["corner_cells_grid", "flags"]
    assert "lts__t_sectors_srcunit_tex_op_red_lookup_hit.sum=-5 outside its physical range" in flags
    assert (f"l2_hit_pct=49.36 kept: the counts below zero are 5 of its 12,123 L2 sectors, breakdowns outside its "
            f"ratio {HIT} / {SECTORS} (5,984 / 12,123, both readable); were its terms off by as much it would move by "
            "0.041 points") in flags
    assert k.loc["corner_cells_grid", "l2_hit_pct"] == 49.36 and "not used" not in flags


def test_a_negative_term_of_the_ratio_withholds_the_rate_and_names_it():
    """refine in join v2 at 20k x 2k: 140,094 sectors. Had the hit count itself read -3, the rate is no reading,
    however few 3 sectors are beside 140,094; with the terms unreadable, whether a negative breakdown is in them is
    unknown, and the rate is withheld too."""
    raw, _ = parse_raw(fixture_text("ncu/join.full.raw.csv"))
    i = raw.index[raw["kernel"] == "refine"][0]
    bad = raw.copy()
    bad.loc[i, HIT] = -3.0
    k = kernel_table(bad, "join", [], "NVIDIA H200")
    assert k.loc[i, "l2_hit_pct"] != k.loc[i, "l2_hit_pct"]
    assert (f"l2_hit_pct=70.02 (lts__t_sector_hit_rate.pct) not used: it is {HIT} / {SECTORS}, and {HIT} is below "
            "zero") in k.loc[i, "flags"]
    k = kernel_table(raw.drop(columns=[HIT]), "join", [], "NVIDIA H200")
    assert k.loc[i, "l2_hit_pct"] != k.loc[i, "l2_hit_pct"]
    assert "are not both readable, so whether the counts below zero are among them is unknown" in k.loc[i, "flags"]
    assert kernel_table(raw, "join", [], "NVIDIA H200").loc[i, "l2_hit_pct"] == 70.02


def _with_build_time(path: Path, tmp_path: Path, value) -> str:
    trace = json.loads(path.read_text())
    assert trace["stages"][0]["name"] == "owned_buffer_build"
    trace["stages"][0]["elapsed_seconds"] = value
    out = tmp_path / f"{path.stem}.json"
    out.write_text(json.dumps(trace))
    return str(out)


def test_a_stage_of_copies_stored_with_no_time_is_read_and_compared(tmp_path):
    """trace.json now stores the build's time as null (ncu cannot time copies), not 0.0: compare and --baseline read
    it, leave the stage out of the verdicts, and still refuse a stage with kernels and no time."""
    before = _with_build_time(DATA / "join_v4_100k_10k_h200_extent_thread_a_polygon.trace.json", tmp_path, None)
    after = _with_build_time(DATA / "join_v4_100k_10k_h200_extent_lanes.trace.json", tmp_path, None)
    base, new = read_trace(before), read_trace(after)
    assert launched_no_kernels(base["stages"][0]) and base["stages"][0]["elapsed_seconds"] is None
    result = compare_traces(base, new)
    (build,) = result["one_side_stages"]
    assert build["name"] == "owned_buffer_build" and build["no_kernels"] and build["verdict"] is None
    assert "owned_buffer_build" not in [s["name"] for s in result["stages"]]
    trace = json.loads(Path(after).read_text())
    trace["stages"][1]["elapsed_seconds"] = None
    Path(after).write_text(json.dumps(trace))
    with pytest.raises(BadParameter, match="stage 'bounds' has no finite elapsed_seconds above 0 \\(None\\)"):
        read_trace(after, "NEW")
