"""nsys mode on real captures of this project's own plans (the timeline command's tests: test_timeline_command.py).

The fixtures under tests/fixtures/nsys/ were made on the lent H200 by make.sh
(the command is in that file) and stripped of environment and paths. Every
test here fails -- never skips -- when a fixture is missing. The orchestration
tests use a fake nsys that runs the real worker on the CPU and replays the real
export; real nsys runs are in test_nsys_real.py.
"""
import json
import os
import sqlite3
import statistics
import tempfile
from pathlib import Path

import pytest

from app.kernel.cli import main
from app.runtime import device as devmod
from app.analysis.timeline import account_ranges
from app.runtime.profiling.cupti_trace import timeline_from_records
from app.runtime.profiling.nsys import analyse_plan, nsys_trace
from app.runtime.profiling.parsers.nsys_sqlite import read_sqlite
from app.runtime.profiling.worker import CUPTI_WARM_RUNS, PROFILE_RANGE
from tests.runtime.nsys_capture import FIX, fixture, load, raw_kernel_ns, raw_ranges

FAKE = Path(__file__).parent / "fake_tools" / "nsys"
KERNELS = ["join", "overlay"]


@pytest.mark.parametrize("kernel", KERNELS)
def test_accounting_agrees_with_the_raw_export(kernel):
    plan, worker = load(kernel)
    db = fixture(f"{kernel}.sqlite")
    analysis = analyse_plan(plan, read_sqlite(str(db)), worker)
    assert len(analysis["iterations"]) == 3
    by = {(r["name"], r["instance"]): r for r in analysis["instances"]}
    for spec in plan.stages:
        rows = raw_ranges(db, spec.name)
        assert len(rows) == 3
        for i, (start, end, tid) in enumerate(rows):
            rec = by[(spec.name, i)]
            assert rec["span_ns"] == end - start                     # the span is the range, to the ns
            assert rec["kernel_ns"] == raw_kernel_ns(db, start, end, tid)
            assert rec["accounted_ns"] == rec["span_ns"]             # busy + idle by cause, exactly
            assert 0 <= rec["busy_ns"] <= rec["span_ns"]
        s = next(x for x in analysis["stages"] if x["name"] == spec.name)
        assert s["span_us"] == pytest.approx(statistics.median((e - b) / 1e3 for b, e, _ in rows))
        assert s["ops"] > 0
    it = analysis["iteration"]
    assert it["span_us"] >= sum(s["span_us"] for s in analysis["stages"]) * 0.9


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_paces_launches_agree_with_the_capture(kernel):
    """The worker's launch pace against nsys's own records of those launches: 16 before each traced iteration,
    after the previous one and outside every range, and the worker's clock around them (its figure, a launch's
    share) holds at least the span the capture gives them: nothing in the report is contradicted by the capture."""
    _, worker = load(kernel)
    db = fixture(f"{kernel}.sqlite")
    con = sqlite3.connect(db)
    launches = con.execute("SELECT r.start, r.end FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN CUPTI_ACTIVITY_KIND_KERNEL k "
                           "ON k.correlationId = r.correlationId JOIN StringIds s ON s.id = k.shortName "
                           "WHERE s.value = 'launch_pace_nop' ORDER BY r.start").fetchall()
    iterations = raw_ranges(db, PROFILE_RANGE)
    assert len(iterations) == len(worker["pace"]["launch_seconds"]) == 3
    previous_end = 0
    for (start, end, _), measured in zip(iterations, worker["pace"]["launch_seconds"]):
        group = [x for x in launches if previous_end <= x[0] and x[1] <= start]
        group = group[-16:] if previous_end == 0 else group    # before the first: the pace kernel's loading launch
        assert len(group) == 16
        span_per_launch = (group[-1][1] - group[0][0]) / 16 / 1e9
        assert span_per_launch <= measured
        previous_end = end
    inside = [x for x in launches for (a, b, _) in iterations if a <= x[0] < b]
    assert inside == []


