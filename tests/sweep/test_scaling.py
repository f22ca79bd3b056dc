"""The sweep's fits on tables whose answer is known: exact power laws, noise, ties and crossings."""
import math

import numpy as np
import pandas as pd
import pytest

from app.sweep.plots import main_axis, speedup_rows
from app.sweep.scaling import best_per_size, crossovers, exponents, fit_exponent, t975


def table(rows):
    return pd.DataFrame(rows)


def grid(version, f, points=(1e4, 1e5, 1e6, 1e7), polygons=(1e3, 1e4), ci=0.0):
    return [{"version": version, "points": p, "polygons": q, "e2e_us": f(p, q),
             "e2e_ci95_lo_us": f(p, q) * (1 - ci), "e2e_ci95_hi_us": f(p, q) * (1 + ci),
             "refine_us": 2e-3 * p, "refine_bytes": 24 * p + 0 * q, "status": "ok"}
            for p in points for q in polygons]


def test_an_exact_power_law_gives_its_exponent_with_a_zero_width_interval():
    frame = table(grid("v1", lambda p, q: 3e-2 * p ** 1.25 * q ** 0.5))
    fit = fit_exponent(frame, "points", "e2e_us", ["polygons"])
    assert fit["slope"] == pytest.approx(1.25) and fit["top_slope"] == pytest.approx(1.25)
    assert fit["lo"] == pytest.approx(1.25) and fit["hi"] == pytest.approx(1.25)
    assert fit["points"] == 8 and fit["df"] == 5          # 8 points, one slope and two intercepts
    assert fit_exponent(frame, "polygons", "e2e_us", ["points"])["slope"] == pytest.approx(0.5)


def test_noise_widens_the_interval_and_it_still_covers_the_truth():
    rng = np.random.default_rng(1)
    noisy = table(grid("v1", lambda p, q: p ** 0.9 * math.exp(rng.normal(0, 0.05)), points=np.logspace(3, 7, 9)))
    fit = fit_exponent(noisy, "points", "e2e_us", ["polygons"])
    assert fit["lo"] < 0.9 < fit["hi"] and 0.01 < fit["hi"] - fit["lo"] < 0.2


def test_missing_and_failed_points_stay_out_of_every_fit():
    rows = grid("v1", lambda p, q: p)
    rows[0]["e2e_us"] = None                      # not measured
    rows[1] |= {"status": "failed", "e2e_us": 1e12}
    fit = fit_exponent(table(rows)[lambda f: f.status == "ok"], "points", "e2e_us", ["polygons"])
    assert fit["slope"] == pytest.approx(1.0) and fit["points"] == 6
    assert [r for r in exponents(table(rows), ["points", "polygons"], ["v1"], []) if r["axis"] == "points"][0][
        "points"] == 6


def test_two_points_fit_but_claim_no_interval():
    fit = fit_exponent(table(grid("v1", lambda p, q: p, points=(1e4, 1e5), polygons=(1e3,))), "points", "e2e_us", [])
    assert fit["slope"] == pytest.approx(1.0) and fit["lo"] is None and fit["df"] == 0


def test_one_size_is_no_fit():
    assert fit_exponent(table(grid("v1", lambda p, q: p, points=(1e4,))), "points", "e2e_us", ["polygons"]) is None


def test_t_quantiles():
    assert t975(1) == 12.706 and t975(30) == 2.042
    assert t975(31) == pytest.approx(2.0395, abs=2e-3) and t975(1000) == pytest.approx(1.9623, abs=1e-3)
    assert t975(0) == math.inf


def test_a_stage_growing_faster_than_its_cost_model_is_flagged():
    rows = grid("v1", lambda p, q: p)
    for r in rows:
        r["refine_us"] = 1e-4 * r["points"] ** 1.5 * (1.01 if r["polygons"] > 5e3 else 1.0)   # bytes grow as n^1
    fits = exponents(table(rows), ["points", "polygons"], ["v1"], ["refine"])
    refine = next(f for f in fits if f["what"] == "refine" and f["axis"] == "points")
    assert refine["model_slope"] == pytest.approx(1.0) and refine["faster_than_model"]
    e2e = next(f for f in fits if f["what"] == "total" and f["axis"] == "points")
    assert e2e["model_slope"] is None and not e2e["faster_than_model"]


def test_best_version_per_size_and_ties_on_overlapping_intervals():
    rows = grid("v1", lambda p, q: 100 + p / 1e3, ci=0.01) + grid("v2", lambda p, q: 300 + p / 2e3, ci=0.01)
    best = {(r["grid"]["points"], r["grid"]["polygons"]): r for r in best_per_size(table(rows), ["points", "polygons"])}
    assert best[(1e4, 1e3)]["best"] == "v1" and best[(1e7, 1e3)]["best"] == "v2"
    assert best[(1e7, 1e3)]["ratio"] == pytest.approx(10100 / 5300)
    assert not best[(1e7, 1e3)]["tie"]
    close = grid("v1", lambda p, q: 100.0, ci=0.02) + grid("v2", lambda p, q: 101.0, ci=0.02)
    assert all(r["tie"] for r in best_per_size(table(close), ["points", "polygons"]))


