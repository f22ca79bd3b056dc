"""`from app.kernel import profile`: the notebook entry point runs the CLI's code path, returns
DataFrames, and writes nothing unless asked."""
import pytest

from app.errors import BadParameter
from app.kernel import profile


def test_profile_returns_tables_and_writes_nothing(tmp_path, monkeypatch):
    work = tmp_path / "work"                  # (tmp_path itself holds the test's device lock)
    work.mkdir()
    monkeypatch.chdir(work)
    p = profile("join", "v2", points=2000, polygons=200, device="cpu", bench_runs=3)
    assert list(work.iterdir()) == [] and p.path is None
    assert p.stages["stage"].tolist() == [s["name"] for s in p.trace["stages"]]
    assert (p.stages["elapsed_us"] > 0).all() and p.stages["rows_in"].iloc[0] == 2200
    assert p.trace["timing"]["timed_runs"] == 3 and p.report_md.startswith("# Profile: join v2")
    assert p.trace["metadata"]["verification"]["matches"] is True
    assert list(p.kernels.columns[:2]) == ["stage", "kernel"]          # CPU run: no compiled kernels


def test_profile_writes_the_cli_folder_when_asked(tmp_path):
    p = profile("overlay", left=300, right=300, device="cpu", bench_runs=2, out=str(tmp_path))
    assert p.path.is_dir() and (p.path / "report.md").read_text() == p.report_md
    assert p.path.parent.parent.parent.name == "event" and p.path.parent.parent.name == "overlay"


@pytest.mark.parametrize("kwargs,fragment", [
    ({"pointz": 10}, "'pointz': neither a parameter of join"),
    ({"points": -5}, "--points=-5 must be >="),
    ({"prof_type": "annotation", "bench_runs": 3}, "--bench_runs 3: annotation mode"),
])
def test_bad_arguments_are_refused_in_one_line(kwargs, fragment):
    with pytest.raises(BadParameter, match=fragment.replace("(", r"\(").replace("[", r"\[")):
        profile("join", device="cpu", **kwargs)


# --- the audit's findings: what a notebook user meets before and after profiling

import json  # noqa: E402
import math  # noqa: E402

import app.kernel  # noqa: E402
from app.errors import OutputNotWritable, VerificationFailed  # noqa: E402
from app.runtime.profiling.base import CHOICES, ProfileOptions  # noqa: E402

TINY = dict(points=300, polygons=30, device="cpu", warmup=0)


def test_a_wrong_answer_raises_after_writing_and_names_the_profile(tmp_path, drop_a_row):
    """The CLI exits 9; profile() had returned the wrong answer's timings as if they were a measurement."""
    with pytest.raises(VerificationFailed) as err:
        profile("join", "v1", bench_runs=2, out=str(tmp_path), **TINY)
    result = err.value.result
    assert result.ok is False and result.path.is_dir() and str(result.path) in str(err.value)
    assert "output does not match" in str(err.value) and result.trace["metadata"]["verification"]["matches"] is False
    with pytest.raises(VerificationFailed, match=r"nothing was written \(pass out= to keep it\)"):
        profile("join", "v1", bench_runs=2, **TINY)


def test_a_wrong_answer_with_verify_false_is_returned_unchecked(drop_a_row):
    p = profile("join", "v1", bench_runs=2, verify=False, **TINY)
    assert p.ok is True and p.trace["metadata"]["verification"] is None


def test_a_baseline_is_read_before_profiling(tmp_path, monkeypatch):
    """'latest' and a folder, as the CLI's --baseline; it had raised TypeError after profiling."""
    first = profile("join", "v1", bench_runs=6, out=str(tmp_path), **TINY)
    for baseline in ("latest", str(first.path), first.path):
        p = profile("join", "v1", bench_runs=6, out=str(tmp_path), baseline=baseline, **TINY)
        assert "## vs Baseline" in p.report_md
        assert json.loads((p.path / "params.json").read_text())["options"]["baseline"] is True


def test_a_baseline_given_as_a_loaded_trace_is_checked_as_a_folders_is(no_profiling):
    """A dict had been taken as it was: a trace of a wrong answer, or of other parameters, became the baseline,
    and the whole dict was written into params.json's command line."""
    from pathlib import Path

    real = json.loads((Path(__file__).parents[1] / "data" / "event" /         # a real H100 profile's trace
                       "join_v4_100k_10k_h100_host_pace_again.trace.json").read_text())
    wrong = json.loads(json.dumps(real))
    wrong["metadata"]["verification"]["matches"] = False
    with pytest.raises(VerificationFailed, match=r"baseline=<the trace given>"):
        profile("join", "v4", bench_runs=2, baseline=wrong, **TINY)
    with pytest.raises(BadParameter, match=r"baseline=<the trace given> was measured for .*pass force=True"):
        profile("join", "v4", bench_runs=2, baseline=real, **TINY)        # 100k x 10k on an H100: not these