@pytest.mark.parametrize("kernel", KERNELS)
def test_report_and_trace_from_a_real_capture(kernel):
    from app.report.timeline_report import nsys_report

    plan, worker = load(kernel)
    analysis = analyse_plan(plan, read_sqlite(str(fixture(f"{kernel}.sqlite"))), worker)
    tool = {"backend": "nsys", "version": "2025.3.1", "command": []}
    trace = nsys_trace(plan, worker, analysis, tool)
    assert [s["name"] for s in trace["stages"]] == [s.name for s in plan.stages]
    assert trace["total_elapsed_seconds"] == pytest.approx(analysis["iteration"]["span_us"] / 1e6)
    params = {"command_line": "python -m app.kernel test", "clocks": {"locked": False}}
    report = nsys_report(trace, analysis, params, None)
    for heading in ("## Configuration", "## Stages", "**Bottleneck:**", "**Root cause:**", "## Top 3 Opportunities",
                    "## vs Baseline", "## Wall-time accounting", "## Event time vs span vs GPU busy",
                    "## Launches, copies and concurrency", "## Audit", "What forces this plan",
                    "smallest structural change"):
        assert heading in report, heading
    first = trace["stages"][0]
    assert f"| {first['name']} | {first['elapsed_seconds'] * 1e6:,.1f} | missing |" in report
    assert "sm__warps_active" in report                        # a missing counter is named, never zero
    baseline = dict(trace, mode="event")
    assert "Warning: the baseline was measured in event mode" in nsys_report(trace, analysis, params, baseline)
    # A baseline traced by the other backend (a real cupti-backend profile): its spans carry another tracer's cost.
    cupti = json.loads((FIX.parents[1] / "data" / "nsys" / "join_v4_100k_10k_h200_30_iterations_cupti.trace.json")
                       .read_text())
    assert "Warning: the nsys profiles were traced by different backends (cupti vs nsys)" in nsys_report(
        trace, analysis, params, cupti)
    assert "traced by different backends" not in nsys_report(trace, analysis, params, trace)
    # The worker timed the host's paces before each traced iteration (on the H200: launches too), in the
    # iterations' order, and the report gives them as event mode's does.
    timing = trace["timing"]
    for key, raw in (("host_pace", "loop_seconds"), ("launch_pace", "launch_seconds")):
        assert timing[key]["samples"] == worker["pace"][raw] and len(worker["pace"][raw]) == 3, key
        assert timing[key]["median"] == pytest.approx(statistics.median(worker["pace"][raw]))
    assert "## Drift and the host's pace" in report
    assert ("| drift over the traced iterations | not checked: 3 timed runs: the check needs 18 (it compares the "
            "first and last thirds, 6 runs each at least) |") in report
    assert (f"| host launch pace before each traced iteration (an empty kernel, us a launch) | "
            f"{timing['launch_pace']['median'] * 1e6:.1f} median (the mean of 16 launches;") in report
    # A capture whose worker did not time them (made before they were) says so, in the report and trace alike.
    old = nsys_trace(plan, {k: v for k, v in worker.items() if k != "pace"}, analysis, tool)
    assert old["timing"]["host_pace"] == {"why": "not recorded: the worker of this capture did not time the "
                                                 "host's pace"}
    assert ("| host CPU pace before each traced iteration (a fixed Python loop, us) | not measured (not recorded: "
            in nsys_report(old, analysis, params, None))


