"""compare with several profiles a side, each from its own process: nine real profiles of the default join made
back to back on one H200 host (tests/data/event/processes, the command in tests/data/event/README.md). Six ran
the same code, 373 to 597 us; three ran it with candidate_filter slowed by a 0.3 ms sleep, 815 to 969 us."""
import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from app.analysis.compare import (MIN_PROCESSES, MIN_RUNS, compare_processes, compare_traces, process_verdict,
                                  verdict_of)
from app.kernel.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "event" / "processes"
SAME = {n: DATA / f"p{n}_same.trace.json" for n in (1, 2, 4, 5, 7, 8)}
SLOWED = {n: DATA / f"p{n}_slowed.trace.json" for n in (3, 6, 9)}


def load(path):
    return json.loads(Path(path).read_text())


def paths(*ps):
    return ",".join(str(p) for p in ps)


def test_one_profile_a_side_of_the_same_code_reads_faster_in_its_runs_and_is_no_verdict():
    """p1 ran while its host was slow (its loop and launches slower): against p8, the same code, one profile a side
    reads a third faster, a change the runs' interval resolves -- the host's change, not the code's -- so one
    process a side draws no verdict; the caution about the host still says why the runs differ."""
    r = compare_traces(load(SAME[1]), load(SAME[8]))
    assert r["verdict"] == "noise" and r["total"]["within_process"] == "faster"
    assert r["total"]["ci_pct"][1] < -10 and r["caution"]
    assert r["total"]["processes"] == [1, 1] and "process_medians_us" not in r["total"]


