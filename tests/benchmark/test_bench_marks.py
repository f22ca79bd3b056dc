"""bench_marks splits a stage mark's cost between the host and the GPU's timestamps: its arithmetic here, its
runs on the GPU (the figures that matter come from the lent GPU machine, not from these tiny sizes)."""
import math
import re

import pytest

from app.kernel.plan import get_plan_class
from app.runtime.device import select
from tests.benchmark import bench_marks


def test_the_stand_in_arms_are_paired_with_the_bare_run_of_their_round_when_present():
    bare = [100e-6, 140e-6, 101e-6]
    marked = [b + 10e-6 for b in bare]
    side = [b + 9e-6 for b in bare]
    busy = [b + 8e-6 for b in bare]
    r = bench_marks.summarise({"bare": bare, "marked": marked, "untimed": marked, "side": side, "busy": busy},
                              extra=2)
    assert r["side"]["seconds"] == pytest.approx(9e-6) and r["side"]["per_mark"] == pytest.approx(4.5e-6)
    assert r["busy"]["seconds"] == pytest.approx(8e-6) and r["busy"]["share"] == pytest.approx(8 / 101)
    assert "side" not in bench_marks.summarise({"bare": bare, "marked": marked, "untimed": marked}, extra=2)


def test_spin_spends_host_time_and_returns():
    import time

    t0 = time.perf_counter()
    bench_marks.spin(200e-6)
    assert time.perf_counter() - t0 >= 200e-6


def test_each_part_is_the_median_of_paired_differences_per_mark_and_as_a_share_of_the_bare_plan():
    bare = [100e-6, 104e-6, 98e-6, 130e-6, 101e-6, 99e-6]          # one slow round: pairing cancels it
    host = [2e-6, 2e-6, 3e-6, 2e-6, 1e-6, 2e-6]
    stamp = [4e-6, 5e-6, 4e-6, 4e-6, 6e-6, 5e-6]
    untimed = [b + h for b, h in zip(bare, host)]
    marked = [u + s for u, s in zip(untimed, stamp)]
    r = bench_marks.summarise({"bare": bare, "marked": marked, "untimed": untimed}, extra=4)
    assert r["bare"] == pytest.approx(100.5e-6)
    assert r["host"]["seconds"] == pytest.approx(2e-6) and r["host"]["per_mark"] == pytest.approx(0.5e-6)
    assert r["timestamps"]["seconds"] == pytest.approx(4.5e-6) and r["timestamps"]["per_mark"] == pytest.approx(1.125e-6)
    # marked - bare per round: 6, 7, 7, 6, 7, 7 us
    assert r["cost"]["seconds"] == pytest.approx(7e-6)
    assert r["cost"]["share"] == pytest.approx(7 / 100.5)
    lo, hi = r["cost"]["ci"]
    assert lo <= r["cost"]["seconds"] <= hi
    assert r["cost"]["share_ci"] == pytest.approx((lo / 100.5e-6, hi / 100.5e-6))
    assert r["cost"]["per_mark_ci"] == pytest.approx((lo / 4, hi / 4))


@pytest.mark.parametrize("ci, said", [((math.nan, math.nan), "no 95% interval (under 6 rounds): not resolved"),
                                      ((0.010, 0.020), "under the 2% target"),
                                      ((0.021, 0.030), "over the 2% target"),
                                      ((0.015, 0.025), "spans the 2% target: not resolved")])
def test_the_verdict_is_drawn_from_the_interval_not_the_median(ci, said):
    assert said in bench_marks.verdict(ci)


def test_the_closing_line_gives_both_verdicts_of_a_plan_and_says_where_no_one_mark_runs_were_made():
    bare = [100e-6, 104e-6, 98e-6, 130e-6, 101e-6, 102e-6]
    r = bench_marks.summarise({"bare": bare, "marked": [b + 5e-6 for b in bare],
                               "untimed": [b + 1e-6 for b in bare]}, extra=5)
    r |= {"kernel": "join", "version": "v4", "size": "100,000 x 10,000", "card": "NVIDIA H200",
          "one": bench_marks.paired([b + 1e-6 for b in bare], bare, 1, r["bare"])}
    line = bench_marks.summary_line(r)
    assert line.startswith("  join v4 100,000 x 10,000 (NVIDIA H200), bare plan 101.5 us: every stage marked +4.93% [")
    assert "(over the 2% target)" in line and "one stage mark a run +0.99% [" in line
    assert line.endswith("(under the 2% target)")
    assert bench_marks.summary_line(r | {"one": None}).endswith("; no runs with one stage mark")