@pytest.mark.parametrize("kernel", ["join", "overlay"])
def test_the_staging_advice_is_given_once_for_both_of_its_causes(kernel):
    """The host staging its copies shows as two idle causes, the gap before the build's first copy and the gaps
    between its copies: one opportunity (the two had taken two of the three places with the same text), both causes
    in its trigger (their time inside the stage ranges), its gain the build's own time of them in the same
    iteration, what staging can save (the iteration's totals of those causes also hold other stages' launch gaps)."""
    from app.report.timeline_report import nsys_report, staging_opportunity

    plan, worker = load(kernel)
    analysis = analyse_plan(plan, read_sqlite(str(fixture(f"{kernel}.sqlite"))), worker)
    trace = nsys_trace(plan, worker, analysis, {"backend": "nsys", "version": "2025.3.1", "command": []})
    report = nsys_report(trace, analysis, {"command_line": "x", "clocks": {"locked": False}}, None)
    items = report.split("## Top 3 Opportunities")[1].split("\n## ")[0]
    ops = [line for line in items.splitlines() if line[:3] in ("1. ", "2. ", "3. ")]
    assert len(ops) == 3 and len({op.split(";")[0] for op in ops}) == 3          # three different pieces of advice
    build = analysis["iteration_stages"][0]             # the build in the iteration the tables show
    staging = next(op for op in ops if op.startswith(staging_opportunity(build)[:40], 3))
    it = analysis["iteration"]
    inside = it["idle_in_stages_us"]
    assert (f"trigger: before_first_op={inside['before_first_op']:,.1f}us, "
            f"launch_gap={inside['launch_gap']:,.1f}us per iteration in its stages' own accounting") in staging
    own = build["idle_us"]["before_first_op"] + build["idle_us"]["launch_gap"]
    assert f"the stage with the most of them in that iteration owned_buffer_build ({own:,.1f} us of its own span)" \
        in staging
    assert own <= build["span_us"] and own < it["idle_us"]["before_first_op"] + it["idle_us"]["launch_gap"]
    assert f"est. {100 * own / it['span_us']:.0f}% gain" in staging


def test_drift_and_paces_of_thirty_real_iterations():
    """A real nsys-mode trace of the default join over 30 iterations (tests/data/nsys/README.md): the drift check
    runs on the iterations' spans as event mode's does on its timed runs, and the report says it in the same
    words, beside both paces."""
    from app.report.timeline_report import drift_and_paces, nsys_report
    from app.runtime.stats import drift

    path = Path(__file__).resolve().parents[1] / "data" / "nsys" / "join_v4_100k_10k_h200_30_iterations.trace.json"
    trace = json.loads(path.read_text())
    timing = trace["timing"]
    assert timing["drift"] == drift(timing["total"]["samples"]) and timing["drift"]["checked"]
    (section,) = drift_and_paces(trace)
    rows = dict(section.rows)
    d = timing["drift"]
    assert rows["drift over the traced iterations"] == (
        f"no drift resolved: first third's median {d['first_third_median'] * 1e6:.1f} us, last third's "
        f"{d['last_third_median'] * 1e6:.1f} us ({100 * d['change']:+.1f}%; 10 runs each), their 95% intervals "
        "overlap")
    loop = rows["host CPU pace before each traced iteration (a fixed Python loop, us)"]
    assert loop.startswith(f"{statistics.median(timing['host_pace']['samples']) * 1e6:.1f} median")
    assert "over 30 runs" in loop
    # Iterations that were still changing say so in the report's first lines: the rule, on the fixture capture's
    # report, first as it is (3 iterations, not checked), then given the check of a series whose last third ran
    # three times as long.
    plan, worker = load("join")
    analysis = analyse_plan(plan, read_sqlite(str(fixture("join.sqlite"))), worker)
    tool = {"backend": "nsys", "version": "2025.3.1", "command": []}
    own = nsys_trace(plan, worker, analysis, tool)
    params = {"command_line": "python -m app.kernel test", "clocks": {"locked": False}}
    assert "still changing" not in nsys_report(own, analysis, params, None)
    samples = timing["total"]["samples"]
    changing = dict(own, timing=dict(own["timing"], drift=drift(samples[:20] + [3 * x for x in samples[20:]])))
    head = nsys_report(changing, analysis, params, None).split("\n")[2]
    assert "**The iterations were still changing** (first third's median" in head


