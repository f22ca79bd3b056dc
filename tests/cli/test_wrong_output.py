"""A profile whose output is wrong (or unverified) says so at the top of everything it prints and writes, and no
command reads it as a valid measurement: no devlog entry, no compare, no --baseline.

The wrong output is made in process, the way a bug would make it: the join's last stage drops its first row (one
pair missing), the overlay's last stage scales one area by 1.001. The oracle's failure is shapely's import failing.
"""
import json
from pathlib import Path

import numpy as np
import pytest

import app.kernel.overlay.cpu as overlay_cpu
from app.kernel.cli import main
from tests.cli.conftest import drop_a_row_of_the_join

JOIN = ["join", "--points", "300", "--polygons", "30", "--device", "cpu", "--bench_runs", "2", "--warmup", "0"]
OVERLAY = ["overlay", "--left", "30", "--right", "30", "--device", "cpu", "--bench_runs", "2", "--warmup", "0"]


@pytest.fixture
def scale_an_area(monkeypatch):
    orig = overlay_cpu.OverlayCPU.area_reconstruction

    def scaled(self, state, st, tiling):
        orig(self, state, st, tiling)
        a, b, area = state["output"]
        area = np.array(area, copy=True)
        area[len(area) // 2] *= 1.001
        state["output"] = (a, b, area)
    monkeypatch.setattr(overlay_cpu.OverlayCPU, "area_reconstruction", scaled)


@pytest.fixture
def no_oracle(monkeypatch):
    import app.kernel.join.oracle as oracle

    def broken(*a, **k):
        raise ImportError("import of shapely halted; None in sys.modules")
    monkeypatch.setattr(oracle, "shapely_join", broken)


def only_profile(out: Path, kernel: str = "join") -> Path:
    (d,) = list(out.glob(f"profiles/event/{kernel}/*/*"))
    return d


def errors(err: str) -> list[str]:
    return [line for line in err.strip().splitlines() if line.startswith("error")]


def test_a_wrong_join_is_named_first_and_logged_nowhere(tmp_path, capsys, drop_a_row):
    log = tmp_path / "log.md"
    assert main([*JOIN, "--out", str(tmp_path / "out"), "--devlog", str(log)]) == 9
    cap = capsys.readouterr()
    assert not log.exists(), "a wrong answer's timings were appended to the devlog"
    # the terminal summary opens with the verdict and what differs
    first = cap.out.splitlines()[0]
    assert first.startswith("OUTPUT DOES NOT MATCH THE REFERENCE"), cap.out
    assert "1 missing" in first and "0 extra" in first, first
    assert "devlog: nothing appended" in cap.out + cap.err
    (err,) = errors(cap.err)
    assert "1 missing" in err and "missing: (" in err, err
    assert "Traceback" not in cap.err
    report = (only_profile(tmp_path / "out") / "report.md").read_text()
    top = report.split("\n## ")[0]                      # above the first section: title and headline
    assert "**OUTPUT DOES NOT MATCH THE REFERENCE**" in top and "1 missing" in top, top


def test_a_wrong_overlay_area_names_the_pair_and_both_areas(tmp_path, capsys, scale_an_area):
    assert main([*OVERLAY, "--out", str(tmp_path / "out")]) == 9
    cap = capsys.readouterr()
    (err,) = errors(cap.err)
    trace = json.loads((only_profile(tmp_path / "out", "overlay") / "trace.json").read_text())
    v = trace["metadata"]["verification"]
    assert v["mismatched_pairs"] == 1
    (a, b), got, exp = v["worst"][0]
    assert "1 pair differs" in err and f"({a}, {b})" in err and f"{got:.6g}" in err and f"{exp:.6g}" in err, err
    assert cap.out.startswith("OUTPUT DOES NOT MATCH THE REFERENCE")


@pytest.fixture
def bad_and_good(tmp_path, monkeypatch):
    """A good profile, then a wrong one of the same parameters (newer), under one --out; the patch is undone."""
    out = tmp_path / "out"
    assert main([*JOIN, "--out", str(out)]) == 0
    good = only_profile(out)
    drop_a_row_of_the_join(monkeypatch)
    assert main([*JOIN, "--out", str(out)]) == 9
    monkeypatch.undo()
    (bad,) = [d for d in out.glob("profiles/event/join/*/*") if d != good]
    return out, good, bad


def test_devlog_refuses_a_wrong_output_profile(bad_and_good, tmp_path, capsys):
    _, _, bad = bad_and_good
    capsys.readouterr()
    log = tmp_path / "log.md"
    assert main(["devlog", str(bad), "--file", str(log)]) == 9
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did not match the reference" in err[0] and "1 missing" in err[0], err
    assert not log.exists()


@pytest.mark.parametrize("order", ["good-bad", "bad-good"])
def test_compare_refuses_a_wrong_output_profile(bad_and_good, capsys, order):
    _, good, bad = bad_and_good
    capsys.readouterr()
    pair = [str(good), str(bad)] if order == "good-bad" else [str(bad), str(good)]
    assert main(["compare", *pair]) == 9
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "did not match the reference" in err[0], err
    assert cap.out == ""


def test_an_explicit_wrong_output_baseline_is_refused(bad_and_good, capsys):
    out, _, bad = bad_and_good
    capsys.readouterr()
    assert main([*JOIN, "--out", str(out), "--baseline", str(bad)]) == 9
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did not match the reference" in err[0], err


def test_baseline_latest_skips_wrong_output_profiles_and_says_so(bad_and_good, capsys):
    out, good, bad = bad_and_good
    capsys.readouterr()
    assert main([*JOIN, "--out", str(out), "--baseline", "latest"]) == 0
    err = capsys.readouterr().err
    assert f"skipped {bad}" in err and "did not match the reference" in err, err
    assert f"baseline: {good}" in err, err


def test_baseline_latest_with_only_wrong_profiles_is_refused(tmp_path, capsys, drop_a_row, monkeypatch):
    out = tmp_path / "out"
    assert main([*JOIN, "--out", str(out)]) == 9
    monkeypatch.undo()
    capsys.readouterr()
    assert main([*JOIN, "--out", str(out), "--baseline", "latest"]) == 2
    err = capsys.readouterr().err
    assert "skipped" in err and "no earlier profile" in err and "with a verified output" in errors(err)[0], err


def test_no_verify_is_said_in_the_summary_and_at_the_top_of_the_report(tmp_path, capsys):
    assert main([*JOIN, "--out", str(tmp_path / "out"), "--no-verify"]) == 0
    out = capsys.readouterr().out
    assert "not verified (--no-verify)" in out, out
    report = (only_profile(tmp_path / "out") / "report.md").read_text()
    assert "not verified (`--no-verify`)" in report.split("\n## ")[0].lower()
    params = json.loads((only_profile(tmp_path / "out") / "params.json").read_text())
    assert params["options"]["verify"] is False


def test_an_oracle_failure_keeps_the_profile_and_is_one_line(tmp_path, capsys, no_oracle):
    log = tmp_path / "log.md"
    code = main([*JOIN, "--out", str(tmp_path / "out"), "--devlog", str(log)])
    cap = capsys.readouterr()
    assert code == 10, code            # neither a pass nor a mismatch
    assert "Traceback" not in cap.err
    (err,) = errors(cap.err)
    assert "verification could not run" in err and "import of shapely halted" in err, err
    d = only_profile(tmp_path / "out")
    v = json.loads((d / "trace.json").read_text())["metadata"]["verification"]
    assert "import of shapely halted" in v["error"] and v.get("matches") is not True
    report = (d / "report.md").read_text()
    assert "verification could not run" in report.split("\n## ")[0].lower()
    assert cap.out.splitlines()[0].startswith("VERIFICATION COULD NOT RUN")
    assert not log.exists()


def test_a_profile_whose_check_could_not_run_is_refused_with_its_own_exit_status(tmp_path, capsys, no_oracle):
    """It exits 10 where it was made; devlog, compare and --baseline refuse it with the same 10, not a mismatch's 9."""
    out = tmp_path / "out"
    assert main([*JOIN, "--out", str(out)]) == 10
    unverified = only_profile(out)
    capsys.readouterr()
    for args in (["devlog", str(unverified), "--file", str(tmp_path / "log.md")],
                 ["compare", str(unverified), str(unverified)]):
        assert main(args) == 10
        (err,) = errors(capsys.readouterr().err)
        assert "its output was not verified: the verification could not run" in err, err
    assert not (tmp_path / "log.md").exists()
