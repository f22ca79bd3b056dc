"""compare, --baseline and devlog on real ncu profiles (tests/data/ncu/): the build launches no kernel, so ncu gives
it no time. Its elapsed_seconds of 0 is no time taken, not a damaged trace: every ncu or annotation profile of the
join or the overlay has such a stage, and these commands had refused them all."""
import json
import shutil
from pathlib import Path

import pytest

from app.analysis.baseline import launched_no_kernels, read_trace
from app.analysis.compare import compare_traces
from app.errors import BadParameter

DATA = Path(__file__).resolve().parents[1] / "data" / "ncu"
BEFORE = DATA / "join_v4_100k_10k_h200_extent_thread_a_polygon.trace.json"
AFTER = DATA / "join_v4_100k_10k_h200_extent_lanes.trace.json"


def test_a_stage_of_no_kernels_is_read_and_left_out_of_the_verdicts():
    base, new = read_trace(str(BEFORE)), read_trace(str(AFTER))
    for t in (base, new):
        build = t["stages"][0]
        assert build["name"] == "owned_buffer_build" and build["elapsed_seconds"] == 0 and launched_no_kernels(build)
        assert not any(launched_no_kernels(s) for s in t["stages"][1:])
    result = compare_traces(base, new)
    assert [s["name"] for s in result["stages"]] == ["bounds", "morton_sort", "candidate_filter", "predicate_refine",
                                                     "output_sort"]
    (build,) = result["one_side_stages"]
    assert build["name"] == "owned_buffer_build" and build["no_kernels"] and build["verdict"] is None
    assert build["base_median_us"] is None and "launched none in 2 of the 2 profiles" in build["why"]
    bounds = result["stages"][0]
    assert bounds["base_median_us"] == pytest.approx(17.6, abs=0.05) and bounds["new_median_us"] == pytest.approx(
        10.1, abs=0.05)
    assert result["total"]["base_median_us"] == pytest.approx(1e6 * base["total_elapsed_seconds"])


def test_compare_prints_the_stage_as_no_kernels_and_no_time(capsys):
    from app.kernel.cli import main

    assert main(["compare", str(BEFORE), str(AFTER)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("owned_buffer_build"))
    assert row.split() == ["owned_buffer_build", "--", "--", "--", "--", "no", "kernels"]
    assert "0.0" not in row and "ncu times kernels only" in out
    assert "a stage in one side only" not in out          # nothing here is in one side only
    assert "a counter-mode profile, ncu or annotation" in out


def test_a_stage_with_zero_time_and_kernels_is_still_refused(tmp_path):
    """Only a stage that launched no kernel may have no time: a stage whose kernels took 0 s is a damaged trace."""
    trace = json.loads(AFTER.read_text())
    trace["stages"][1]["elapsed_seconds"] = 0.0
    bad = tmp_path / "trace.json"
    bad.write_text(json.dumps(trace))
    with pytest.raises(BadParameter) as err:
        read_trace(str(bad), "BASE")
    assert str(err.value) == (f"BASE {bad}: stage 'bounds' has no finite elapsed_seconds above 0 (0.0); the trace is "
                              "damaged: profile again, or pass another profile folder or its trace.json")


def test_devlog_logs_ncu_profiles_one_after_the_other(tmp_path):
    from app.report.devlog import append_devlog

    for name, src in (("before", BEFORE), ("after", AFTER)):
        (tmp_path / name).mkdir()
        shutil.copy(src, tmp_path / name / "trace.json")
        (tmp_path / name / "params.json").write_text(json.dumps({"command_line": "python -m app.kernel join "
                                                                                 "--prof_type ncu"}))
    log = tmp_path / "join.md"
    for name in ("before", "after"):
        path, added = append_devlog(str(tmp_path / name), str(log))
        assert added and path == log
    text = log.read_text()
    assert text.count("app-kernel devlog entry") == 2
    assert "| Duration | 72.6 us | 10.1% faster (noise) |" in text     # one iteration a side: no verdict


def test_the_reports_vs_baseline_section_lists_the_build_with_no_time():
    """An ncu profile made with --baseline another: the build's row has no time on either side and no verdict."""
    from app.report.baseline import baseline_section

    section = baseline_section(read_trace(str(AFTER)), read_trace(str(BEFORE)))
    rows = {r[0]: r for r in section.rows}
    assert rows["owned_buffer_build (us)"] == ["owned_buffer_build (us)", "-", "-", "--", "--",
                                               "no kernels (ncu times kernels only)"]
    assert rows["bounds (us)"][1:3] == ["17.6", "10.1"]