@pytest.mark.parametrize("kernel", KERNELS)
def test_cupti_records_feed_the_same_analysis(kernel):
    plan, _ = load(kernel)
    worker = json.loads(fixture(f"{kernel}.cupti.json").read_text())
    tl = timeline_from_records(worker["cupti"], worker["selection"]["device_name"])
    analysis = analyse_plan(plan, tl, worker)
    assert len(analysis["iterations"]) == 3
    for s in analysis["stages"]:
        assert s["ops"] > 0, s["name"]                           # thread ids of ranges and API calls line up
        assert s["accounting_max_error_pct"] == 0
    overhead = worker["overhead"]
    assert len(overhead["untraced_wall_seconds"]) == len(overhead["traced_wall_seconds"]) == 3
    # The paces were timed before the traced iterations only (the trace's), one each.
    trace = nsys_trace(plan, worker, analysis, {"backend": "cupti", "version": None, "command": []})
    assert trace["timing"]["launch_pace"]["samples"] == worker["pace"]["launch_seconds"]
    assert len(worker["pace"]["loop_seconds"]) == len(worker["pace"]["launch_seconds"]) == 3
    # The traced iterations the worker discards, to pay CUPTI's set-up, come first, outside every range: the same
    # kernels as a reported iteration's, CUPTI_WARM_RUNS times, and the analysis counted none of them.
    rec = worker["cupti"]
    (start, end), *_ = sorted((r[2], r[3]) for r in rec["ranges"] if r[0] == PROFILE_RANGE)
    in_first = [o for o in rec["ops"] if start <= o[0] < end]
    first = [o[3] for o in in_first if o[2] == "kernel"]
    before = [o[3] for o in rec["ops"] if o[2] == "kernel" and o[0] < start and o[3] != "launch_pace_nop"]
    assert first and sorted(before) == sorted(first * CUPTI_WARM_RUNS)
    assert sum(s["ops"] for s in analysis["stages"]) == len(in_first)


