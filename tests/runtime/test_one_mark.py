"""Stage times from runs with one stage mark each: the arithmetic, the recorder's one-mark runs, and the overhead
pairs running them on a real CPU plan (the GPU's, through event mode, is in tests/cli/test_event_profile.py)."""
import math
import random

import numpy as np
import pytest

from app.kernel.plan import KernelPlan, get_plan_class
from app.runtime.device import select
from app.runtime.execute import backend_for
from app.runtime.nvtx import Nvtx
from app.runtime.one_mark import estimate, from_rounds
from app.runtime.recorder import OneMarkRecorder, Recorder
from app.runtime.timing import instrumentation_overhead
from tests.runtime.test_recorder_bookkeeping import _Clock     # a clock whose marks are 1, 2, 3, ... in order

NAMES = ["build", "sort", "filter", "emit"]


def _rounds(bare, marked, to_mark, totals):
    """Rounds as one_mark_runs collects them: ``to_mark[k]``/``totals[k]`` the one-mark run of stage k, per round."""
    return [{"bare": bare[i], "marked": marked[i], "marked_total": sum(marked[i])}
            | {k: (to_mark[k][i], totals[k][i]) for k in to_mark} for i in range(len(bare))]


def test_each_stage_is_the_step_between_the_times_to_its_marks_round_by_round():
    """C_1..C_3 from the runs marked after stages 1-3, C_4 the bare run's total: the stages are the steps; with no
    noise they add up to the bare plan and their intervals have no width. What the other marks add is the
    every-stage-marked run's stage less the step; the one-mark runs' overhead is against their round's bare run."""
    r = 9
    samples = _rounds([10.0] * r, [[3.0, 2.0, 4.0, 2.5]] * r, {1: [3.0] * r, 2: [4.5] * r, 3: [8.0] * r},
                      {1: [10.5] * r, 2: [10.25] * r, 3: [10.75] * r})
    out = estimate(NAMES, samples)
    assert [s["name"] for s in out["stages"]] == NAMES
    assert [s["seconds"] for s in out["stages"]] == [3.0, 1.5, 3.5, 2.0]
    assert all(s["ci95"] == [s["seconds"]] * 2 and s["resolved"] for s in out["stages"])
    assert [s["marked_seconds"] for s in out["stages"]] == [3.0, 2.0, 4.0, 2.5]
    assert [s["marks_add_seconds"] for s in out["stages"]] == [0.0, 0.5, 0.5, 0.5]
    assert out["bare_median_seconds"] == out["stage_sum_seconds"] == 10.0 and out["marked_median_seconds"] == 11.5
    # the one-mark runs against their rounds' bare runs: +0.5, +0.25, +0.75 -> +0.5 a round, every round alike
    assert out["overhead_seconds"] == 0.5 and out["overhead_fraction"] == 0.05
    assert out["overhead_ci95"] == [0.05, 0.05]


def test_the_one_mark_overhead_takes_one_figure_a_round_and_no_interval_under_six_rounds():
    """A round's one-mark runs share its bare run: they are one sample, not n - 1. Two rounds of three one-mark
    runs each are 2 samples (no interval), not 6; with 9 rounds the interval is the rounds' medians'."""
    two = estimate(NAMES, _rounds([10.0, 12.0], [[3.0, 2.0, 4.0, 2.5]] * 2, {1: [3.0] * 2, 2: [4.5] * 2, 3: [8.0] * 2},
                                  {1: [10.5, 12.1], 2: [10.25, 12.2], 3: [10.75, 12.3]}))
    assert two["overhead_seconds"] == pytest.approx((0.5 + 0.2) / 2)
    assert all(math.isnan(v) for v in two["overhead_ci95"])
    r = 9
    bare = [10.0 + i for i in range(r)]
    nine = estimate(NAMES, _rounds(bare, [[3.0, 2.0, 4.0, 2.5]] * r, {1: [3.0] * r, 2: [4.5] * r, 3: [8.0] * r},
                                   {k: [b + 0.1 * i + d for i, b in enumerate(bare)]
                                    for k, d in ((1, 0.0), (2, 1.0), (3, 2.0))}))
    # each round's median difference is its middle run's: 1.0 + 0.1 i, i = 0..8; their median 1.4
    assert nine["overhead_seconds"] == pytest.approx(1.4)
    lo, hi = (v * nine["bare_median_seconds"] for v in nine["overhead_ci95"])
    assert lo == pytest.approx(1.1) and hi == pytest.approx(1.7)      # ranks 2 and 8 of 9 (median_rank(9) = 2)


def test_a_stage_lost_in_the_plans_noise_is_not_resolved_and_a_clear_one_is():
    """Stage 2 adds nothing beyond noise: its interval reaches zero. Stage 3 adds 50 on a spread of 1: resolved,
    and its interval holds the truth."""
    rng = random.Random(1)
    noise = lambda mean: [mean + rng.gauss(0, 1) for _ in range(200)]   # noqa: E731
    samples = _rounds(noise(160), [[100.0, 0.0, 50.0, 10.0]] * 200, {1: noise(100), 2: noise(100), 3: noise(150)},
                      {k: noise(161) for k in (1, 2, 3)})
    stages = estimate(NAMES, samples)["stages"]
    assert stages[0]["resolved"] and stages[2]["resolved"]
    assert not stages[1]["resolved"] and stages[1]["ci95"][0] <= 0 <= stages[1]["ci95"][1]
    lo, hi = stages[2]["ci95"]
    assert lo < 50 < hi and hi - lo < 1.0


def test_one_stage_gives_the_bare_plan_and_no_overhead():
    out = estimate(["only"], _rounds([2.0, 3.0, 4.0], [[2.1], [3.1], [4.1]], {}, {}))
    assert out["stages"][0]["seconds"] == 3.0 and "overhead_fraction" not in out
    assert out["stages"][0]["marks_add_seconds"] == pytest.approx(0.1)


