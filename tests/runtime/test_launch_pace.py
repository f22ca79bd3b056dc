"""The host's launch pace beside the timed runs (app.runtime.launch_pace): on a GPU its launches are timed,
plausible and done before a timed run could start; the report and compare say what real captures of the default
join on an H200 hold, caution where the launches moved with the plan, and stay quiet where they did not."""
import json
import statistics
from pathlib import Path

import pytest

from app.analysis.compare import compare_traces, pace_change
from app.analysis.roofline import plan_roofline
from app.report.compare_command import table
from app.report.event_report import build_report
from app.runtime import host_pace, launch_pace

DATA = Path(__file__).resolve().parents[1] / "data" / "event"
BASE = DATA / "join_v4_100k_10k_h200_launch_pace.trace.json"
NEXT = DATA / "join_v4_100k_10k_h200_launch_pace_next.trace.json"
ONE_CORE = DATA / "join_v4_100k_10k_h200_launch_pace_one_core.trace.json"
PARAMS = {"command_line": "python -m app.kernel join --bench_runs 30 --overhead quick", "clocks": {"locked": False}}


@pytest.mark.gpu
def test_launches_are_timed_and_waited_for():
    import cupy as cp

    pace = launch_pace.LaunchPace(cp)
    times = [pace.seconds() for _ in range(20)]
    # an empty kernel's launch is microseconds of host time, never zero and never a millisecond
    assert all(1e-7 < t < 1e-3 for t in times)
    assert cp.cuda.get_current_stream().done    # every launch finished before a timed run could start


def test_summary_names_the_launches():
    s = launch_pace.summarise([5e-6] * 12, [4e-4] * 12)
    assert s["launches"] == launch_pace.LAUNCHES and "loop_iterations" not in s
    assert s["how"] == launch_pace.HOW and s["runs"] == 12 and s["median"] == pytest.approx(5e-6)


def test_the_report_states_what_the_capture_holds():
    """Every figure of the report's launch pace row is the capture's own, recomputed from its samples."""
    t = json.loads(BASE.read_text())
    p = t["timing"]["launch_pace"]
    assert launch_pace.summarise(p["samples"], t["timing"]["total"]["samples"]) == p
    roof = plan_roofline(t["device"]["name"], t["selected_runtime"], t["stages"])
    md = build_report(t, PARAMS, roof, None)
    row = next(line for line in md.splitlines() if line.startswith("| host launch pace before each timed run"))
    assert f"| {p['median'] * 1e6:,.1f} median (the mean of 16 launches; " in row
    assert f"range {p['min'] * 1e6:,.1f} to {p['max'] * 1e6:,.1f}" in row
    assert f"rank correlation with the runs' totals {p['rank_correlation']:+.2f} over {p['runs']} runs" in row


def test_compare_says_when_the_launches_moved_and_the_loop_did_not():
    """Two processes back to back on one H200 host, identical code: the second ran the plan 24.5% faster, its loop
    the same within its interval, its launches 10.0% quicker. The comparison shows what the runs say (one process a side: no verdict) and says the
    launches moved the same way; the loop alone would have said nothing."""
    base, nxt = (json.loads(f.read_text()) for f in (BASE, NEXT))
    r = compare_traces(base, nxt)
    launch, loop = r["launch_pace"], r["host_pace"]
    want = 100 * (statistics.median(nxt["timing"]["launch_pace"]["samples"])
                  / statistics.median(base["timing"]["launch_pace"]["samples"]) - 1)
    assert r["total"]["within_process"] == "faster" and not loop["resolved"]
    assert launch["resolved"] and launch["ci_pct"][1] < 0 and launch["change_pct"] == pytest.approx(want)
    assert r["caution"].startswith(f"the host's kernel launches took {-want:.1f}% less time in the new profile")
    assert "the host CPU itself" not in r["caution"]
    text = table(r, base, nxt, "")
    assert (f"host launch pace (an empty kernel launched before each timed run, us a launch): "
            f"base {launch['base_median_us']:,.1f} us, new {launch['new_median_us']:,.1f} us, {want:+.1f}%") in text
    roof = plan_roofline(base["device"]["name"], base["selected_runtime"], base["stages"])
    md = build_report(nxt, PARAMS, roof, base)        # the report's vs Baseline section says it too
    assert "Host launch pace (an empty kernel launched before each timed run, us a launch): base " in md
    assert f"**Caution:** the host's kernel launches took {-want:.1f}% less time" in md
    # the other way round: the plan slower, the launches slower
    back = compare_traces(nxt, base)
    assert back["total"]["within_process"] == "slower" and back["caution"].startswith("the host's kernel launches took")
    assert "% longer in the new profile" in back["caution"]