def analyses(kernel):
    """The analysis of both real captures of ``kernel``: the nsys export and the cupti records."""
    plan, worker = load(kernel)
    cupti = json.loads(fixture(f"{kernel}.cupti.json").read_text())
    return plan, {"nsys": (analyse_plan(plan, read_sqlite(str(fixture(f"{kernel}.sqlite"))), worker), worker),
                  "cupti": (analyse_plan(plan, timeline_from_records(cupti["cupti"], "NVIDIA H200"), cupti), cupti)}


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_row_adds_up_and_is_a_real_iteration(kernel):
    """The accounting's rows, the audit's figures and the uncovered time are each real iterations' own: a row is
    the instance with the median span, so busy + idle is its span (the columns' separate medians had left the
    join's bounds row 14.6% short of its span), and the uncovered time is the median of each iteration's span
    less its stages' spans, checked here against the raw export's ranges."""
    from app.report.timeline_report import accounting_section

    plan, both = analyses(kernel)
    names = [s.name for s in plan.stages]
    for backend, (analysis, worker) in both.items():
        rows = [analysis["iteration"]] + analysis["stages"]
        for s in rows:
            spans = sorted(r["span_ns"] for r in analysis["instances"] if r["name"] == s["name"])
            assert s["span_us"] == spans[(len(spans) - 1) // 2] / 1e3, (backend, s["name"])
            assert s["busy_us"] + sum(s["idle_us"].values()) == pytest.approx(s["span_us"], abs=1e-6)
        for row, s in zip(accounting_section(rows).rows, rows):
            assert row[2] == row[-2] == f"{s['span_us']:,.1f}", (backend, row)    # span, busy + idle
        for f in analysis["findings"]:
            if f["rule"] == "span dominated by host time":
                s = next(x for x in rows if x["name"] == f["stage"])
                assert f["evidence"].startswith(f"GPU idle {sum(s['idle_us'].values()):,.1f} of {s['span_us']:,.1f} us")
        trace = nsys_trace(plan, worker, analysis, {"backend": backend, "version": None, "command": []})
        if backend == "nsys":       # from the export's own NVTX table, independently of the analysis
            db = fixture(f"{kernel}.sqlite")
            inside = {n: raw_ranges(db, n) for n in names}
            own = [(e - b) - sum(e2 - b2 for n in names for b2, e2, t2 in inside[n] if t2 == t and b <= b2 and e2 <= e)
                   for b, e, t in raw_ranges(db, PROFILE_RANGE)]
            assert len(own) == 3 and min(own) > 0
            assert trace["timing"]["uncovered_seconds"] == pytest.approx(statistics.median(own) / 1e9)
        stage_sum = sum(s["span_us"] for s in analysis["stages"])
        assert trace["timing"]["uncovered_seconds"] * 1e6 != pytest.approx(analysis["iteration"]["span_us"] - stage_sum)


def test_a_second_process_in_the_capture_takes_nothing_from_the_first(tmp_path):
    """Each process numbers its correlation ids and NVTX domains from 1. A copy of the join capture with a
    second process replaying the same records 5 ms later (another pid in nsys's global ids; its id 2, the first
    process's plan domain, names another library's) reads as two processes' ranges, each with its own ops:
    the same counts and spans as the capture alone."""
    import shutil

    plan, worker = load("join")
    src = fixture("join.sqlite")
    db = tmp_path / "two.sqlite"
    shutil.copy(src, db)
    con = sqlite3.connect(db)
    other, shift = 0x10 << 24, 5_000_000
    (tid,), = con.execute("SELECT DISTINCT globalTid + ? FROM NVTX_EVENTS WHERE eventType = 75", (other,))
    for table, ids in (("CUPTI_ACTIVITY_KIND_RUNTIME", ("globalTid",)), ("CUPTI_ACTIVITY_KIND_KERNEL", ("globalPid",)),
                       ("CUPTI_ACTIVITY_KIND_MEMCPY", ("globalPid",)), ("CUPTI_ACTIVITY_KIND_MEMSET", ("globalPid",)),
                       ("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", ("globalPid",)),
                       ("NVTX_EVENTS", ("globalTid", "endGlobalTid"))):
        cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
        for row in con.execute(f"SELECT * FROM {table}").fetchall():
            row = list(row)
            for c in ids:
                if row[cols.index(c)] is not None:
                    row[cols.index(c)] += other
            for c in ("start", "end"):
                if row[cols.index(c)] is not None:
                    row[cols.index(c)] += shift
            con.execute(f"INSERT INTO {table} VALUES ({','.join('?' * len(cols))})", row)
    # The second process numbered its domains otherwise: the plan's is its 1002, and its id 2 (the first
    # process's plan domain) names another library's, created last of all.
    con.execute("UPDATE NVTX_EVENTS SET domainId = domainId + 1000 WHERE globalTid = ? AND domainId > 0", (tid,))
    con.execute("INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid, domainId) VALUES (?, 75, 'torch', ?, 2)",
                (10 ** 15, tid))
    con.commit()
    con.close()
    one = analyse_plan(plan, read_sqlite(str(src)), worker)
    two = account_ranges(read_sqlite(str(db)), domain="join")
    assert len(two) == 2 * len(one["instances"])
    for r in two:
        mine = next(x for x in one["instances"] if x["name"] == r["name"] and x["instance"] == r["instance"] % 3)
        assert (r["ops"], r["kernels"], r["span_ns"], r["busy_own_ns"]) == \
            (mine["ops"], mine["kernels"], mine["span_ns"], mine["busy_own_ns"]), r["name"]


# --- the whole mode, with a fake nsys ----------------------------------------------------------

@pytest.fixture
def fake_gpu(monkeypatch):
    sel = devmod.Selection("auto", "gpu", "gpu", "declared by the test", "NVIDIA H200", {"name": "NVIDIA H200"})
    monkeypatch.setattr("app.runtime.profiling.session.devmod.select", lambda requested: sel)
    monkeypatch.setenv("FAKE_NSYS_SQLITE", str(fixture("join.sqlite")))


def _leftovers():
    """The tool's nsys folders in the temp folder: the test's own (the own_tempdir fixture)."""
    return set(Path(tempfile.gettempdir()).glob("app-kernel-tool-nsys-*"))


def test_nsys_mode_end_to_end_with_a_replayed_capture(tmp_path, fake_gpu, capsys, own_tempdir):
    plan, worker = load("join")
    before = _leftovers()
    out = tmp_path / "out"
    args = ["join", "--points", "20000", "--polygons", "2000", "--prof_type", "nsys", "--bench_runs", "3",
            "--nsys", str(FAKE), "--out", str(out)]
    assert main(args) == 0
    (d,) = list(out.glob("profiles/nsys/join/*/*"))
    names = {p.name for p in d.iterdir()}
    assert {"report.md", "trace.json", "params.json", "timeline.png", "timeline.json", "timeline_ranges.csv",
            "profile.nsys-rep", "profile.sqlite", "tiling"} <= names
    trace = json.loads((d / "trace.json").read_text())
    expected = analyse_plan(plan, read_sqlite(str(fixture("join.sqlite"))), worker)
    for s, e in zip(trace["stages"], expected["stages"]):
        assert s["elapsed_seconds"] == pytest.approx(e["span_us"] / 1e6)
    # The fake ran the worker on the CPU: the audit says so, stage by stage, and the headline too.
    cpu = {f["stage"] for f in trace["audit"]["findings"] if f["rule"] == "CPU fallback"}
    assert cpu == {s.name for s in plan.stages}
    assert (d / "report.md").read_text().split("\n")[2].startswith("**CPU fallback or planner override")
    # The worker timed its host's loop before each of its 3 iterations; on the CPU it launched nothing.
    pace = trace["timing"]["host_pace"]
    assert pace["runs"] == 3 and all(0 < t < 0.1 for t in pace["samples"])
    assert trace["timing"]["launch_pace"] == {"why": "CPU run: the plan launches no kernels"}
    assert "| host CPU pace before each traced iteration (a fixed Python loop, us) |" in (d / "report.md").read_text()
    events = json.loads((d / "timeline.json").read_text())["traceEvents"]
    # Each op names its API call by the capture's own correlation id (the one nsys shows), not the reader's key.
    kernel_ids = {c for (c,) in sqlite3.connect(fixture("join.sqlite")).execute(
        "SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL")}
    shown = {e["args"]["correlation"] for e in events if e.get("cat") == "kernel"}
    assert shown and shown <= kernel_ids
    assert sqlite3.connect(d / "profile.sqlite").execute("SELECT COUNT(*) FROM NVTX_EVENTS").fetchone()[0] > 0
    assert _leftovers() == before                                 # the temporary folder is gone


@pytest.mark.parametrize("mode,extra,code,fragment", [
    ("qdstrm", [], 2, "nsys wrote no .nsys-rep: its importer failed"),
    ("empty", [], 2, "holds no join@profile range"),
    ("hang", ["--nsys-timeout", "2"], 2, "did not finish within 2 s"),
    ("worker-fails", [], 2, "nsys profile failed (exit"),
])
def test_nsys_mode_failures_are_one_line(tmp_path, fake_gpu, capsys, monkeypatch, mode, extra, code, fragment,
                                         own_tempdir):
    monkeypatch.setenv("FAKE_NSYS_MODE", mode)
    monkeypatch.setenv("FAKE_NSYS_PIDFILE", str(tmp_path / "nsys.pid"))
    before = _leftovers()
    out = tmp_path / "out"
    args = ["join", "--points", "2000", "--polygons", "200", "--prof_type", "nsys", "--bench_runs", "2",
            "--nsys", str(FAKE), "--out", str(out), *extra]
    assert main(args) == code
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("error")]
    assert len(err) == 1 and fragment in err[0], err
    assert not out.exists()
    assert _leftovers() == before
    if mode == "hang":
        with pytest.raises(ProcessLookupError):
            os.kill(int((tmp_path / "nsys.pid").read_text()), 0)      # stopped at the timeout, not orphaned


