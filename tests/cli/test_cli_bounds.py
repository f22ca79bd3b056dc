"""Counts and sizes past what any run needs are refused at once: one line naming the option, its limit and why,
exit 2, nothing written -- never a run that grows until the host runs out of memory."""
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.errors import BadParameter
from app.kernel.cli import MAX_BENCH_RUNS, MAX_WARMUP, bench_runs_arg, main, warmup_arg
from app.kernel.plan import get_plan_class
from app.runtime.memory import check_fits
from app.runtime.timing import AUTO_MAX_RUNS, WARMUP_MAX_RUNS
from tests.conftest import child_env

SMALL = ["--points", "300", "--polygons", "30", "--device", "cpu"]


@pytest.fixture
def no_profiling(monkeypatch):
    """A count let through would start a run of days: fail at once instead."""
    from app.runtime.profiling.event import EventMode
    from app.sweep import command

    def started(*a, **k):
        raise AssertionError("the run started: the count was not refused")
    monkeypatch.setattr(EventMode, "profile", started)
    monkeypatch.setattr(command, "check_points", started)


def refused(capsys, argv, out: Path) -> str:
    """The one line of a refusal that came at once and created nothing."""
    t0 = time.monotonic()
    assert main([*argv, "--out", str(out)]) == 2
    assert time.monotonic() - t0 < 5                           # refused before any input was generated
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert not out.exists()
    return err[0]


@pytest.mark.parametrize("flag,value", [("--bench_runs", "1000000000"), ("--bench_runs", "99999999999999999999"),
                                        ("--bench-runs", str(MAX_BENCH_RUNS + 1)), ("--warmup", "100000000000"),
                                        ("--warmup", str(MAX_WARMUP + 1))])
def test_a_run_count_past_the_limit_is_refused_naming_it_and_why(tmp_path, capsys, no_profiling, flag,
                                                                 value):
    line = refused(capsys, ["join", *SMALL, flag, value], tmp_path / "out")
    if "bench" in flag:
        assert f"--bench_runs must be at most {MAX_BENCH_RUNS:,}, got {int(value):,}" in line
        assert "kept in memory and written to trace.json" in line
    else:
        assert f"--warmup must be at most {MAX_WARMUP:,}, got {int(value):,}" in line


def test_a_sweep_refuses_the_same_counts(tmp_path, capsys, no_profiling):
    line = refused(capsys, ["sweep", "join", "--grid", "points=1k,2k", "--device", "cpu", "--bench_runs",
                            "1000000000"], tmp_path / "out")
    assert f"--bench_runs must be at most {MAX_BENCH_RUNS:,}" in line


def test_the_limits_leave_room_for_what_auto_runs_and_are_accepted():
    assert MAX_BENCH_RUNS >= 10 * AUTO_MAX_RUNS and MAX_WARMUP >= 5 * WARMUP_MAX_RUNS
    assert bench_runs_arg(str(MAX_BENCH_RUNS)) == MAX_BENCH_RUNS and warmup_arg(str(MAX_WARMUP)) == MAX_WARMUP
    assert bench_runs_arg("auto") == "auto" and warmup_arg("auto") == "auto" and warmup_arg("0") == 0


def test_a_real_process_with_a_runaway_count_ends_at_once(tmp_path):
    """The audit's case: the process ran for an hour, growing ~7 MB/s, until the host killed it."""
    env = child_env()
    r = subprocess.run([sys.executable, "-m", "app.kernel", "join", *SMALL, "--bench_runs", "99999999999999999999",
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=30)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "--bench_runs must be at most" in lines[0] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv,options", [
    (["join", "--vertices", "100000000"], "--vertices"),
    (["overlay", "--vertices", "100000000"], "--vertices"),
    (["join", "--polygons", "500000000", "--vertices", "200"], "--polygons or --vertices"),
    (["join", "--points", str(10**12)], "--points"),
])
def test_an_index_limit_refusal_names_the_options_that_caused_it(tmp_path, capsys, argv, options):
    line = refused(capsys, [*argv, "--device", "cpu"], tmp_path / "out")
    assert "32-bit index limit" in line and line.endswith(f"use a smaller {options}"), line


def plan(kernel, **params):
    return get_plan_class(kernel, None)(params)


def test_a_memory_refusal_names_the_raised_size_and_a_value_that_fits():
    """--vertices raised: the advice is about --vertices (the plan's own scale would say --polygons), its value
    fits, a little more does not, and where even its least value (3) cannot fit that is what it says."""
    have = 10**9
    with pytest.raises(BadParameter, match=r"use at most about --vertices [\d,]+ \(with the other sizes unchanged\)$") \
            as err:
        check_fits(plan("join", vertices=100_000), "cpu", host_bytes=have)
    most = int(str(err.value).split("--vertices ")[1].split(" ")[0].replace(",", ""))
    check_fits(plan("join", vertices=most), "cpu", host_bytes=have)
    with pytest.raises(BadParameter):
        check_fits(plan("join", vertices=most + 5), "cpu", host_bytes=have)
    with pytest.raises(BadParameter, match="even --vertices 3 does not fit: reduce the other sizes"):
        check_fits(plan("join", points=10, polygons=10_000, vertices=100_000), "cpu", host_bytes=10**6)


@pytest.mark.parametrize("argv,fragment", [
    (["ab", "HEAD", "HEAD", "--processes", "100000", "--out", "OUT", "--", "join"], "--processes 100,000: at most 100"),
    (["sweep", "join", "--grid", "points=1k", "--workers", "100000", "--out", "OUT"], "--workers 100,000: at most 256"),
])
def test_process_counts_past_the_limit_are_refused(tmp_path, capsys, argv, fragment):
    """ab's processes are whole profiles run in turns, a sweep's local workers processes of this machine: a
    count no one means is one line, exit 2, before anything starts."""
    assert main([str(tmp_path / "out") if a == "OUT" else a for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kw", [{"bench_runs": 10 ** 9}, {"bench_runs": 0}, {"bench_runs": 2.5}, {"bench_runs": True},
                                {"warmup": 10 ** 11}, {"warmup": -1}])
def test_the_python_api_refuses_the_same_counts(kw):
    """app.kernel.profile builds its options without the CLI's parser: the same bounds hold there."""
    from app.kernel import profile

    with pytest.raises(BadParameter, match=f"{next(iter(kw))}="):
        profile("join", points=300, polygons=30, device="cpu", **kw)
