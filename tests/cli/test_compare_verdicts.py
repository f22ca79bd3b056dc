"""compare's verdicts and rows on real CPU profiles: a side of one process is said to be one; too few runs are
noise and never fail the gate; the whole plan's row is named for what it is; a stage of one side is listed, never
dropped; a damaged trace is one line, never a traceback."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.analysis.compare import (MIN_PROCESSES, MIN_RUNS, ONE_PROCESS_WHY, compare_processes, process_verdict,
                                  verdict_of)
from app.kernel.cli import main
from tests.conftest import child_env

# Tiny plans: a profile takes about a second. The slowed profiles sleep 20 ms in candidate_filter, a stage of well
# under a millisecond here, so their change is far beyond any noise: only the number of runs can make it "noise".
JOIN = ["join", "--points", "300", "--polygons", "30", "--device", "cpu", "--warmup", "0", "--no-verify"]
SLOW = {"APP_INJECT_STAGE_DELAY": "candidate_filter=0.02"}


def profile(out: Path, runs: int, env=None, args=JOIN) -> Path:
    """One real event-mode profile in its own process (the stage-delay hook is read when the process starts)."""
    e = child_env(**(env or {}))
    r = subprocess.run([sys.executable, "-m", "app.kernel", *args, "--bench_runs", str(runs), "--out", str(out)],
                       capture_output=True, text=True, env=e, timeout=120)
    assert r.returncode == 0, r.stderr
    return Path(r.stdout.strip().splitlines()[-1].split("profile: ")[1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("verdicts")
    return {"base2": profile(root / "a", 2), "slow2": profile(root / "b", 2, SLOW),
            "base6": profile(root / "c", 6), "slow6": profile(root / "d", 6, SLOW)}


def compare(capsys, *argv):
    code = main(["compare", *map(str, argv)])
    return code, capsys.readouterr().out


def test_one_process_a_side_carries_the_caveat(runs, capsys, tmp_path):
    """Each side one profile: the interval cannot hold the host's change between processes, and that is said, in
    the text and in the JSON's notes; with three processes a side it is not."""
    code, out = compare(capsys, runs["base6"], runs["slow6"])
    assert code == 0 and "note: a side of one process cannot show how much its host changes" in out
    code, out = compare(capsys, runs["base6"], runs["slow6"], "--json")
    notes = json.loads(out)["notes"]
    assert len(notes) == 1 and notes[0].startswith("a side of one process cannot show")
    copies = []                 # NEW's three: other files (a side may not hold BASE's profiles)
    for k in ("slow6", "base6", "base2"):
        copies.append(tmp_path / f"{k}.trace.json")
        copies[-1].write_text((runs[k] / "trace.json").read_text())
    code, out = compare(capsys, ",".join(str(runs[k]) for k in ("base2", "base6", "slow2")),
                        ",".join(map(str, copies)), "--json")
    assert json.loads(out)["notes"] == []