def test_a_slowdown_neither_pace_saw_has_no_caution():
    """The same code in a process held to one CPU core: the plan 52% slower (the build's host copies shared the
    core), its loop the same within its interval, its launches quicker. Nothing says the host's launches or its
    interpreter explain it, so compare cautions about neither."""
    base, one_core = (json.loads(f.read_text()) for f in (BASE, ONE_CORE))
    r = compare_traces(base, one_core)
    assert r["total"]["within_process"] == "slower" and r["total"]["change_pct"] > 40
    assert not r["host_pace"]["resolved"] and r["launch_pace"]["change_pct"] < 0 and r["caution"] is None
    # a profile with no launch pace (an H100 capture made before it was measured): none, and said so
    old = json.loads((DATA / "join_v4_100k_10k_h100_host_pace.trace.json").read_text())
    assert pace_change(old, base, "launch_pace") is None
    assert "host launch pace: not recorded in either profile" in table(compare_traces(old, base), old, base, "")


def test_the_loop_alone_is_the_default_pace():
    """pace_change without a key reads the loop, as before the launches were timed."""
    base, one_core = (json.loads(f.read_text()) for f in (BASE, ONE_CORE))
    assert pace_change(base, one_core) == pace_change(base, one_core, "host_pace") is not None
    assert host_pace.summarise(base["timing"]["host_pace"]["samples"],
                               base["timing"]["total"]["samples"]) == base["timing"]["host_pace"]


def test_drift_the_launches_shared_is_not_blamed_on_warm_up():
    """Runs that slowed by a third while the loop held steady and the launches slowed the same way: the report
    names the launches and does not ask for more --warmup; with steady launches too it still does. (A real H200
    capture, its timed runs and launch times stepped here to give the case.)"""
    from app.runtime.stats import drift

    t = json.loads(BASE.read_text())
    tm = t["timing"]
    n = len(tm["total"]["samples"])
    step = [1.0 if i < n // 2 else 1.35 for i in range(n)]
    tm["total"]["samples"] = [v * s for v, s in zip(tm["total"]["samples"], step)]
    tm["drift"] = drift(tm["total"]["samples"])
    tm["host_pace"] = host_pace.summarise([50e-6] * n, tm["total"]["samples"])          # a loop that held steady
    tm["launch_pace"] = launch_pace.summarise([6e-6 * s for s in step], tm["total"]["samples"])
    roof = plan_roofline(t["device"]["name"], t["selected_runtime"], t["stages"])
    md = build_report(t, PARAMS, roof, None)
    headline = next(line for line in md.splitlines() if line.startswith("`python -m app.kernel"))
    assert "**The timed runs were still changing**" in headline and "the machine changed speed" in headline
    assert "an empty kernel's launch before each run: +35.0%" in headline and "a fixed Python loop" not in headline
    spread_row = next(line for line in md.splitlines() if line.startswith("| total robust spread"))
    assert "the runs followed the host's launch pace, see below" in spread_row
    tm["launch_pace"] = launch_pace.summarise([6e-6] * n, tm["total"]["samples"])
    md = build_report(t, PARAMS, roof, None)
    assert "the machine changed speed" not in md and "more --warmup gives a steady one" in md