def test_nsys_not_found_is_one_line(tmp_path, fake_gpu, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setattr("app.runtime.profiling.tools.SEARCH_DIRS", ())
    assert main(["join", "--prof_type", "nsys", "--out", str(tmp_path / "out")]) == 6
    assert "nsys not found" in capsys.readouterr().err
    assert os.environ["PATH"] == str(tmp_path)


def test_sigterm_stops_nsys_and_leaves_nothing(tmp_path, fake_gpu, capsys, monkeypatch, own_tempdir):
    """A real second process: the fake nsys hangs; SIGTERM to this process must stop it and clean up."""
    import signal
    import threading
    import time

    pidfile = tmp_path / "nsys.pid"
    monkeypatch.setenv("FAKE_NSYS_MODE", "hang")
    monkeypatch.setenv("FAKE_NSYS_PIDFILE", str(pidfile))
    before, handler = _leftovers(), signal.getsignal(signal.SIGTERM)

    def terminate_when_nsys_runs():
        for _ in range(200):
            if pidfile.exists() and pidfile.read_text():
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate_when_nsys_runs, daemon=True).start()
    out = tmp_path / "out"
    assert main(["join", "--prof_type", "nsys", "--nsys", str(FAKE), "--out", str(out)]) == 143
    assert "terminated: no profile was written" in capsys.readouterr().err
    child = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)                                          # nsys (the fake) is gone
    assert not out.exists() and _leftovers() == before
    assert signal.getsignal(signal.SIGTERM) is handler              # the handler was put back