def test_too_few_runs_are_noise_and_one_process_a_side_is_no_verdict(runs, capsys):
    """2 runs a side: candidate_filter 20 ms slower is still no verdict, the reason is given. 6 runs, one profile a
    side: the runs call it slower, shown as theirs ('slower?'), and no verdict is drawn: processes of identical code
    differ by more than the runs within one. The regression gate refuses fewer than MIN_PROCESSES profiles a side
    rather than pass them silently."""
    code, out = compare(capsys, runs["base2"], runs["slow2"])
    assert code == 0 and "whole plan (total): NOISE, too few runs to judge: 2 and 2; need ≥ 6" in out
    assert "(too few runs)" in out
    code, out = compare(capsys, runs["base2"], runs["slow2"], "--json")
    doc = json.loads(out)
    assert code == 0 and doc["regression"] is False and doc["min_runs"] == MIN_RUNS
    for row in [doc["total"]] + doc["stages"]:
        assert row["verdict"] == "noise" and row["why"].startswith("too few runs to judge: 2 and 2; need ≥ 6")
        assert row["ci_pct"] == [None, None] and row["samples"] == [2, 2] and "within_process" not in row
    by = {s["name"]: s for s in doc["stages"]}
    assert by["candidate_filter"]["change_pct"] > 1000           # the change is shown, no verdict drawn from it
    code, out = compare(capsys, runs["base2"], runs["slow6"], "--json")
    assert json.loads(out)["total"]["why"].startswith("too few runs to judge: 2 and 6")

    code, out = compare(capsys, runs["base6"], runs["slow6"], "--json")
    doc = json.loads(out)
    filt = {s["name"]: s for s in doc["stages"]}["candidate_filter"]
    assert doc["verdict"] == "noise" and doc["total"]["within_process"] == "slower"
    assert filt["verdict"] == "noise" and filt["within_process"] == "slower" and filt["ci_pct"][0] > 0
    assert filt["why"] == ONE_PROCESS_WHY
    code, out = compare(capsys, runs["base6"], runs["slow6"])
    assert "whole plan (total): NO VERDICT (one process a side; its runs alone say slower)" in out
    assert "slower? (1 process)" in out and f"no verdict: {ONE_PROCESS_WHY}" in out

    for argv in ([runs["base6"], runs["slow6"]], [f"{runs['base6']},{runs['base2']}", f"{runs['slow6']},{runs['slow2']}"]):
        code = main(["compare", *map(str, argv), "--fail-on-regression", "5"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1, err
        assert f"--fail-on-regression needs {MIN_PROCESSES} or more profiles a side" in err and "ab" in err


def test_five_processes_a_side_of_a_real_slowdown_are_slower_and_fail_the_gate(tmp_path, capsys):
    """The same 20 ms slowdown in five processes a side, each of 6 runs, made in turns: a verdict, and the gate."""
    base, slow = [], []
    for i in range(MIN_PROCESSES):
        base.append(profile(tmp_path / f"b{i}", 6))
        slow.append(profile(tmp_path / f"s{i}", 6, SLOW))
    code, out = compare(capsys, ",".join(map(str, base)), ",".join(map(str, slow)), "--json",
                        "--fail-on-regression", "5")
    doc = json.loads(out)
    assert code == 1 and doc["verdict"] == "slower" and doc["regression"] is True
    assert {s["name"]: s for s in doc["stages"]}["candidate_filter"]["verdict"] == "slower"
    assert "within_process" not in doc["total"]
    code, out = compare(capsys, ",".join(map(str, base)), ",".join(map(str, slow)), "--fail-on-regression", "5")
    assert code == 1 and "regression: the whole plan (total) is +" in out and "SLOWER" in out


def test_the_run_minimum_counts_a_sides_runs():
    a = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0]
    assert verdict_of(a, [2 * x for x in a])["verdict"] == "slower"
    five = verdict_of(a[:5], [2 * x for x in a])
    assert five["verdict"] == "noise" and five["why"].startswith("too few runs to judge: 5 and 6; need ≥ 6")
    one = verdict_of([1.0], [2.0])
    assert one["verdict"] == "noise" and one["ci_pct"] == [None, None] and one["change_pct"] == pytest.approx(100)
    # several processes a side: each process needs MIN_RUNS runs (its median enters the figure) and a side
    # MIN_PROCESSES processes (the interval resamples them); runs summed over a side (`samples`) are neither
    assert process_verdict([a] * MIN_PROCESSES, [[2 * x for x in a]] * MIN_PROCESSES)["verdict"] == "slower"
    two = process_verdict([a[:3], a[3:]], [[2 * x for x in a[:3]]] * 2)
    assert two["verdict"] == "noise" and two["samples"] == [6, 6]
    assert two["why"].startswith(f"too few processes (2 a side; a verdict needs {MIN_PROCESSES})")
    few = process_verdict([a[:2]] * MIN_PROCESSES, [[2 * x for x in a[:3]]] * MIN_PROCESSES)
    assert few["verdict"] == "noise" and few["why"].startswith("too few runs to judge: 2 and 3 in a process")


def test_the_whole_plan_row_is_each_profiles_total_and_is_not_called_end_to_end(runs, capsys):
    """The row is the trace's total (the report's 'total, median of timed runs'), not the report's 'end to end, host
    arrays in and out', a figure of other runs: compare names it so, and calls nothing else end to end."""
    code, out = compare(capsys, runs["base6"], runs["slow6"])
    total = json.loads((runs["base6"] / "trace.json").read_text())["total_elapsed_seconds"] * 1e6
    row = next(line for line in out.splitlines() if line.startswith("whole plan (total) "))
    assert row.split()[3] == f"{total:,.1f}"
    report = (runs["base6"] / "report.md").read_text()
    # a CPU run: its result is in host memory, and the report says so rather than "on the device"
    assert f"| total, median of timed runs (us): host arrays in, result in host memory (a CPU run) | {total:,.1f} |" \
        in report
    assert [line for line in out.splitlines() if "end to end" in line] == [
        "whole plan (total): each profile's 'total, median of timed runs' (host arrays in, the result left where the "
        "plan made it: on the device in a GPU run), not its report's 'end to end, host arrays in and out', which "
        "other runs time"]


def test_stages_of_one_side_are_listed_not_dropped(runs, capsys, tmp_path):
    """A stage renamed in NEW: the old name is only in BASE, the new only in NEW, each with its median and no
    verdict, in the text and the JSON. Across profiles of several processes, a stage missing from one is named."""
    trace = json.loads((runs["slow6"] / "trace.json").read_text())
    stage = next(s for s in trace["stages"] if s["name"] == "candidate_filter")
    stage["name"] = "candidate_filter_v2"
    renamed = tmp_path / "renamed.trace.json"
    renamed.write_text(json.dumps(trace))
    code, out = compare(capsys, runs["base6"], renamed)
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("candidate_filter")}
    assert rows["candidate_filter_v2"].endswith("only in NEW") and " absent " in rows["candidate_filter_v2"]
    assert f"{stage['elapsed_seconds'] * 1e6:,.1f}" in rows["candidate_filter_v2"]
    assert rows["candidate_filter"].endswith("only in BASE")
    code, out = compare(capsys, runs["base6"], renamed, "--json")
    doc = json.loads(out)
    one = {s["name"]: s for s in doc["one_side_stages"]}
    assert one["candidate_filter_v2"]["only_in"] == "NEW" and one["candidate_filter_v2"]["verdict"] is None
    assert one["candidate_filter_v2"]["base_median_us"] is None
    assert one["candidate_filter_v2"]["new_median_us"] == pytest.approx(stage["elapsed_seconds"] * 1e6)
    assert one["candidate_filter"]["only_in"] == "BASE" and one["candidate_filter"]["new_median_us"] is None
    assert "candidate_filter" not in {s["name"] for s in doc["stages"]}
    base = [json.loads((runs[k] / "trace.json").read_text()) for k in ("base6", "base2")]
    r = compare_processes(base, [base[0], trace])
    (gap,) = [s for s in r["one_side_stages"] if s["name"] == "candidate_filter"]
    assert gap["only_in"] is None and gap["profiles_with_it"] == [2, 1]
    assert gap["why"].startswith("not in every profile (in 2 of 2 BASE and 1 of 2 NEW profiles)")