def test_three_processes_a_side_of_the_same_code_are_noise(capsys):
    """The same two sides as three processes each, in the order they ran: p1, p4, p7 against p2, p5, p8. Each
    side's figure is the median of its processes' medians; three a side are too few for a verdict."""
    base, new = [SAME[n] for n in (1, 4, 7)], [SAME[n] for n in (2, 5, 8)]
    assert main(["compare", paths(*base), paths(*new), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    total = doc["total"]
    assert doc["verdict"] == "noise" and total["ci_pct"] == [None, None] and not doc["regression"]
    assert total["why"].startswith(f"too few processes (3 a side; a verdict needs {MIN_PROCESSES})")
    assert total["processes"] == [3, 3] and total["samples"] == [90, 90] and doc["min_processes"] == MIN_PROCESSES
    medians = [[load(p)["total_elapsed_seconds"] * 1e6 for p in side] for side in (base, new)]
    assert all(got == pytest.approx(want) for got, want in zip(total["process_medians_us"], medians))
    assert total["base_median_us"] == pytest.approx(sorted(medians[0])[1])     # the middle process's median
    assert total["new_median_us"] == pytest.approx(sorted(medians[1])[1])
    assert {s["name"] for s in doc["stages"]} >= {"owned_buffer_build", "candidate_filter", "output_sort"}
    # the host's pace the same way: the median of each side's processes' loop medians
    loops = [[statistics.median(load(p)["timing"]["host_pace"]["samples"]) for p in side] for side in (base, new)]
    assert [doc["host_pace"]["base_median_us"], doc["host_pace"]["new_median_us"]] == \
        pytest.approx([1e6 * statistics.median(side) for side in loops])


def test_three_processes_a_side_of_the_slowed_code_are_too_few_for_a_verdict(capsys):
    """Three processes a side, the slowed code's against the same code's: the change is shown (candidate_filter
    +1,600%), but three a side are too few for a verdict, and the gate refuses them (it had fired on as few as
    two)."""
    base, new = [SAME[n] for n in (2, 5, 8)], list(SLOWED.values())
    assert main(["compare", paths(*base), paths(*new), "--fail-on-regression", "5"]) == 2
    assert "--fail-on-regression needs 5 or more profiles a side" in capsys.readouterr().err
    assert main(["compare", paths(*base), paths(*new)]) == 0
    out = capsys.readouterr().out
    assert "whole plan (total): NOISE" in out and "regression" not in out
    assert f"noise, no interval: too few processes (3 a side; a verdict needs {MIN_PROCESSES})" in out
    assert "processes: base 3 (medians " in out and "the interval resamples the processes, then their runs" in out
    r = compare_processes([load(p) for p in base], [load(p) for p in new])
    by = {s["name"]: s for s in r["stages"]}
    assert by["candidate_filter"]["verdict"] == "noise" and by["candidate_filter"]["change_pct"] > 1000
    assert r["caution"] is None


def _side(rng, processes, spread, slower=0.0, runs=MIN_RUNS):
    """One side's processes: each its own pace (a relative standard deviation of ``spread`` from one process to the
    next), its runs within 1% of it."""
    return [list(1e-3 * (1 + slower) * f * (1 + 0.01 * rng.standard_normal(runs)))
            for f in 1 + spread * rng.standard_normal(processes)]


def test_two_processes_a_side_never_give_a_verdict():
    """Identical code, two processes a side, the host's pace 10% apart from one process to the next: each side's
    resampled figure takes one of three values, and 34% of such comparisons had read faster or slower."""
    rng = np.random.default_rng(3)
    verdicts = [process_verdict(_side(rng, 2, 0.10), _side(rng, 2, 0.10)) for _ in range(60)]
    assert {v["verdict"] for v in verdicts} == {"noise"}
    assert {v["why"] for v in verdicts} == {f"too few processes (2 a side; a verdict needs {MIN_PROCESSES}): profile "
                                            f"each side in {MIN_PROCESSES} or more processes, the two in turns"}
    assert all(v["change_pct"] is not None and v["ci_pct"] == [None, None] for v in verdicts)
    assert process_verdict(_side(rng, 1, 0.1), _side(rng, 3, 0.1))["why"].startswith("too few processes (1 and 3")


def test_the_fewest_processes_for_a_verdict_keep_false_verdicts_near_five_percent():
    """At MIN_PROCESSES a side, identical code reads faster or slower in about 5% of comparisons at most, whatever the
    host's spread between processes; a real change of 50% is found."""
    rng = np.random.default_rng(11)
    for spread in (0.05, 0.20):
        false = sum(process_verdict(_side(rng, MIN_PROCESSES, spread), _side(rng, MIN_PROCESSES, spread))["verdict"]
                    != "noise" for _ in range(200))
        assert false <= 12, (spread, false)           # 6% of 200; the simulation in analysis.compare: 1.7-3.0%
    found = [process_verdict(_side(rng, MIN_PROCESSES, 0.05), _side(rng, MIN_PROCESSES, 0.05, slower=0.5))["verdict"]
             for _ in range(20)]
    assert found.count("slower") >= 19


def test_runs_count_in_each_process_not_summed_over_a_side():
    """MIN_PROCESSES processes of 2 runs each are not 10 runs: each process's median is a median of 2."""
    rng = np.random.default_rng(5)
    v = process_verdict(_side(rng, MIN_PROCESSES, 0.01, runs=2), _side(rng, MIN_PROCESSES, 0.01, slower=1.0))
    assert v["verdict"] == "noise" and v["samples"] == [2 * MIN_PROCESSES, MIN_RUNS * MIN_PROCESSES]
    assert v["why"].startswith(f"too few runs to judge: 2 and {MIN_RUNS} in a process")


def test_pairs_of_real_processes_of_the_same_code_are_noise():
    """Every split of the six real H200 processes of the same code into two a side: all noise (some had read
    faster or slower)."""
    import itertools

    traces = {n: load(p) for n, p in SAME.items()}
    for b in itertools.combinations(SAME, 2):
        for n in itertools.combinations([x for x in SAME if x not in b], 2):
            r = compare_processes([traces[x] for x in b], [traces[x] for x in n])
            assert r["verdict"] == "noise" and r["total"]["why"].startswith("too few processes (2 a side"), (b, n)


def test_a_side_of_one_process_is_said_to_be_one(capsys):
    assert main(["compare", str(SAME[1]), paths(SAME[2], SAME[5], SAME[8])]) == 0
    out = capsys.readouterr().out
    assert "processes: base 1 (medians 597.0 us), new 3" in out and "a side of one process cannot show" in out


def test_one_process_a_side_is_the_two_profile_comparison():
    base, new = load(SAME[2]), load(SAME[4])
    b, n = base["timing"]["total"]["samples"], new["timing"]["total"]["samples"]
    assert process_verdict([b], [n]) == verdict_of(b, n) | {"processes": [1, 1]}
    assert compare_processes([base], [new]) == compare_traces(base, new)


def test_an_unlike_profile_in_a_side_is_refused_and_a_missing_one_is_one_line(tmp_path, capsys):
    other = load(SAME[4])
    other["metadata"]["params"] = other["metadata"]["params"] | {"points": 200000}
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert main(["compare", paths(SAME[1], tmp_path / "other.json"), paths(SAME[2], SAME[5])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: BASE was measured for ") and "points" in err[0]
    assert main(["compare", paths(SAME[1], SAME[4]), paths(SAME[2], tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"NEW {tmp_path / 'nope'}: not a readable profile trace" in err[0]


def test_a_profile_listed_twice_or_an_empty_path_is_one_line(capsys):
    folder_and_file = [SAME[1], SAME[1].parent / ".." / "processes" / SAME[1].name]
    for argv, fragment in (([paths(*folder_and_file), paths(SAME[2], SAME[5])], "BASE lists the profile"),
                           ([str(SAME[1]), f"{SAME[2]},"], "holds an empty profile path (a stray comma?)")):
        assert main(["compare", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and fragment in err[0], err


def test_profiles_run_with_other_settings_are_compared_with_a_warning(tmp_path, capsys):
    """Two H200 profiles of the default join, one copy edited to have kept L2 between its timed runs, one to have
    run no warm-up, and two CPU profiles from hosts of 2 and 64 logical CPUs: each difference is named in compare's
    warning and in a report's vs Baseline section. The same settings carry none."""
    from app.analysis.baseline import other_settings
    from app.report.baseline import baseline_section

    event = DATA.parent
    base = load(event / "join_v4_100k_10k_h200_launch_pace.trace.json")
    new = load(event / "join_v4_100k_10k_h200_launch_pace_next.trace.json")
    assert other_settings([base, new]) == ""
    keep = json.loads(json.dumps(new))
    keep["timing"]["l2"]["mode"] = "keep"
    cold = json.loads(json.dumps(new))
    cold["timing"]["warmup"]["runs"] = 0
    for edited, words in ((keep, "treated L2 differently between timed runs (flush vs keep)"),
                          (cold, "one profile ran no warm-up runs and another did")):
        path = tmp_path / "edited.trace.json"
        path.write_text(json.dumps(edited))
        assert main(["compare", str(event / "join_v4_100k_10k_h200_launch_pace.trace.json"), str(path)]) == 0
        out = capsys.readouterr().out
        assert out.startswith("WARNING: ") and words in out.splitlines()[0]
        assert words in baseline_section(edited, base).text
    cpu = {"selected_runtime": "cpu", "device": {"name": "Intel(R) Xeon(R) Processor", "logical_cpus": 2}}
    other = cpu | {"device": {"name": "Intel(R) Xeon(R) Processor", "logical_cpus": 64}}
    assert other_settings([cpu, other]) == "the CPU profiles ran on hosts of 2 vs 64 logical CPUs: other machines"


def test_sets_made_one_after_the_other_are_warned_about(tmp_path, capsys):
    """A profile's folder is named for the second it was written. Two sets of the same code's real profiles: made
    one side after the other, a change in the host's pace between them would read as the code's (p1's host ran a
    third slower than p8's), so compare warns; in turns, or from folders renamed since, it says nothing."""
    def folders(side, stamps):
        out = []
        for p, stamp in zip(side, stamps):
            d = tmp_path / f"{len(list(tmp_path.iterdir()))}" / stamp
            d.mkdir(parents=True)
            (d / "trace.json").write_text(Path(p).read_text())
            out.append(d)
        return paths(*out)

    base, new = [SAME[n] for n in (1, 2, 4)], [SAME[n] for n in (5, 7, 8)]
    cases = {"apart": (["20261127-100001", "20261127-100002", "20261127-100003"],
                       ["20261127-100004", "20261127-100005", "20261127-100006"]),
             "in turns": (["20261127-100001", "20261127-100003", "20261127-100005"],
                          ["20261127-100002", "20261127-100004", "20261127-100006"]),
             "renamed": (["20261127-100001", "20261127-100002", "base-3"],
                         ["20261127-100004", "20261127-100005", "20261127-100006"])}
    said = {}
    for name, (a, b) in cases.items():
        assert main(["compare", folders(base, a), folders(new, b)]) == 0
        said[name] = capsys.readouterr().out.splitlines()[0]
    assert said["apart"].startswith("WARNING: the BASE profiles were all made before the NEW ones (20261127-100001 to "
                                    "20261127-100003, then 20261127-100004 to 20261127-100006, UTC): the sides did "
                                    "not take turns")
    assert "take turns" not in said["in turns"] and "take turns" not in said["renamed"]
    assert main(["compare", folders(new, cases["apart"][0]), folders(base, cases["apart"][1]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warning"].startswith("the BASE profiles were all made before")