class _Spec:
    def __init__(self, name):
        self.name, self.category = name, "compute"


class _Plan(KernelPlan):
    kernel, version = "demo", "v1"
    stages = [_Spec(n) for n in NAMES]

    def __init__(self):
        self.tiling = {n: {} for n in NAMES}


class _Backend:
    def __init__(self):
        self.ends = []

    def __getattr__(self, name):
        def stage(state, st, tiling):
            state["output"] = name
        return stage


@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_one_mark_run_marks_only_the_end_of_its_stage(k):
    """The run's first mark, then one at stage k's end, then the run's end: three marks, and the time to the
    stage mark is one step of the counting clock; no stage's own time is measured."""
    recorder = OneMarkRecorder("cpu", np, Nvtx(False, "demo"), k, clock=_Clock())
    out, rec = recorder.run(_Plan(), {}, _Backend())
    assert out == "emit" and rec.marks == 3
    assert rec.to_boundary == 1.0 and rec.total_seconds == 2.0
    assert rec.stages == []            # like a bare run's: no stage is timed on its own
    again = recorder.run(_Plan(), {}, _Backend())[1]        # a second run: one step again, three marks
    assert (again.to_boundary, again.marks) == (1.0, 3)


def test_a_bare_run_and_a_boundary_past_the_last_stage_carry_no_stage_mark():
    bare = Recorder("cpu", np, Nvtx(False, "demo"), per_stage=False, clock=_Clock()).run(_Plan(), {}, _Backend())[1]
    past = OneMarkRecorder("cpu", np, Nvtx(False, "demo"), 9, clock=_Clock()).run(_Plan(), {}, _Backend())[1]
    assert bare.marks == past.marks == 2 and bare.to_boundary is None and past.to_boundary is None


def test_rounds_whose_one_mark_run_missed_its_mark_are_refused():
    bare = Recorder("cpu", np, Nvtx(False, "demo"), per_stage=False, clock=_Clock())
    marked = Recorder("cpu", np, Nvtx(False, "demo"), clock=_Clock())
    got = {"bare": bare.run(_Plan(), {}, _Backend())[1], "marked": marked.run(_Plan(), {}, _Backend())[1]}
    got |= {k: bare.run(_Plan(), {}, _Backend())[1] for k in (1, 2, 3)}
    with pytest.raises(RuntimeError, match=r"end of stage 1 \(build\) recorded no mark there"):
        from_rounds(NAMES, [got], "count")


def test_the_overhead_pairs_run_the_one_mark_runs_in_their_rounds_on_a_real_cpu_plan():
    """Join v1 on the CPU: every round of the overhead pairs also runs the plan once marked at the end of each
    stage but the last, in a shuffled order, each run after the L2 step. Every output is the same, the pairs'
    own estimate is unchanged in kind, and every stage gets a time, one from the marked run, and an interval."""
    plan = get_plan_class("join", "v1")({"points": 3000, "polygons": 300})
    inputs = plan.make_inputs()
    backend, _ = backend_for(plan, select("cpu"))
    names = [s.name for s in plan.stages]
    nvtx = Nvtx(False, "join")
    outputs, order = [], []

    def runner(recorder, name):
        def run():
            out, rec = recorder.run(plan, inputs, backend)
            outputs.append([np.asarray(o).tolist() for o in out])
            order.append(name)
            return out, rec
        return run

    others = {k: runner(OneMarkRecorder("cpu", np, nvtx, k), k) for k in range(1, len(names))}
    flushes = []
    out = instrumentation_overhead(runner(Recorder("cpu", np, nvtx), "marked"),
                                   runner(Recorder("cpu", np, nvtx, per_stage=False), "bare"),
                                   lambda: flushes.append(1), pairs=12, others=others)
    arms = len(names) + 1
    assert out["pairs"] == 12 and len(out["rounds"]) == 12 and len(flushes) == len(outputs) == 12 * arms
    assert all(o == outputs[0] for o in outputs)
    rounds = [order[i:i + arms] for i in range(0, len(order), arms)]
    assert all(sorted(map(str, r)) == sorted(map(str, ["marked", "bare", *others])) for r in rounds)
    assert len({tuple(map(str, r)) for r in rounds}) > 1               # shuffled, not one fixed order
    assert out["extra_marks"] == len(names) - 1 and "shuffled order" in out["how"]
    got = from_rounds(names, out["rounds"], out["stopped"])
    assert got["rounds"] == 12 and [s["name"] for s in got["stages"]] == names
    assert math.isclose(got["stage_sum_seconds"], sum(s["seconds"] for s in got["stages"]))
    assert got["stages"][0]["seconds"] > 0 and got["overhead_fraction"] is not None
    assert all(s["marked_seconds"] > 0 for s in got["stages"]) and got["marked_median_seconds"] > 0
    # The trace keeps every run these figures come from, and they give the same figures again.
    kept = got["samples"]
    assert len(kept) == 12 and all(len(r["to_boundary"]) == len(r["one_mark_total"]) == len(names) - 1 for r in kept)
    rebuilt = [{"bare": r["bare"], "marked_total": r["marked_total"], "marked": r["marked"]}
               | {k: (r["to_boundary"][k - 1], r["one_mark_total"][k - 1]) for k in range(1, len(names))}
               for r in kept]
    assert estimate(names, rebuilt) == {k: v for k, v in got.items() if k not in ("rounds", "stopped", "samples")}
    pairs = out["samples"]
    diffs = [m - b for m, b in zip(pairs["marked"], pairs["bare"])]
    assert len(diffs) == 12 and out["overhead_fraction"] == np.median(diffs) / np.median(pairs["bare"])