def test_another_kernel_forced_lists_every_stage(runs, capsys, tmp_path):
    """join against overlay, --force: no stage in common but the first; every other is listed on its side."""
    overlay = profile(tmp_path, 2, args=["overlay", "--left", "100", "--right", "100", "--device", "cpu",
                                         "--warmup", "0", "--no-verify"])
    code, out = compare(capsys, runs["base2"], overlay, "--force", "--json")
    doc = json.loads(out)
    names = {s["name"] for t in (runs["base2"], overlay) for s in json.loads((t / "trace.json").read_text())["stages"]}
    assert {s["name"] for s in doc["stages"] + doc["one_side_stages"]} == names
    assert {s["only_in"] for s in doc["one_side_stages"]} == {"BASE", "NEW"}


@pytest.mark.parametrize("mutate,fragment", [
    (lambda t: t.update(timing=None), "field 'timing' is null, not an object"),
    (lambda t: t["timing"].update(host_pace={"samples": ["x"]}), "field 'timing.host_pace.samples' must be a list"),
    (lambda t: t["timing"].update(host_pace=5), "field 'timing.host_pace' is 5, not an object"),
    (lambda t: t["timing"]["host_pace"].update(samples=[-1e-3] * 6), "holds -0.001"),
    (lambda t: t["timing"]["host_pace"].update(samples=[3e-5] * 5 + [float("inf")]), "holds Infinity"),
    (lambda t: t["stages"][1].update(elapsed_seconds=0.0), "has no finite elapsed_seconds above 0 (0.0)"),
    (lambda t: t["stages"][1].update(elapsed_seconds=-2.0), "has no finite elapsed_seconds above 0 (-2.0)"),
    (lambda t: t["stages"][1]["spread"].update(samples=[0.0] * 6), "have a median of 0 s"),
])
def test_a_damaged_trace_is_one_line(runs, capsys, tmp_path, mutate, fragment):
    trace = json.loads((runs["base6"] / "trace.json").read_text())
    mutate(trace)
    bad = tmp_path / "bad.trace.json"
    bad.write_text(json.dumps(trace))
    for argv in (["compare", str(bad), str(runs["slow6"])], ["compare", str(runs["slow6"]), str(bad), "--json"],
                 ["devlog", str(bad), "--file", str(tmp_path / "log.md")]):
        assert main(argv) == 2
        captured = capsys.readouterr()
        err = captured.err.strip().splitlines()
        assert len(err) == 1 and f" {bad}: " in err[0] and fragment in err[0], err
        assert "profile again" in err[0] and captured.out == ""
    assert not (tmp_path / "log.md").exists()