def test_missing_importer_library_is_named():
    from app.runtime.profiling.nsys import _no_report, parse_ldd

    # ldd's answer for QdstrmImporter on the lent H200 without libdw (LD_LIBRARY_PATH emptied)
    ldd = ("\tlinux-vdso.so.1 (0x00007ffd)\n\tlibdw.so.1 => not found\n"
           "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n")
    assert parse_ldd(ldd) == ["libdw.so.1"]
    msg = _no_report("QdstrmImporter: error while loading shared libraries: libdw.so.1: cannot open shared "
                     "object file: No such file or directory", "/nonexistent/nsys")
    assert "cannot load libdw.so.1" in msg and "apt-get install libdw1" in msg


def test_a_stage_busy_with_earlier_stages_work_is_not_called_gpu_bound():
    """In the overlay capture exact_intersection_refine's span is 78% busy, but 20.4 us of those 22.8 are the filter's
    kernels running on into it (its own: 4.5 us of kernels): the GPU is busy, not with this stage."""
    from app.report.timeline_report import stage_bottleneck

    plan, worker = load("overlay")
    stages = {s["name"]: s for s in analyse_plan(plan, read_sqlite(str(fixture("overlay.sqlite"))), worker)["stages"]}
    refine = stages["exact_intersection_refine"]
    assert refine["busy_us"] >= 0.7 * refine["span_us"] and refine["busy_earlier_us"] > refine["busy_us"] / 2
    text = stage_bottleneck(refine)
    assert text.startswith("Behind earlier stages' GPU work (busy 78%, 20.4 of those 22.8 us their ops)"), text
    # The same span busy with its own kernels is GPU-bound.
    assert stage_bottleneck(dict(refine, busy_earlier_us=0.0)) == "GPU-bound (busy 78%)"
    assert not any(stage_bottleneck(s).startswith("GPU-bound") for s in stages.values())


def test_cupti_overhead_below_zero_or_unresolved_is_not_read_as_a_cost():
    """On an H200 host (2026-11-29) the cupti backend's untraced iterations read 644.7 us and the traced ones 585.0 us:
    -9.26%, which tracing cannot cause (the host's pace moved). Such a figure, and one whose interval reaches 0, is
    shown with its reason and read as no cost; a resolved one is the cost."""
    from app.report.timeline_report import cupti_overhead_text
    from app.runtime.profiling.nsys import _overhead

    def runs(us, spread=0.01, n=10):
        return [us * 1e-6 * (1 + spread * (i - n / 2) / n) for i in range(n)]

    below = _overhead({"untraced_wall_seconds": runs(644.7), "traced_wall_seconds": runs(585.0)})
    assert below["overhead_pct"] < 0 and below["ci_pct"][1] < 0
    assert cupti_overhead_text(below).startswith("not read: -9.26%, 95% interval ")
    assert "tracing cannot make the plan faster" in cupti_overhead_text(below)
    noisy = _overhead({"untraced_wall_seconds": runs(600.0, 0.5), "traced_wall_seconds": runs(606.0, 0.5)})
    assert noisy["ci_pct"][0] < 0 < noisy["ci_pct"][1] and cupti_overhead_text(noisy).startswith("not resolved: +1.00%")
    cost = _overhead({"untraced_wall_seconds": runs(426.7), "traced_wall_seconds": runs(568.6)})
    assert cost["ci_pct"][0] > 0 and cupti_overhead_text(cost).startswith("+33.26%, 95% interval +")
    few = _overhead({"untraced_wall_seconds": runs(426.7, n=3), "traced_wall_seconds": runs(568.6, n=3)})
    assert few["ci_pct"] is None and cupti_overhead_text(few).startswith("not resolved: +33.26%, no interval")


