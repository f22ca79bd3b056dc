"""An event-mode profile keeps the truth rules and the output contract (CPU in CI, GPU on the lent machine)."""
import json
import statistics
from pathlib import Path

import pytest

from app.kernel.cli import main
from app.runtime.timing import OVERHEAD_MAX_PAIRS, OVERHEAD_PAIRS, OVERHEAD_PAIRS_CPU
from tests.conftest import DEVICES

ARGS = ["join", "v2", "--points", "20000", "--polygons", "2000", "--bench_runs", "5", "--warmup", "1"]
REASONS = ("count", "budget", "interval", "max_pairs")      # why the overhead pairs stopped
STAGES = ["owned_buffer_build", "bounds", "morton_sort", "candidate_filter", "predicate_refine", "output_sort"]


def only_profile(out: Path) -> Path:
    dirs = [p for p in out.glob("profiles/event/join/*/*") if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


@pytest.fixture
def profile(tmp_path, request):
    device = request.param
    out = tmp_path / "out"
    assert main([*ARGS, "--device", device, "--out", str(out), "--nvtx"]) == 0
    d = only_profile(out)
    return device, d, json.loads((d / "trace.json").read_text()), json.loads((d / "params.json").read_text())


@pytest.mark.parametrize("profile", DEVICES, indirect=True)
def test_layout_and_files(profile):
    device, d, trace, params = profile
    assert d.parent.name == "v2_points-20k_polygons-2k_vertices-16_predicate-within_layout-uniform_seed-0"
    assert d.parent.parent == d.parents[1] and d.parents[2].name == "event"
    names = {p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()}
    assert {"params.json", "trace.json", "report.md"} <= names
    assert {f"tiling/{s}.json" for s in STAGES} <= names
    if device == "gpu":
        for stage in ("bounds", "morton_sort", "candidate_filter", "predicate_refine", "output_sort"):
            assert {f"compiled/{stage}/join.cu", f"compiled/{stage}/join.ptx",
                    f"compiled/{stage}/resources.json"} <= names
        assert ".entry" in (d / "compiled/predicate_refine/join.ptx").read_text()
        res = json.loads((d / "compiled/predicate_refine/resources.json").read_text())
        assert res["kernels"]["refine"]["num_regs"] > 0


@pytest.mark.parametrize("profile", DEVICES, indirect=True)
def test_device_that_ran_is_reported(profile):
    device, _, trace, params = profile
    assert trace["selected_runtime"] == device == params["selected_runtime"]
    assert trace["metadata"]["planner_selected_runtime"] in ("cpu", "gpu")
    assert [s["device"] for s in trace["stages"]] == [device] * len(STAGES)
    assert [s["name"] for s in trace["stages"]] == STAGES
    assert [s["category"] for s in trace["stages"]] == ["setup", "setup", "sort", "filter", "refine", "sort"]
    for key in ("kernel", "version", "mode", "params", "device", "requested_runtime", "clocks", "tools",
                "command_line", "git", "host"):
        assert key in params
    assert "glibc_tunables" in params["host"]      # it changes how fast the inputs are staged
    assert params["device"]["name"] == trace["device"]["name"]


@pytest.mark.parametrize("profile", DEVICES, indirect=True)
def test_a_build_that_staged_nothing_says_its_dma_alone_was_not_measured(profile):
    device, d, trace, _ = profile
    assert "staging_dma" in trace["timing"] and trace["timing"]["staging_dma"] is None   # 20k x 2k: nothing staged
    row = "| host->device DMA alone: the build's staged bytes again, from their pinned buffers (us) | "
    assert row + ("not measured: the last run staged nothing" if device == "gpu" else
                  "n/a (a CPU run: no host->device copy)") in (d / "report.md").read_text()


@pytest.mark.parametrize("profile", DEVICES, indirect=True)
def test_end_to_end_and_the_repeat_come_from_the_runs_of_the_overhead_pairs(profile):
    device, d, trace, _ = profile
    tm = trace["timing"]
    e2e, pairs = tm["end_to_end"], tm["instrumentation"]
    assert e2e["runs"] == pairs["pairs"]
    # Every run behind these figures is in the trace, and gives them again.
    assert len(e2e["samples"]) == len(pairs["samples"]["bare"]) == len(pairs["samples"]["marked"]) == pairs["pairs"]
    assert statistics.median(e2e["samples"]) == e2e["median"]
    assert statistics.median(pairs["samples"]["bare"]) == pairs["bare_median_seconds"]
    if device == "gpu":     # the bare runs copied their result back: on the host clock, never less than their marks
        assert e2e["bare_median_seconds"] == pairs["bare_median_seconds"] <= e2e["median"]
        assert f"; the bare plan of the same runs {pairs['bare_median_seconds'] * 1e6:,.1f} (median of " \
               f"{pairs['pairs']} runs" in (d / "report.md").read_text()
    else:                   # the CPU plan's result is host arrays already
        assert e2e["median"] == pairs["bare_median_seconds"]
    # The timed runs against the same runs later in the profile: the pairs' marked runs, each with its interval.
    again = tm["repeated_later"]
    assert again["timed_median"] == tm["total"]["median"] == trace["total_elapsed_seconds"]
    assert again["later_median"] == pairs["instrumented_median_seconds"]
    lo, hi = pairs["instrumented_ci95"]
    assert lo <= again["later_median"] <= hi
    row = next(line for line in (d / "report.md").read_text().splitlines()
               if line.startswith("| the timed runs repeated later (the overhead pairs' runs with every stage marked"))
    # 5 timed runs: no 95% interval of their median (it needs six), so the two levels are not compared at all
    assert tm["timed_runs"] == 5 and again["timed_ci95"] == [None, None] and tm["total"]["median_ci95"] == [None, None]
    assert again["compared"] is False and again["apart"] is False
    assert "a side has too few runs for a 95% interval, so the two levels are not compared" in row
    assert "n/a (5 timed runs: a 95% interval of the median needs at least 6)" in (d / "report.md").read_text()


@pytest.mark.parametrize("profile", DEVICES, indirect=True)
def test_stage_times_add_up_with_spread_and_cold_apart(profile):
    _, _, trace, _ = profile
    t = trace["timing"]
    assert t["timed_runs"] == 5 and t["warmup_runs"] == 1
    assert 0 < t["stage_sum_seconds"] <= trace["total_elapsed_seconds"] * 1.0001
    # The plan's run ends at its last stage's end mark: the stages tile every run exactly, and the trace keeps
    # each stage's samples in run order, so run by run they add up to the run. (The stages' medians need not add
    # up to the runs' median: on a busy host each stage's slow run is another run.)
    runs = zip(*(s["spread"]["samples"] for s in trace["stages"]), strict=True)
    assert [sum(parts) for parts in runs] == pytest.approx(t["total"]["samples"], rel=1e-9, abs=0)
    assert t["uncovered_seconds"] == 0.0 and t["uncovered_fraction"] == 0.0
    assert t["stage_sum_seconds"] == t["total"]["median"]
    for s in trace["stages"]:
        sp = s["spread"]
        assert sp["runs"] == 5 and sp["min"] <= sp["median"] <= sp["max"]
        assert s["elapsed_seconds"] == sp["median"] == statistics.median(sp["samples"])
        assert sp["stable"] is None and sp["outliers"] == sum(             # five runs: stability not judged
            v < sp["q1"] - 1.5 * sp["iqr"] or v > sp["q3"] + 1.5 * sp["iqr"] for v in sp["samples"])
        assert s["cold_seconds"] > 0
    assert trace["cold"]["total_seconds"] > 0 and "compile_seconds" in trace["cold"]


@pytest.mark.parametrize("profile", DEVICES, indirect=True)
def test_rows_metadata_and_counters(profile):
    device, _, trace, _ = profile
    by = {s["name"]: s for s in trace["stages"]}
    assert by["owned_buffer_build"]["rows_in"] == 22000
    assert by["candidate_filter"]["metadata"]["pairs_examined"] >= by["candidate_filter"]["rows_out"] > 0
    assert by["predicate_refine"]["rows_in"] == by["candidate_filter"]["rows_out"]
    assert by["output_sort"]["rows_out"] == by["predicate_refine"]["rows_out"] == trace["metadata"]["verification"]["pairs"]
    assert trace["metadata"]["verification"]["matches"] is True
    reads = [by[s]["metadata"]["allocation_size_reads"] for s in STAGES]
    h2d = by["owned_buffer_build"]["metadata"]["h2d_copies"]
    if device == "gpu":
        assert reads == [0, 0, 1, 2, 0, 1] and h2d == 4   # v2's filter sizes its cell lists too
        # Only output_sort's read cuts the result to length, after its last launch.
        assert [by[s]["metadata"]["result_size_reads"] for s in STAGES] == [0, 0, 0, 0, 0, 1]
        assert [by[s]["metadata"]["d2h_copies"] for s in STAGES] == reads   # no other device->host traffic
    else:
        assert reads == [0] * 6 and h2d == 0


@pytest.mark.parametrize("profile", DEVICES, indirect=True)
def test_nvtx_reported_as_emitted_only_when_emitted(profile):
    device, _, trace, _ = profile
    nv = trace["metadata"]["nvtx"]
    assert nv["requested"] and nv["emitted"] and nv["domain"] == "join"
    # cold + warm-up + timed runs + the instrumented half of the overhead pairs (the bare half has no ranges), and
    # of the pairs' discarded first round; on a GPU also the untimed run that finds which kernels each stage launches
    ins = trace["timing"]["instrumentation"]
    pairs = ins["pairs"]
    if device == "gpu":     # 30 pairs, then more until the interval is narrow, the budget is spent or 400 are run
        assert (OVERHEAD_PAIRS <= pairs <= OVERHEAD_MAX_PAIRS or ins["stopped"] == "budget") and pairs >= 3
    else:
        assert (pairs, ins["stopped"]) == (OVERHEAD_PAIRS_CPU, "count")
    assert ins["settle_rounds"] == 1
    census = 1 if device == "gpu" else 0
    assert nv["ranges"] == len(STAGES) * (1 + census + 1 + 5 + ins["settle_rounds"] + pairs)


@pytest.mark.parametrize("profile", DEVICES, indirect=True)
def test_stage_times_without_the_other_marks(profile):
    """On a GPU each stage is also timed from runs that carry one stage mark each: each stage has an interval and
    what the other marks add to it, and the runs' own overhead is given. On the CPU the report says why not."""
    device, d, trace, _ = profile
    one = trace["timing"]["one_mark"]
    report = (d / "report.md").read_text()
    section = report.split("## Stage times without the other stages' marks")[1].split("\n## ")[0]
    if device == "cpu":
        assert one["why"].startswith("CPU run") and "Not measured: CPU run" in section
        return
    assert [s["name"] for s in one["stages"]] == STAGES
    assert one["rounds"] == trace["timing"]["instrumentation"]["pairs"] and one["stopped"] in REASONS
    assert one["stage_sum_seconds"] == pytest.approx(sum(s["seconds"] for s in one["stages"]))
    for s in one["stages"]:
        lo, hi = s["ci95"]
        alo, ahi = s["marks_add_ci95"]
        assert lo <= s["seconds"] <= hi and s["resolved"] == (lo > 0) and alo <= s["marks_add_seconds"] <= ahi
        assert s["marked_seconds"] > 0 and f"| {s['name']} |" in section
    assert one["overhead_fraction"] is not None and one["overhead_ci95"][0] <= one["overhead_fraction"]
    assert one["bare_median_seconds"] > 0 and one["marked_median_seconds"] > 0
    assert "one stage mark a run" in report


@pytest.mark.parametrize("profile", DEVICES, indirect=True)
def test_host_pace_is_timed_before_every_timed_run(profile):
    """The fixed loop ran once before each timed run, its figures are its samples', and the report shows them; on
    a GPU the clocks were read between the runs, never during one, and so were an empty kernel's launches."""
    from app.report.writer import finite_or_null
    from app.runtime.host_pace import summarise

    device, d, trace, params = profile
    p = trace["timing"]["host_pace"]
    runs = trace["timing"]["timed_runs"]
    assert p["runs"] == len(p["samples"]) == runs and all(v > 0 for v in p["samples"])
    # as written: an interval that is missing (too few runs) is null in the file
    assert finite_or_null(summarise(p["samples"], trace["timing"]["total"]["samples"])) == p
    assert p["rank_correlation"] is None and f"{runs} timings for {runs} runs" in p["why_no_correlation"]
    row = next(line for line in (d / "report.md").read_text().splitlines() if "| host CPU pace before" in line)
    assert f"{p['median'] * 1e6:,.1f} median" in row and "no correlation: " in row
    if device == "gpu" and (params["clocks"].get("samples") or {}).get("n"):
        assert "never during one" in params["clocks"]["samples"]["when"]
    # on a GPU an empty kernel's launches were timed after the loop, once a run; on the CPU there is nothing to launch
    lp = trace["timing"]["launch_pace"]
    row = next(line for line in (d / "report.md").read_text().splitlines() if "| host launch pace before" in line)
    if device == "cpu":
        assert lp == {"why": "CPU run: the plan launches no kernels"} and "not measured (CPU run: the plan launches no kernels)" in row
    else:
        from app.runtime.launch_pace import summarise as launches

        assert lp["runs"] == len(lp["samples"]) == runs and all(1e-7 < v < 1e-3 for v in lp["samples"])
        assert finite_or_null(launches(lp["samples"], trace["timing"]["total"]["samples"])) == lp
        assert f"{lp['median'] * 1e6:,.1f} median (the mean of 16 launches" in row


def test_nvtx_off_and_disabled(tmp_path, monkeypatch):
    out = tmp_path / "out"
    assert main([*ARGS, "--device", "cpu", "--out", str(out / "a")]) == 0
    nv = json.loads((only_profile(out / "a") / "trace.json").read_text())["metadata"]["nvtx"]
    assert nv == {"requested": False, "emitted": False, "ranges": 0, "domain": "join",
                  "detail": "not requested (pass --nvtx)"}
    monkeypatch.setenv("NVTX_DISABLE", "1")
    assert main([*ARGS, "--device", "cpu", "--nvtx", "--out", str(out / "b")]) == 0
    nv = json.loads((only_profile(out / "b") / "trace.json").read_text())["metadata"]["nvtx"]
    assert nv["requested"] and not nv["emitted"] and nv["detail"] == "NVTX_DISABLE is set"


def test_report_contract_and_baseline(tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*ARGS, "--device", "cpu", "--out", str(out / "a")]) == 0
    first = only_profile(out / "a")
    capsys.readouterr()
    assert main([*ARGS, "--device", "cpu", "--out", str(out / "b"), "--baseline", str(first), "--json"]) == 0
    trace = json.loads(capsys.readouterr().out)          # --json: stdout is the trace, nothing else
    assert trace["kernel"] == "join" and len(trace["stages"]) == 6
    report = (only_profile(out / "b") / "report.md").read_text()
    for heading in ("# Profile: join v2", "## Configuration", "## Stages", "**Bottleneck:**", "**Root cause:**",
                    "## Top 3 Opportunities (ranked by estimated impact)", "## vs Baseline", "## Timing",
                    "## Transfers and syncs", "## Cold start"):
        assert heading in report, heading
    assert "| total (us) |" in report and "| predicate_refine (us) |" in report
    assert "trigger:" in report