@pytest.mark.parametrize("kwargs,fragment", [
    ({"baseline": "latest", "points": 301}, "baseline='latest': no earlier profile of these parameters"),
    ({"baseline": "NOPE"}, "baseline=NOPE: not a readable profile"),
    ({"baseline": 3}, "baseline=3: expected a profile folder, its trace.json, 'latest', or None"),
    ({"out": "FILE"}, "out=\"FILE\": cannot write profiles under FILE/profiles/event/join/"),
    ({"out": "/proc/app-kernel"}, "out=\"/proc/app-kernel\": "),
])
def test_what_the_cli_checks_first_is_checked_before_profiling(tmp_path, no_profiling, kwargs, fragment):
    """out= a file had been refused only after the profile ran, with the CLI's 'pass --out'."""
    (tmp_path / "FILE").write_text("x")
    swap = {"FILE": str(tmp_path / "FILE"), "NOPE": str(tmp_path / "nope")}
    kwargs = {k: swap.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}
    fragment = fragment.replace("FILE", str(tmp_path / "FILE")).replace("NOPE", str(tmp_path / "nope"))
    with pytest.raises(Exception) as err:
        profile("join", "v1", bench_runs=2, **(TINY | {"out": str(tmp_path / "o")} | kwargs))
    assert fragment in str(err.value) and "--out" not in str(err.value) and "--baseline" not in str(err.value)
    if "out" in kwargs:
        assert isinstance(err.value, OutputNotWritable) and "pass out= a writable folder" in str(err.value)


@pytest.mark.parametrize("kwargs,fragment", [
    ({"l2": "bogus"}, "l2='bogus': expected one of 'flush', 'keep'"),
    ({"overhead": "slow"}, "overhead='slow': expected one of 'precise', 'quick'"),
    ({"backend": "zzz"}, "backend='zzz': expected one of 'nsys', 'cupti'"),
    ({"clock_control": "max"}, "clock_control='max': expected one of 'none', 'base'"),
    ({"device": "tpu"}, "device='tpu': expected one of 'auto', 'cpu', 'gpu'"),
    ({"ncu_timeout": -1}, "ncu_timeout=-1: expected a finite number of seconds > 0"),
    ({"nsys_timeout": float("nan")}, "nsys_timeout=nan: expected a finite number of seconds > 0"),
    ({"nvtx": "no"}, "nvtx='no': expected True or False"),
    ({"verify": "False"}, "verify='False': expected True or False"),
    ({"graph": 1}, "graph=1: expected True or False"),
])
def test_options_are_checked_with_their_choices(no_profiling, kwargs, fragment):
    """They had been accepted and recorded in params.json as if they applied (nvtx="no" is true)."""
    with pytest.raises(ValueError) as err:
        profile("join", **(TINY | kwargs))
    assert fragment in str(err.value) and isinstance(err.value, BadParameter)
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        ProfileOptions(**kwargs)


def test_the_option_choices_are_the_clis():
    from app.runtime.device import DEVICES
    from app.runtime.timing import L2_MODES

    assert CHOICES["l2"] == L2_MODES and CHOICES["device"] == DEVICES


def test_params_json_records_the_call_and_the_runs_that_ran(tmp_path):
    """command_line had been 'app.kernel.profile join v1 --prof_type=event', and options.bench_runs null for the
    default 10 runs."""
    p = profile("join", "v1", out=tmp_path, **TINY)
    params = json.loads((p.path / "params.json").read_text())
    assert p.trace["timing"]["timed_runs"] == 10 and params["options"]["bench_runs"] == 10
    assert params["command_line"] == (
        f"python -c 'from app.kernel import profile; profile(\"join\", \"v1\", prof_type=\"event\", "
        f"out=\"{tmp_path}\", points=300, polygons=30, device=\"cpu\", warmup=0)'")
    assert params["command_line"] in p.report_md
    # counter modes profile one warm iteration: their default is recorded as 1
    options = ProfileOptions()
    options.refuse_event_only("ncu")
    assert options.as_dict()["bench_runs"] == 1 and ProfileOptions(bench_runs="auto").as_dict()["bench_runs"] == "auto"


def test_stages_keep_a_missing_stage_time_as_nan_and_name_it():
    """An ncu stage whose kernel time is missing has elapsed_seconds null: .stages had raised TypeError."""
    p = profile("join", "v1", bench_runs=2, **TINY)
    trace = json.loads(json.dumps(p.trace, default=str))
    trace["stages"][1] |= {"elapsed_seconds": None, "spread": None, "host_seconds": None,
                           "ncu": {"dram_bytes": None, "sm_pct": 41.0}}
    df = app.kernel.ProfileResult(trace, {}).stages
    row = df.iloc[1]
    assert math.isnan(row["elapsed_us"]) and math.isnan(row["host_us"]) and math.isnan(row["ncu_dram_bytes"])
    assert row["ncu_sm_pct"] == 41.0 and row["missing"] == "elapsed_us, ncu_dram_bytes, host_us"
    assert df.iloc[0]["missing"] == "" and df.iloc[0]["elapsed_us"] > 0


def test_profile_is_documented_and_listed():
    assert "profile" in dir(app.kernel) and "ProfileResult" in dir(app.kernel)
    doc = app.kernel.profile.__doc__
    assert doc and "VerificationFailed" in doc and "baseline" in doc and "out" in doc