def test_too_few_rounds_and_a_host_without_a_gpu_each_get_one_line_and_exit_2(capsys, monkeypatch):
    assert bench_marks.main(["--rounds", "2"]) == 2
    assert "--rounds must be at least 3" in capsys.readouterr().err
    monkeypatch.setattr(bench_marks, "select", lambda how: select("cpu"))
    assert bench_marks.main(["--rounds", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bench_marks: needs a GPU") and "\n" not in err


@pytest.mark.gpu
def test_untimed_stage_marks_are_the_same_marks_and_the_run_is_timed_by_its_own_pair():
    import cupy as cp

    from app.kernel.plan import get_plan_class
    from app.runtime.execute import backend_for
    from app.runtime.nvtx import Nvtx
    from app.runtime.recorder import GpuClock, Recorder

    plan = get_plan_class("join", "v4")({"points": 5_000, "polygons": 500})
    inputs = plan.make_inputs()
    backend, _ = backend_for(plan, select("gpu"))
    timed = Recorder("gpu", cp, Nvtx(False, "join"))
    n = len(plan.stages)
    untimed = Recorder("gpu", cp, Nvtx(False, "join"), clock=GpuClock(untimed=range(1, n)))
    out_t, rec_t = timed.run(plan, inputs, backend)
    host_t = backend.outputs_to_host(out_t)
    out_u, rec_u = untimed.run(plan, inputs, backend)
    host_u = backend.outputs_to_host(out_u)
    assert all((a == b).all() for a, b in zip(host_t, host_u))
    assert rec_u.marks == rec_t.marks == 1 + n
    assert [s["name"] for s in rec_u.stages] == [s["name"] for s in rec_t.stages]
    # Every stage touches an untimed mark; the run's own pair, its first mark and its last, is timed.
    assert all(math.isnan(s["seconds"]) for s in rec_u.stages)
    assert 0 < rec_u.total_seconds < 1 and all(s["seconds"] > 0 for s in rec_t.stages)
    # The same clock with every mark timed times every stage again.
    _, again = Recorder("gpu", cp, Nvtx(False, "join"), clock=GpuClock()).run(plan, inputs, backend)
    assert all(s["seconds"] > 0 for s in again.stages)


@pytest.mark.gpu
def test_on_a_gpu_every_kind_of_run_is_checked_and_each_part_is_given_a_mark_and_a_share(capsys):
    assert bench_marks.main(["--sizes", "join=20k:2k;overlay=2k:2k", "--rounds", "12", "--warm", "3"]) == 0
    out = capsys.readouterr().out
    heads = [line for line in out.splitlines() if "marks the bare plan does not record" in line]
    assert len(heads) == 2
    assert all("all arms ok=True bare ok=True marked ok=True untimed ok=True" in line for line in heads)
    assert all("side ok=True busy ok=True" in line for line in heads)
    graphs = [line for line in out.splitlines() if "stages after the build as one CUDA graph" in line]
    assert len(graphs) == 2 and all("bare ok=True timed ok=True untimed ok=True" in line for line in graphs)
    assert all("4 event record nodes" in line for line in graphs)      # both plans: five stages after the build
    for part in ("marks' cost (marked - bare)", "host side (untimed - bare)", "timestamps (marked - untimed)",
                 "same call, idle side stream (- bare)", "busy-wait", "one stage mark a run (- bare)",
                 "event nodes, timed (- bare replay)", "event nodes, untimed (- bare replay)"):
        rows = [line for line in out.splitlines() if part in line]
        assert len(rows) == 2, part
        for row in rows:
            m = re.search(r"(-?\d+\.\d+) us \[(-?\d+\.\d+), (-?\d+\.\d+)\]", row)
            mid, lo, hi = (float(x) for x in m.groups())
            assert lo <= mid <= hi
    # each stage of both plans: its time with every stage marked, then from the runs with one mark each
    stages = re.findall(r"^    (\w+) +(\d+\.\d) -> +(-?\d+\.\d) us \[(-?\d+\.\d), (-?\d+\.\d)\]", out, re.M)
    assert len(stages) == 12 and stages[0][0] == "owned_buffer_build"
    assert all(float(lo) <= float(mid) <= float(hi) for _, _, mid, lo, hi in stages)
    # the verdicts again at the end, a line a plan, after the chain's line
    tail = out.splitlines()[-3:]
    assert tail[0] == "against the 2% target:"
    defaults = tuple(f"{k} {get_plan_class(k).version}" for k in ("join", "overlay"))    # the plans bench_marks runs
    for line, plan in zip(tail[1:], defaults):
        assert line.startswith(f"  {plan} ") and line.count("target") == 2, line
        assert re.search(r"every stage marked [+-]\d+\.\d\d% \[[+-]\d+\.\d\d, [+-]\d+\.\d\d\] \(", line)
        assert re.search(r"one stage mark a run [+-]\d+\.\d\d% \[", line)
    assert re.search(r"a chain of 50 kernels of 20 us, the GPU the bound: a timed event after each adds "
                     r"-?\d+\.\d+ us of GPU time, an untimed one -?\d+\.\d+ us; the record call itself takes "
                     r"\d+\.\d+ us of host time \(timed\), \d+\.\d+ us \(untimed\)", out)


@pytest.mark.gpu
def test_event_nodes_captured_in_the_graph_are_recorded_by_each_replay_between_its_stages():
    """cuEventRecordWithFlags in a capture puts record nodes in the graph: a replay stamps them in order, and
    the stages between them add up to the replay's time (a plain record call would leave no node)."""
    import cupy as cp

    from app.kernel.plan import get_plan_class
    from app.runtime.execute import backend_for
    from app.runtime.graph import AfterBuild

    plan = get_plan_class("join", "v4")({"points": 20_000, "polygons": 2_000})
    inputs = plan.make_inputs()
    backend, _ = backend_for(plan, select("gpu"))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stages, blockers = AfterBuild.from_eager_run(plan, inputs, backend, stream)
        assert not blockers, blockers
        want = stages.reference
        nodes, record = [cp.cuda.Event() for _ in stages.after[1:]], bench_marks.node_recorder()
        graph = stages.capture(lambda k: record(nodes[k], stream))
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        graph.replay()
        end.record(stream)
        end.synchronize()
    got = backend.outputs_to_host(graph.state["output"])
    assert all((a == b).all() for a, b in zip(got, want)) and len(got[0]) > 0
    marks = [start, *nodes, end]
    steps = [cp.cuda.get_elapsed_time(a, b) for a, b in zip(marks, marks[1:])]
    assert all(s >= 0 for s in steps) and sum(steps) == pytest.approx(cp.cuda.get_elapsed_time(start, end), abs=0.01)