def test_bad_baseline_is_one_line(tmp_path, capsys):
    assert main([*ARGS, "--baseline", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a readable profile trace" in err[0]


def test_end_to_end_and_after_build_come_from_the_same_runs(tmp_path):
    import json

    from app.kernel.cli import main

    out = tmp_path / "out"
    assert main(["join", "--points", "2000", "--polygons", "200", "--device", "cpu", "--bench_runs", "5",
                 "--out", str(out)]) == 0
    (d,) = list(out.glob("profiles/event/join/*/*"))
    trace = json.loads((d / "trace.json").read_text())
    tm = trace["timing"]
    assert tm["build_stages"] == ["owned_buffer_build"]
    build = trace["stages"][0]["spread"]["samples"]
    per_run = [t - b for t, b in zip(tm["total"]["samples"], build)]
    assert tm["after_build"]["samples"] == per_run and tm["after_build"]["median"] < tm["total"]["median"]
    assert "after the input build (owned_buffer_build left out)" in (d / "report.md").read_text()   # a CPU run


@pytest.mark.gpu
@pytest.mark.parametrize("profile", ["gpu"], indirect=True)
def test_occupancy_is_the_launched_kernels_own(profile):
    """A stage registers every version's kernels (the filter: v2's cell lists, v1's count and emit, v4's five
    candidate_fill widths); its Occ% is the lowest theoretical occupancy among those it launched, as resources.json
    gives each kernel, not among all. An H200 default join read 50% for a filter whose one kernel holds 62.5%."""
    _, d, trace, _ = profile
    by = {s["name"]: s["metadata"] for s in trace["stages"]}
    launched = set(by["candidate_filter"]["kernels_launched"])      # v2's cell lists and the scans of their counts
    assert {"poly_cell_count", "poly_cell_fill", "point_candidates"} <= launched
    assert all(k.startswith("scan_") for k in launched - {"poly_cell_count", "poly_cell_fill", "point_candidates"})
    assert by["predicate_refine"]["kernels_launched"] == ["refine"]
    assert "kernels_launched" not in by["owned_buffer_build"]        # copies only
    for name, meta in by.items():
        if "kernels_launched" not in meta:
            continue
        res = json.loads((d / f"compiled/{name}/resources.json").read_text())["kernels"]
        assert meta["theoretical_occupancy_pct"] == min(res[k]["theoretical_occupancy_pct"]
                                                        for k in meta["kernels_launched"])