def test_a_runner_up_on_a_measurably_slower_host_is_said_to_be_so():
    """Each point runs in its own process: where the runner-up's host loop ran slower beyond both intervals, the
    row says by how much; overlapping loops, or points without a loop, say nothing."""
    def paced(rows, us, half):
        return [r | {"host_pace_us": us, "host_pace_ci95_lo_us": us - half, "host_pace_ci95_hi_us": us + half}
                for r in rows]

    v1 = paced(grid("v1", lambda p, q: 100.0, ci=0.01), 50.0, 1.0)
    slow = paced(grid("v2", lambda p, q: 130.0, ci=0.01), 76.0, 2.0)
    for r in best_per_size(table(v1 + slow), ["points", "polygons"]):
        assert r["best"] == "v1" and r["host_slower_pct"] == pytest.approx(52.0)
    near = paced(grid("v2", lambda p, q: 130.0, ci=0.01), 51.5, 1.0)          # intervals overlap: nothing said
    assert all(r["host_slower_pct"] is None for r in best_per_size(table(v1 + near), ["points", "polygons"]))
    bare = grid("v2", lambda p, q: 130.0, ci=0.01)                              # a point without a loop
    assert all(r["host_slower_pct"] is None for r in best_per_size(table(v1 + bare), ["points", "polygons"]))
    from app.sweep.report import _best

    lines = _best(table(v1 + slow), ["points", "polygons"])
    assert sum("30.0% (its host CPU ran 52.0% slower, by a fixed Python loop" in line for line in lines) == 8
    assert not any("host CPU" in line for line in _best(table(v1 + near), ["points", "polygons"]))
    # the launches too (GPU points): a runner-up whose launches alone ran measurably slower is said to be so
    def launched(rows, us, half):
        return [r | {"launch_pace_us": us, "launch_pace_ci95_lo_us": us - half, "launch_pace_ci95_hi_us": us + half}
                for r in rows]

    fast_launch, slow_launch = launched(v1, 5.0, 0.2), launched(near, 6.0, 0.2)
    rows = best_per_size(table(fast_launch + slow_launch), ["points", "polygons"])
    assert all(r["launch_slower_pct"] == pytest.approx(20.0) and r["host_slower_pct"] is None for r in rows)
    lines = _best(table(fast_launch + slow_launch), ["points", "polygons"])
    assert sum("30.0% (its launches took 20.0% longer, by an empty kernel's: part of the gap may be the host's)"
               in line for line in lines) == 8
    both = _best(table(launched(v1, 5.0, 0.2) + launched(slow, 6.0, 0.2)), ["points", "polygons"])
    assert sum("slower, by a fixed Python loop; its launches took 20.0% longer" in line for line in both) == 8
    assert all(r["launch_slower_pct"] is None for r in best_per_size(table(fast_launch + launched(near, 5.1, 0.2)),
                                                                      ["points", "polygons"]))


def test_crossover_found_between_the_sizes_where_the_order_flips():
    rows = grid("v1", lambda p, q: 100 + p / 1e3, ci=0.01) + grid("v2", lambda p, q: 300 + p / 2e3, ci=0.01)
    found = [c for c in crossovers(table(rows), ["points", "polygons"], ["v1", "v2"]) if c["axis"] == "points"]
    assert len(found) == 2                          # one per polygons value
    c = found[0]
    assert c["between"] == (1e5, 1e6) and c["faster_below"] == "v1" and c["faster_above"] == "v2"
    assert 1e5 < c["at"] < 1e6 and c["clear"]
    # exact crossing of the two lines: 100 + p/1000 = 300 + p/2000 -> p = 400k; log interpolation lands near it
    assert c["at"] == pytest.approx(4e5, rel=0.5)


def test_a_crossing_inside_the_run_spread_is_not_clear():
    rows = grid("v1", lambda p, q: 100.0 + (p > 5e4), ci=0.05) + grid("v2", lambda p, q: 100.5, ci=0.05)
    found = crossovers(table(rows), ["points", "polygons"], ["v1", "v2"])
    assert found and not any(c["clear"] for c in found)


def test_speedup_rows_and_main_axis():
    rows = grid("v1", lambda p, q: 2.0 * p) + grid("v2", lambda p, q: p)
    frame = table(rows)
    sp = speedup_rows(frame, ["points", "polygons"], ["v1", "v2"])
    assert len(sp) == 8 and (sp["speedup"] == 2.0).all() and set(sp["version"]) == {"v2"}
    assert main_axis(frame, ["polygons", "points"]) == "points"


def test_grid_axes_sizes_and_tied_parameters():
    from app.sweep.spec import SweepSpec, parse_grid

    axes = parse_grid("overlay", ["v1"], ["left,right=1k,20k", "vertices=8,16"])
    assert axes == {"left,right": [1000, 20000], "vertices": [8, 16]}
    spec = SweepSpec("overlay", ["v1", "v2"], axes, {"layout": "shifted"})
    points = spec.points()
    assert len(points) == 8 and spec.name == "left+right-vertices"
    p = points[0]
    assert p["id"] == "v1_left+right-1k_vertices-8" and p["grid"] == {"left,right": 1000, "vertices": 8}
    assert p["params"] == {"layout": "shifted", "left": 1000, "right": 1000, "vertices": 8}
    assert spec.cli_args(p)[:2] == ["overlay", "v1"] and "--right" in spec.cli_args(p)
    assert [q["version"] for q in points[:2]] == ["v1", "v2"]          # versions side by side, size by size