def test_an_idle_cause_names_its_largest_stage_without_claiming_a_share():
    """Each range's time is split into causes on its own, so a stage's figure can exceed the iteration's (an H200
    report read 'mostly in owned_buffer_build (227.7 of 215.4 us)', the stage's median instance another iteration's
    than the headline's): an opportunity names the stage with the most of its cause and that stage's own figure,
    never 'mostly in' nor 'N of the iteration's M'."""
    from app.analysis.timeline import CAUSES
    from app.report.timeline_report import _where_idle

    plan, worker = load("join")
    a = analyse_plan(plan, read_sqlite(str(fixture("join.sqlite"))), worker)
    named = 0
    for c in CAUSES:
        where = max(a["iteration_stages"], key=lambda s: s["idle_us"][c])
        said = _where_idle(c, where, 112.3)
        if where["idle_us"][c] >= 0.05:
            named += 1
            assert said == (f"the stage with the most of it in that iteration {where['name']} "
                            f"({where['idle_us'][c]:,.1f} us of its own span)")
        elif c in ("launch_gap", "launch_latency", "sync_wait"):     # each stage counts its side of such a gap
            assert said.startswith(f"no stage counts any of it as its own {c.replace('_', ' ')}: the iteration's "
                                   "gaps between ops run across stage boundaries") and said.endswith(
                "(112.3 us of the iteration is outside every stage)")
        else:
            assert said == "in no stage's range: it lies between or after them (112.3 us of the iteration is " \
                           "outside every stage)"
    assert named >= 3


def test_idle_time_outside_every_stage_is_not_put_in_a_stage():
    """An H200 report's iteration spent 172.0 us after its last GPU op, all of it outside the stage ranges; the
    opportunity named 'owned_buffer_build (0.0 us of its own span)', the first stage of a max over zeros."""
    from app.report.timeline_report import _where_idle

    stages = [{"name": n, "idle_us": {"after_last_op": 0.0}} for n in ("owned_buffer_build", "bounds")]
    where = max(stages, key=lambda s: s["idle_us"]["after_last_op"])
    said = _where_idle("after_last_op", where, 175.3)
    assert "owned_buffer_build" not in said and said.startswith("in no stage's range") and "175.3 us" in said
    assert _where_idle("after_last_op", where) == "in no stage's range: it lies between or after them"


def test_the_iterations_figure_says_which_instance_it_is():
    """The accounting reads one real instance so its parts add up: for an even count the lower middle one, which is
    not the median of the spans (733.5 against 744.0 us on an H200 host, 10 iterations); the headline says both.
    The join capture's 3 iterations have a middle instance, the median."""
    from app.report.timeline_report import _median_words

    plan, worker = load("join")
    it = analyse_plan(plan, read_sqlite(str(fixture("join.sqlite"))), worker)["iteration"]
    assert it["instances"] == 3 and it["span_spread"]["median_us"] == pytest.approx(it["span_us"])
    assert _median_words(it) == "the median instance's span"
    even = {"instances": 10, "span_us": 733.5, "span_spread": {"median_us": 743.96}}
    assert _median_words(even) == ("the lower middle of 10 instances, whose parts add up below; the median of the "
                                   "spans 744.0")
