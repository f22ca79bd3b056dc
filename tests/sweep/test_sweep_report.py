"""What a sweep's report may claim, on tables whose answer is known, and the refusals that come before any point
runs: names as an axis, sizes of 0, points without an interval, a version that failed at a size, a --resume with
other options, an interrupted write."""
import json
import sys
from pathlib import Path

import pytest

from app.errors import Terminated
from app.kernel.cli import main
from app.sweep.report import _best, _crossovers, sweep_files
from app.sweep.results import to_frame, write_results
from app.sweep.scaling import best_per_size, crossovers, exponents
from app.sweep.spec import SweepSpec

STAGES = ["refine"]
RUN = [{"command": "python -m app.kernel sweep join ...", "runner": "this process, one point at a time (no Dask)",
        "wall_seconds": 12.5, "start_seconds": 0.5, "points_seconds": 11.9, "close_seconds": 0.1}]


def point(version, grid, e2e, ci=0.01, status="ok"):
    """A row as results.csv has it; ``ci`` None: no 95% interval (under 6 timed runs), left empty."""
    timed = status == "ok" and e2e is not None
    return {"point": "_".join([version] + [f"{k}-{v}" for k, v in grid.items()]), "version": version, **grid,
            "status": status, "e2e_us": e2e if timed else None,
            "e2e_ci95_lo_us": e2e * (1 - ci) if timed and ci is not None else None,
            "e2e_ci95_hi_us": e2e * (1 + ci) if timed and ci is not None else None,
            "refine_us": e2e / 2 if timed else None, "attempts": 1, "worker_lost": 0,
            "error": "" if status == "ok" else "error: boom", "profile": None, "worker": "local"}


def frame_of(rows, axes):
    return to_frame(rows, axes)


def test_a_grid_over_names_fits_the_numeric_axes_and_says_which_it_skipped():
    axes = {"points": [1000, 2000, 4000], "layout": ["uniform", "clustered"]}
    rows = [point(v, {"points": p, "layout": lay}, k * p * (2 if lay == "clustered" else 1))
            for v, k in (("v1", 1.0), ("v2", 1.5)) for p in axes["points"] for lay in axes["layout"]]
    frame = frame_of(rows, list(axes))
    fits = exponents(frame, list(axes), ["v1", "v2"], STAGES)
    assert {f["axis"] for f in fits} == {"points"} and all(f["slope"] == pytest.approx(1.0) for f in fits)
    assert all(c["axis"] == "points" for c in crossovers(frame, list(axes), ["v1", "v2"]))
    spec = SweepSpec("join", ["v1", "v2"], axes, {}, "event", "cpu", 6, 0, "flush")
    files = sweep_files(spec, frame, STAGES, RUN)
    report = files["report.md"]
    assert "- v1: the total grows as n^1.00 in points" in report
    assert "- layout is not numeric: no growth is fitted along it" in report
    assert "- layout is not numeric: no crossing is placed along it" in report
    assert "| 1k | clustered | v1 |" in report
    assert files["scaling.png"][:4] == b"\x89PNG" and files["speedup.png"][:4] == b"\x89PNG"
    only_names = {"layout": ["uniform", "clustered"]}
    frame = frame_of([point(v, {"layout": lay}, 10.0 * (i + 1)) for i, v in enumerate(("v1", "v2"))
                      for lay in only_names["layout"]], ["layout"])
    report = sweep_files(SweepSpec("join", ["v1", "v2"], only_names), frame, STAGES, RUN)["report.md"]
    assert "No axis of this grid is numeric and a size: no growth to fit." in report


def test_a_seed_is_no_size_and_gets_no_exponent():
    """A numeric axis the plan needs no more memory for (a seed) is told apart from a size: no growth is fitted
    along it (a slope against the seed's logarithm would describe no scaling), and the fits along the size take
    one intercept per seed."""
    axes = {"points": [1000, 2000, 4000], "seed": [1, 2]}
    rows = [point(v, {"points": p, "seed": sd}, k * p * (1.1 if sd == 2 else 1.0))
            for v, k in (("v1", 1.0), ("v2", 1.5)) for p in axes["points"] for sd in axes["seed"]]
    frame = frame_of(rows, list(axes))
    report = sweep_files(SweepSpec("join", ["v1", "v2"], axes, {}, "event", "cpu", 6, 0, "flush"), frame, STAGES,
                         RUN)["report.md"]
    assert "- seed is not a size (the plan needs no more memory at its largest value than at its smallest): no growth " \
           "is fitted along it" in report
    assert "| v1 | seed |" not in report and "in seed" not in report
    assert "- v1: the total grows as n^1.00 in points" in report


@pytest.mark.parametrize("axis", ["points", "seed"])
def test_a_grid_of_zeros_is_drawn_on_a_linear_axis(axis):
    axes = {axis: [0]}
    frame = frame_of([point(v, {axis: 0}, t) for v, t in (("v1", 300.0), ("v2", 450.0))], [axis])
    files = sweep_files(SweepSpec("join", ["v1", "v2"], axes), frame, STAGES, RUN)
    assert files["scaling.png"][:4] == b"\x89PNG" and files["speedup.png"][:4] == b"\x89PNG"
    assert "Nothing to fit" in files["report.md"]


