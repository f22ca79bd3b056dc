"""Bad input: one clear line on stderr, a non-zero exit, no traceback, nothing written."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.kernel.cli import main
from tests.conftest import child_env

SMALL = ["--points", "2000", "--polygons", "200", "--bench_runs", "2", "--warmup", "0"]


def run_cli(args, tmp_path, env=None):
    e = child_env(**(env or {}))
    return subprocess.run([sys.executable, "-m", "app.kernel", *args], capture_output=True, text=True,
                          cwd=tmp_path, env=e, timeout=300)


def profiles(root: Path):
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


@pytest.mark.parametrize("args,code,fragment", [
    (["nope"], 2, "unknown kernel 'nope'"),
    (["join", "v9"], 2, "unknown version 'v9' of join"),
    (["join", "--prof_type", "bogus"], 2, "unknown --prof_type 'bogus'"),
    (["join", "--prof_type", "nsys", "--device", "cpu"], 3, "nsys mode (nsys) needs a GPU"),
    (["join", "--prof_type", "nsys", "--nsys-timeout", "nan"], 2, "--nsys-timeout must be a finite number"),
    (["join", "--prof_type", "nsys", "--nsys-timeout", "-1"], 2, "--nsys-timeout must be a finite number"),
    (["join", "--ncu-timeout", "inf"], 2, "--ncu-timeout must be a finite number"),
    (["join", "--prof_type", "nsys", "--backend", "perf"], 2, "invalid choice: 'perf'"),
    (["join", "--points", "-5"], 2, "--points=-5 must be >= 0"),
    (["join", "--points", "lots"], 2, "--points expects int"),
    (["join", "--predicate", "touches"], 2, "--predicate='touches' is not one of within, intersects"),
    (["join", "--colour", "red"], 2, "unrecognized arguments: --colour red"),
    (["join", "--bench_runs", "0"], 2, "--bench_runs must be >= 1"),
    (["join", "--device", "tpu"], 2, "invalid choice: 'tpu'"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, code, fragment):
    out = tmp_path / "out"
    assert main([*args, "--out", str(out)]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and fragment in err[0], err
    assert profiles(out) == [] and not out.exists()


def test_unwritable_out_fails_before_running(tmp_path, capsys, monkeypatch):
    from app.runtime.profiling.event import EventMode

    def boom(*a, **k):
        raise AssertionError("profiling started before the output folder was checked")
    monkeypatch.setattr(EventMode, "profile", boom)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert main(["join", *SMALL, "--out", str(blocker / "sub")]) == 5
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pass --out DIR with a writable folder" in err[0]


def test_read_only_out_folder(tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("root writes through read-only permissions")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    assert main(["join", *SMALL, "--out", str(ro)]) == 5


def test_explicit_gpu_without_gpu_fails_loudly(tmp_path, capsys):
    from app.runtime.device import probe_gpu

    if probe_gpu()[0]:
        pytest.skip("this machine has a usable GPU")
    out = tmp_path / "out"
    assert main(["join", *SMALL, "--device", "gpu", "--out", str(out)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device gpu was asked for but" in err[0] and "use --device cpu" in err[0]
    assert not out.exists()


def test_second_concurrent_profile_is_refused(tmp_path, capsys):
    from app.runtime.lock import device_lock

    out = tmp_path / "out"
    with device_lock("cpu"):
        assert main(["join", *SMALL, "--device", "cpu", "--out", str(out)]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another profile is running on cpu" in err[0] and f"pid {os.getpid()}" in err[0]
    assert profiles(out) == []
    # Once released, the same command succeeds.
    assert main(["join", *SMALL, "--device", "cpu", "--out", str(out)]) == 0


def test_ctrl_c_leaves_no_partial_profile(tmp_path, capsys, monkeypatch):
    from app.report import writer

    out = tmp_path / "out"
    real_dumps = writer.json.dumps
    calls = {"n": 0}

    def interrupt_on_second_file(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:   # params.json written, trace.json in progress
            raise KeyboardInterrupt
        return real_dumps(*a, **k)

    monkeypatch.setattr(writer.json, "dumps", interrupt_on_second_file)
    assert main(["join", *SMALL, "--device", "cpu", "--out", str(out)]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "interrupted: no profile was written"
    assert profiles(out) == []
    assert [p.name for p in out.rglob("*") if p.name.startswith(".")] == []


def test_subprocess_error_has_no_traceback(tmp_path):
    r = run_cli(["join", "--points", "-1"], tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == "error: --points=-1 must be >= 0"
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


def test_a_run_without_a_version_gets_the_measured_default_and_list_says_why(tmp_path, capsys):
    """join's default is v5 and overlay's v4, each measured the faster at the default sizes and said so."""
    from app.kernel.plan import DEFAULTS, default_version, get_plan_class

    assert get_plan_class("join").version == "v5" and get_plan_class("overlay").version == "v4"
    assert DEFAULTS["join"][0] == "v5" and "us" in DEFAULTS["join"][1]
    # The measured choice wins over the latest version; an unknown choice falls back to the latest.
    assert default_version("join", ["v1", "v5", "v6"]) == "v5"
    assert default_version("join", ["v1", "v2"]) == "v2"
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "join  (default version v5: the fastest at the default sizes" in out
    assert main(["list", "--nope"]) == 2                  # not ignored: one line naming it
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "list takes no arguments, got --nope" in err[0], err
    assert main(["join", "--points", "300", "--polygons", "30", "--device", "cpu", "--bench_runs", "2",
                 "--out", str(tmp_path)]) == 0
    (d,) = list(tmp_path.glob("profiles/event/join/*/*"))
    assert d.parent.name.startswith("v5_")
