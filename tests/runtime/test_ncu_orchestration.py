"""annotation and ncu mode's subprocess orchestration with a fake ncu that replays this project's
own H200 captures (tests/fixtures/ncu).

The device is declared a GPU in-process (CI has none); the fake runs the real worker on the CPU
and prints the captured CSV, or writes the captured .ncu-rep. Real ncu runs happen on the lent
GPU machine (tests/runtime/test_ncu_real.py).
"""
import json
from pathlib import Path

import pytest

from app.errors import BadParameter
from app.kernel.cli import main
from app.kernel.plan import get_plan_class
from app.runtime import device as devmod
from app.runtime.profiling.annotation import annotation_profile_plan
from app.runtime.profiling.parsers.ncu_csv import parse_raw
from tests.conftest import fixture_text

FAKE = Path(__file__).parent / "fake_tools" / "ncu"
SMALL = ["--points", "3000", "--polygons", "300"]
ARGS = ["join", "v2", *SMALL, "--prof_type", "annotation", "--ncu", str(FAKE)]


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    sel = devmod.Selection("auto", "gpu", "gpu", "declared by the test", "NVIDIA H200", {"name": "NVIDIA H200"})
    monkeypatch.setattr("app.runtime.profiling.session.devmod.select", lambda requested: sel)


def _profile_dir(out, mode, kernel="join"):
    (d,) = list(out.glob(f"profiles/{mode}/{kernel}/*/*"))
    return d


def test_annotation_profile_from_replayed_capture(tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*ARGS, "--out", str(out)]) == 0
    d = _profile_dir(out, "annotation")
    names = {p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()}
    assert {"report.md", "trace.json", "params.json", "kernels.csv", "stages.csv", "ncu_raw.csv", "roofline.png",
            "bandwidth.png"} <= names
    trace = json.loads((d / "trace.json").read_text())
    raw, _ = parse_raw(fixture_text("ncu/join.annotation.csv"))
    assert trace["metadata"]["kernels_outside_stages"] == 0
    by = {s["name"]: s for s in trace["stages"]}
    refine_ns = raw.loc[raw["kernel"] == "refine", "duration_ns"].sum()
    assert by["predicate_refine"]["metadata"]["kernels"] == 1
    assert by["predicate_refine"]["elapsed_seconds"] == pytest.approx(refine_ns / 1e9)
    assert by["bounds"]["rows_in"] == 3300                     # rows from the real worker
    assert trace["metadata"]["verification"]["matches"] is True
    report = (d / "report.md").read_text()
    for heading in ("## Stages", "**Bottleneck:**", "## Top 3 Opportunities", "## Kernels",
                    "DRAM bytes: measured vs cost model", "## Transfers and syncs", "## Verification",
                    "## Device", "](roofline.png)", "](bandwidth.png)"):
        assert heading in report, heading
    assert "Output matches shapely" in report
    err = capsys.readouterr().err
    assert '==PROF== Profiling "join"' in err                  # progress reached the user


def test_ncu_mode_from_replayed_capture_lists_source_lines(tmp_path):
    out = tmp_path / "out"
    assert main(["join", "v2", *SMALL, "--prof_type", "ncu", "--ncu", str(FAKE), "--out", str(out)]) == 0
    d = _profile_dir(out, "ncu")
    report = (d / "report.md").read_text()
    assert "## Hot spots (CUDA source lines, by warp-stall samples)" in report
    assert "## NCU rule results" in report and "## Verification" in report
    hot = {p.name: p.read_text() for p in (d / "hot").glob("*.md")}
    assert len(hot) == 20
    refine = next(t for n, t in hot.items() if n.endswith("_refine.md"))
    assert refine.startswith("# refine (stage predicate_refine)")
    # The hottest line of refine is a CUDA source line with its code, reasons and SASS below it.
    first = next(line for line in refine.splitlines() if line.startswith("| 1 |"))
    assert "app/kernel/common.cuh:" in first and "long_scoreboard" in first and "`" in first
    assert "## SASS under the hottest lines" in refine
    kernels = {row.split(",")[1] for row in (d / "kernels.csv").read_text().splitlines()[1:]}
    assert "refine" in kernels
    trace = json.loads((d / "trace.json").read_text())
    assert all(s["ncu"]["dram_pct"] is not None for s in trace["stages"] if s["metadata"]["kernels"])


def test_counter_modes_refuse_bench_runs_in_one_line(tmp_path, capsys):
    assert main([*ARGS, "--bench_runs", "5", "--out", str(tmp_path / "out")]) == 2
    err = [l for l in capsys.readouterr().err.splitlines() if l.startswith("error:")]
    assert len(err) == 1 and "--bench_runs 5" in err[0] and "one warm iteration" in err[0]
    assert not (tmp_path / "out").exists()
    with pytest.raises(BadParameter, match="--bench_runs 3"):
        annotation_profile_plan(get_plan_class("join", "v2")({"points": 3000, "polygons": 300}), bench_runs=3,
                                ncu=str(FAKE))


@pytest.mark.parametrize("mode,code,fragment", [
    ("perm", 7, "ERR_NVGPUCTRPERM"),
    ("nokernels", 2, "profiled no kernels"),
    ("worker-fails", 2, "failed (exit"),
])
def test_failures_are_one_line_and_write_nothing(tmp_path, capsys, monkeypatch, mode, code, fragment):
    monkeypatch.setenv("FAKE_NCU_MODE", mode)
    out = tmp_path / "out"
    assert main([*ARGS, "--out", str(out)]) == code
    err = [l for l in capsys.readouterr().err.splitlines() if l.startswith("error:")]
    assert len(err) == 1 and fragment in err[0], err
    assert not out.exists()


def test_timeout_stops_ncu(tmp_path, capsys, monkeypatch):
    import os
    import tempfile

    pidfile = tmp_path / "ncu.pid"
    monkeypatch.setenv("FAKE_NCU_MODE", "hang")
    monkeypatch.setenv("FAKE_NCU_PIDFILE", str(pidfile))
    before = set(Path(tempfile.gettempdir()).glob("app-ncu-*"))
    assert main([*ARGS, "--ncu-timeout", "1", "--out", str(tmp_path / "out")]) == 2
    assert "did not finish within 1 s" in capsys.readouterr().err
    with pytest.raises(ProcessLookupError):
        os.kill(int(pidfile.read_text()), 0)                     # ncu (the fake) was stopped, not orphaned
    assert set(Path(tempfile.gettempdir()).glob("app-ncu-*")) == before    # and its temp folder removed


def test_missing_ncu(tmp_path, capsys):
    assert main(["join", "--prof_type", "ncu", "--ncu", str(tmp_path / "nope")]) == 6
    assert "ncu not found at" in capsys.readouterr().err


def test_cpu_run_leads_the_headline(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "cpu-worker")       # the worker's report says it ran on the CPU
    out = tmp_path / "out"
    main([*ARGS, "--out", str(out)])
    report = (_profile_dir(out, "annotation") / "report.md").read_text()
    headline = report.split("\n## ")[0]
    assert "CPU FALLBACK" in headline and "no GPU counters" in headline
