"""Verification in the subprocess modes (annotation, ncu, nsys), with the fake tools that replay this project's real
captures (tests/runtime/fake_tools): --no-verify reaches the profiled worker, every report and summary says what the
check found (or that none was made), and an oracle that fails in the worker is recorded, not a crash."""
import json
from pathlib import Path

import pytest

from app.kernel.cli import main
from app.kernel.plan import get_plan_class
from app.runtime import device as devmod
from app.runtime.profiling import session
from app.runtime.profiling.worker import run_worker

TOOLS = Path(__file__).resolve().parents[1] / "runtime" / "fake_tools"
NSYS_SQLITE = Path(__file__).resolve().parents[1] / "fixtures" / "nsys" / "join.sqlite"
SMALL = ["join", "v2", "--points", "3000", "--polygons", "300"]
NSYS = ["join", "--points", "2000", "--polygons", "200", "--prof_type", "nsys", "--bench_runs", "2",
        "--nsys", str(TOOLS / "nsys")]
REAL_SELECT = devmod.select          # before the fake GPU replaces it
MISMATCH = {"oracle": "shapely.STRtree.query", "matches": False, "pairs": 548, "expected_pairs": 549,
            "missing": [[0, 17]], "extra": []}


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    sel = devmod.Selection("auto", "gpu", "gpu", "declared by the test", "NVIDIA H200", {"name": "NVIDIA H200"})
    monkeypatch.setattr("app.runtime.profiling.session.devmod.select", lambda requested: sel)
    monkeypatch.setenv("FAKE_NSYS_SQLITE", str(NSYS_SQLITE))


def annotation(*extra):
    return [*SMALL, "--prof_type", "annotation", "--ncu", str(TOOLS / "ncu"), *extra]


def the_profile(out: Path, mode: str) -> Path:
    (d,) = list(out.glob(f"profiles/{mode}/join/*/*"))
    return d


def with_verification(monkeypatch, verification):
    """The worker's report as the parent reads it, with ``verification`` in place of the worker's own."""
    load = session.Session.load_worker

    def loaded(self, label):
        return load(self, label) | {"verification": verification}
    monkeypatch.setattr(session.Session, "load_worker", loaded)


@pytest.mark.parametrize("mode", ["annotation", "ncu"])
def test_no_verify_reaches_the_worker_under_ncu(tmp_path, capsys, mode):
    out = tmp_path / "out"
    args = [*SMALL, "--prof_type", mode, "--ncu", str(TOOLS / "ncu"), "--no-verify", "--out", str(out)]
    assert main(args) == 0
    d = the_profile(out, mode)
    assert json.loads((d / "params.json").read_text())["options"]["verify"] is False
    assert json.loads((d / "trace.json").read_text())["metadata"]["verification"] is None, \
        "the oracle ran inside the profiled process despite --no-verify"
    report = (d / "report.md").read_text()
    assert "not verified (`--no-verify`)" in report.split("\n## ")[0].lower()
    assert "not verified (--no-verify)" in capsys.readouterr().out


def test_no_verify_in_nsys_mode_is_said_in_report_and_summary(tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*NSYS, "--out", str(out), "--no-verify"]) == 0
    report = (the_profile(out, "nsys") / "report.md").read_text()
    assert "not verified (`--no-verify`)" in report.split("\n## ")[0].lower()
    assert "## Verification" in report
    assert "not verified (--no-verify)" in capsys.readouterr().out


def test_nsys_mode_states_a_passed_check(tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*NSYS, "--out", str(out)]) == 0
    report = (the_profile(out, "nsys") / "report.md").read_text()
    assert "Output matches shapely.STRtree.query" in report
    assert "verified against shapely.STRtree.query: OK" in capsys.readouterr().out


@pytest.mark.parametrize("mode", ["annotation", "nsys"])
def test_a_mismatch_in_a_subprocess_mode_leads_report_and_summary(tmp_path, capsys, monkeypatch, mode):
    with_verification(monkeypatch, MISMATCH)
    out = tmp_path / "out"
    log = tmp_path / "log.md"
    args = annotation() if mode == "annotation" else NSYS
    assert main([*args, "--out", str(out), "--devlog", str(log)]) == 9
    cap = capsys.readouterr()
    assert cap.out.splitlines()[0].startswith("OUTPUT DOES NOT MATCH THE REFERENCE"), cap.out
    assert not log.exists()
    err = [line for line in cap.err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and "1 missing" in err[0] and "(0, 17)" in err[0], err
    report = (the_profile(out, mode) / "report.md").read_text()
    assert "**OUTPUT DOES NOT MATCH THE REFERENCE**" in report.split("\n## ")[0]


@pytest.mark.parametrize("mode", ["annotation", "nsys"])
def test_an_oracle_failure_in_the_worker_is_recorded_in_a_subprocess_mode(tmp_path, capsys, monkeypatch, mode):
    with_verification(monkeypatch, {"error": "ModuleNotFoundError: import of shapely halted", "matches": None})
    out = tmp_path / "out"
    args = annotation() if mode == "annotation" else NSYS
    code = main([*args, "--out", str(out)])
    cap = capsys.readouterr()
    assert code == 10 and "Traceback" not in cap.err, cap.err
    err = [line for line in cap.err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and "verification could not run" in err[0], err
    report = (the_profile(out, mode) / "report.md").read_text()
    assert "verification could not run" in report.split("\n## ")[0].lower()


def test_the_worker_records_an_oracle_failure_and_writes_its_report(tmp_path, monkeypatch):
    plan = get_plan_class("join", "v2")({"points": "300", "polygons": "30"})

    def broken(inputs, output):
        raise ImportError("import of shapely halted; None in sys.modules")
    monkeypatch.setattr(plan, "verify", broken)
    monkeypatch.setattr(devmod, "select", REAL_SELECT)       # the worker itself runs on this machine's CPU
    out = tmp_path / "worker.json"
    assert run_worker(plan, "cpu", 0, str(out)) == 0
    v = json.loads(out.read_text())["verification"]
    assert v["error"] == "ImportError: import of shapely halted; None in sys.modules"
    assert v["matches"] is None


def test_the_counter_modes_python_api_raises_on_a_wrong_answer_after_writing(tmp_path, monkeypatch):
    """annotation_profile_plan had returned a wrong answer's Profile (ok=False) with no word."""
    from app.errors import VerificationFailed
    from app.runtime.profiling.annotation import annotation_profile_plan

    with_verification(monkeypatch, MISMATCH)
    with pytest.raises(VerificationFailed) as err:
        annotation_profile_plan(get_plan_class("join", "v2")({"points": 3000, "polygons": 300}),
                                out_dir=str(tmp_path / "out"), ncu=str(TOOLS / "ncu"))
    assert "its output did not match the reference" in str(err.value) and "(0, 17)" in str(err.value)
    assert err.value.profile.ok is False and (tmp_path / "out" / "profiles" / "annotation").is_dir()