def test_a_crossing_next_to_zero_is_placed_linearly():
    rows = [point("v1", {"points": p}, t) for p, t in ((0, 100.0), (1000, 300.0))] + \
           [point("v2", {"points": p}, t) for p, t in ((0, 200.0), (1000, 150.0))]
    (c,) = crossovers(frame_of(rows, ["points"]), ["points"], ["v1", "v2"])
    assert 0 < c["at"] < 1000 and c["faster_below"] == "v1" and c["clear"]


def test_without_intervals_the_order_is_unresolved_never_clear():
    """Under 6 timed runs a point has no 95% interval: a 1.3% lead, or a crossing, may be noise."""
    rows = [point("v1", {"points": 1000}, 100.0, ci=None), point("v2", {"points": 1000}, 101.3, ci=None)]
    (best,) = best_per_size(frame_of(rows, ["points"]), ["points"])
    assert best["best"] == "v1" and best["tie"] is None
    line = next(x for x in _best(frame_of(rows, ["points"]), ["points"]) if x.startswith("| 1k"))
    assert "1.3% (unresolved, possibly noise: no 95% interval, fewer than 6 timed runs)" in line
    rows = [point("v1", {"points": p}, t, ci=None) for p, t in ((1000, 100.0), (2000, 200.0))] + \
           [point("v2", {"points": p}, t, ci=None) for p, t in ((1000, 110.0), (2000, 180.0))]
    (c,) = crossovers(frame_of(rows, ["points"]), ["points"], ["v1", "v2"])
    assert not c["clear"] and c["why"] == "no interval"
    text = "\n".join(_crossovers(frame_of(rows, ["points"]), ["points"], ["v1", "v2"]))
    assert "1 crossing not resolved (a point at one end has no 95% interval: fewer than 6 timed runs), so possibly " \
           "noise: v1 and v2 along points 1k-2k." in text             # which two versions swap places, and where
    assert "they cross near" not in text
    report = sweep_files(SweepSpec("join", ["v1", "v2"], {"points": [1000, 2000]}, bench_runs=3),
                         frame_of(rows, ["points"]), STAGES, RUN)["report.md"]
    assert "**4 of 4 points have no 95% interval**" in report


def test_a_best_version_whose_rival_failed_says_so():
    rows = [point("v1", {"points": 1000}, 100.0), point("v2", {"points": 1000}, None, status="failed"),
            point("v3", {"points": 1000}, 150.0),
            point("v1", {"points": 2000}, 200.0), point("v2", {"points": 2000}, 190.0, status="wrong")]
    lines = _best(frame_of(rows, ["points"]), ["points"], ["v1", "v2", "v3"])
    assert "| 1k | v1 | 100.0 us | v3 (v2 failed) | 50.0% |" in lines
    assert "| 2k | v1 | 200.0 us | v2 wrong (output differs from shapely's), v3 not run | - |" in lines


def test_an_interrupted_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    import app.runtime.cache as cache          # where the sweep's atomic write lives

    write_results(tmp_path, [point("v1", {"points": 1000}, 100.0)], ["points"])
    before = (tmp_path / "results.csv").read_text()

    def terminated(*a):
        raise Terminated()
    monkeypatch.setattr(cache.os, "replace", terminated)
    with pytest.raises(Terminated):
        write_results(tmp_path, [point("v1", {"points": 2000}, 200.0)], ["points"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv"]
    assert (tmp_path / "results.csv").read_text() == before


@pytest.mark.parametrize("args, message", [
    (["join", ",", "--grid", "points=1k"], "version list ',' names no version"),
    (["join", "v1", "--grid", "points=,,"], "--grid 'points=,,' gives no value"),
    (["join", "v1", "--grid", "points=1k,100G", "--device", "cpu"],
     "point v1_points-100000M: points = 100,000,000,000 exceeds the kernels' 32-bit index limit"),
])
def test_bad_points_are_refused_before_any_runs(tmp_path, capsys, args, message):
    assert main(["sweep", *args, "--workers", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "sweeps").exists()


def test_a_sweep_of_size_zero_reports_and_resume_keeps_its_options_and_its_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "distributed", None)          # one point after another, no Dask
    argv = ["sweep", "join", "v1", "--grid", "points=0", "--polygons", "50", "--device", "cpu", "--bench_runs", "2",
            "--warmup", "0", "--out", str(tmp_path)]
    assert main(argv) == 0
    (d,) = (tmp_path / "sweeps" / "join").glob("*/*/")
    assert (d / "scaling.png").exists()
    report = (d / "report.md").read_text()
    (first,) = json.loads((d / "runs.json").read_text())
    assert f"- Ran on: this process, one point at a time (no Dask); wall time {first['wall_seconds']:,.1f} s" in report
    capsys.readouterr()
    assert main(["sweep", "--resume", str(d), "--bench_runs", "20", "--device", "gpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "drop --device gpu, --bench_runs 20" in err and "--device cpu --bench_runs 2" in err
    assert main(["sweep", "join", "--resume", str(d), "--polygons", "50", "--workers", "1"]) == 0
    assert (d / "report.md").read_text() == report                  # nothing ran: the same runs describe the data
    assert json.loads((d / "runs.json").read_text()) == [first]
    assert sorted(p.name for p in Path(d).iterdir() if p.name.startswith(".")) == []
