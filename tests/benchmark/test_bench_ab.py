"""bench_ab interleaves a kernel's versions and says whether the default is the fastest: its arithmetic, a real
run on the CPU plans, one on the GPU, and its one-line refusals."""
import pytest

from app.kernel.plan import get_plan_class, kernels
from tests.benchmark import bench_ab


def test_each_version_is_judged_by_its_paired_ratios_to_the_fastest():
    fast = [1.0, 1.2, 0.9, 1.5, 1.0, 1.1, 0.95]              # a host whose speed moves from round to round
    times = {"v1": fast,
             "v2": [1.5 * t for t in fast],                     # always half as slow again, in the same round
             "v3": [t * f for t, f in zip(fast, (1.02, 0.97, 1.01, 0.99, 1.03, 0.98, 1.0))]}
    r = bench_ab.against_fastest(times)
    assert r["fastest"] == "v1" and r["versions"]["v1"]["verdict"] == "fastest"
    v2 = r["versions"]["v2"]
    assert v2["ratio"] == pytest.approx(1.5) and v2["ratio_ci"] == pytest.approx((1.5, 1.5))
    assert v2["verdict"] == "slower"
    assert r["versions"]["v3"]["verdict"] == "tie"
    # The medians of the times alone would have overlapped (the host's own spread is wider than v2's lag).
    lo2, _ = v2["ci"]
    assert lo2 < r["versions"]["v1"]["ci"][1]


def test_what_the_runs_say_of_the_default():
    r = bench_ab.against_fastest({"v1": [1.0] * 6, "v2": [2.0] * 6})
    assert bench_ab.default_text("v1", r) == "the default v1 is the fastest"
    assert bench_ab.default_text("v2", r).startswith("the default v2 is SLOWER than v1: 2.00x [2.00-2.00]")
    few = bench_ab.against_fastest({"v1": [1.0] * 5, "v2": [2.0] * 5})
    assert bench_ab.default_text("v2", few) == ("the default v2 is not judged against v1 (2.00x of its time): a 95% "
                                                "interval of the rounds' ratios needs at least 6 rounds")
    tie = bench_ab.against_fastest({"v1": [1.0, 1.1, 0.9, 1.0, 1.05, 1.0], "v2": [1.05, 1.0, 0.95, 1.02, 1.0, 1.0]})
    slow = "v2" if tie["fastest"] == "v1" else "v1"
    assert bench_ab.default_text(slow, tie).startswith(f"the default {slow} ties with the fastest")
    assert bench_ab.default_text("v7", r) == "the default v7 was not measured"
    # Round by round faster, though its median is not the lowest: said as such, not as a tie.
    split = {"fastest": "v1", "versions": {"v2": {"verdict": "faster", "ratio": 0.9, "ratio_ci": (0.8, 0.95)}}}
    assert bench_ab.default_text("v2", split) == ("the default v2 is faster than v1 round by round (0.90x "
                                                  "[0.80-0.95] of v1's time), though v1's median is lower")


def test_the_cpu_plans_of_every_version_interleaved_each_checked_against_shapely(capsys):
    assert bench_ab.main(["join", "--sizes", "2k:200", "--rounds", "4", "--warm", "1", "--device", "cpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line.startswith("  v")]
    assert [row.split()[0] for row in rows] == sorted(kernels()["join"])
    assert all("ok=True" in row and "after build" in row and "end to end" in row for row in rows)
    assert sum(row.count("(fastest)") for row in rows) == 2      # one fastest for each measure
    default = get_plan_class("join").version
    assert any(line.startswith(f"  after build: the default {default} ") for line in out)
    assert ("  on the CPU v1 and v3 and v4 and v5 run v1's stages (the versions differ in their GPU kernels only): they time "
            "the same code, so their ratios to each other are noise") in out


@pytest.mark.parametrize("argv, said", [
    (["join", "--versions", "v1,v9"], "unknown version v9 of join"),
    (["join", "--versions", "v1"], "--versions needs two versions or more"),
    (["overlay", "--rounds", "2"], "--rounds must be at least 3"),
    (["join", "--sizes", "100k"], "--sizes '100k': expected A:B"),
])
def test_bad_arguments_get_one_line_and_exit_2(argv, said, capsys):
    assert bench_ab.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bench_ab: ") and said in err and "\n" not in err


@pytest.mark.gpu
def test_on_a_gpu_the_runs_flush_l2_and_every_version_is_checked(capsys):
    assert bench_ab.main(["overlay", "--sizes", "1k:1k", "--rounds", "5", "--warm", "2", "--device", "gpu"]) == 0
    out = capsys.readouterr().out
    assert "L2 flushed before each run" in out
    rows = [line for line in out.splitlines() if line.startswith("  v")]
    assert len(rows) == len(kernels()["overlay"]) and all("ok=True" in row for row in rows)