def test_a_damaged_trace_exits_2_with_no_traceback(runs, tmp_path):
    trace = json.loads((runs["base6"] / "trace.json").read_text()) | {"timing": None}
    (tmp_path / "trace.json").write_text(json.dumps(trace))
    r = subprocess.run([sys.executable, "-m", "app.kernel", "compare", str(tmp_path), str(runs["slow6"])],
                       capture_output=True, text=True, env=child_env(), timeout=60)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.strip() == (f"error: BASE {tmp_path}: field 'timing' is null, not an object; the trace is damaged: "
                                "profile again, or pass another profile folder or its trace.json")


def test_one_run_a_side_is_valid_json(tmp_path, capsys):
    """One timed run a side: no verdict, and the host pace's unbounded interval is null, not JSON's missing
    Infinity."""
    for side in ("a", "b"):
        assert main([*JOIN, "--bench_runs", "1", "--out", str(tmp_path / side)]) == 0
    (a,), (b,) = (list((tmp_path / side).glob("profiles/event/join/*/*")) for side in ("a", "b"))
    capsys.readouterr()
    code, out = compare(capsys, a, b, "--json")
    doc = json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert doc["total"]["why"].startswith("too few runs to judge: 1 and 1")
    assert doc["host_pace"]["ci_pct"] == [None, None]


def test_the_hosts_pace_from_too_few_timings_is_not_judged():
    """One or two pace timings a side: no interval (it had printed [-inf%, +inf%]) and nothing resolved."""
    from app.analysis.compare import samples_change
    from app.report.timing_text import pace_change_text

    few = samples_change([50e-6], [60e-6, 61e-6])
    assert few["ci_pct"] == [None, None] and few["resolved"] is False and few["change_pct"] == pytest.approx(21.0)
    assert pace_change_text(few) == "+21.0%, not judged (too few timings a side for an interval)"
    enough = samples_change([50e-6] * 6, [60e-6] * 6)
    assert enough["resolved"] is True and "[" in pace_change_text(enough)
