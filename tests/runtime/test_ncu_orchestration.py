"""annotation mode's subprocess orchestration with a fake ncu that replays the real capture.

The device is declared a GPU in-process (CI has none); the fake runs the real worker
on the CPU and prints the real H200 CSV. Real ncu runs happen on the lent GPU machine.
"""
import json
from pathlib import Path

import pytest

from app.kernel.cli import main
from app.analysis.devices import match_device
from app.analysis.kernel_metrics import kernel_table, stage_table
from app.report.plots import roofline_png
from app.runtime import device as devmod
from app.runtime.profiling.parsers.ncu_csv import parse_raw
from tests.conftest import FIXTURES

FAKE = Path(__file__).parent / "fake_tools" / "ncu"
ARGS = ["join", "--points", "3000", "--polygons", "300", "--prof_type", "annotation", "--ncu", str(FAKE)]
pytestmark = pytest.mark.skipif(not (FIXTURES / "ncu").exists(), reason="fixtures missing")


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    sel = devmod.Selection("auto", "gpu", "gpu", "declared by the test", "NVIDIA H200", {"name": "NVIDIA H200"})
    monkeypatch.setattr("app.runtime.profiling.session.devmod.select", lambda requested: sel)
    monkeypatch.setenv("APP_FIXTURES", str(FIXTURES))


def test_annotation_profile_from_replayed_capture(tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*ARGS, "--out", str(out)]) == 0
    (d,) = list(out.glob("profiles/annotation/join/*/*"))
    names = {p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()}
    assert {"report.md", "trace.json", "params.json", "kernels.csv", "stages.csv", "ncu_raw.csv"} <= names
    trace = json.loads((d / "trace.json").read_text())
    by = {s["name"]: s for s in trace["stages"]}
    # The capture's axpy range became bounds: 2 saxpy kernels; sort became morton_sort (cub kernels).
    assert by["bounds"]["metadata"]["kernels"] == 2
    assert by["morton_sort"]["metadata"]["kernels"] > 2
    raw, _ = parse_raw((FIXTURES / "ncu" / "raw_metrics_stdout.csv").read_text())
    unstaged = raw["nvtx_stack"].map(len) == 0
    assert trace["metadata"]["kernels_outside_stages"] == int(unstaged.sum())   # RNG kernels, no range
    saxpy_ns = raw.loc[raw["kernel"] == "saxpy", "duration_ns"].sum()
    assert by["bounds"]["elapsed_seconds"] == pytest.approx(saxpy_ns / 1e9)
    assert by["bounds"]["rows_in"] == 3300                     # rows from the real worker
    report = (d / "report.md").read_text()
    for heading in ("## Stages", "**Bottleneck:**", "## Top 3 Opportunities", "## Kernels",
                    "DRAM bytes: measured vs cost model"):
        assert heading in report
    err = capsys.readouterr().err
    assert '==PROF== Profiling "saxpy"' in err                  # progress reached the user


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


def test_measured_metrics_and_roofline_plot_from_capture():
    raw, _ = parse_raw((FIXTURES / "ncu" / "raw_metrics_stdout.csv").read_text())
    raw["nvtx_stack"] = raw["nvtx_stack"].map(lambda st: [("join", "bounds")] if st and st[0][1] == "stage:axpy"
                                              else st)
    kernels = kernel_table(raw, "join", ["bounds"], "NVIDIA H200")
    saxpy = kernels[kernels["kernel"] == "saxpy"].iloc[0]
    # saxpy: 2 flops per element as one FFMA; DRAM bytes are read + write. This capture measured DFMA
    # but not DADD/DMUL, so fp64 FLOPs are unknown: missing (NaN), never a zero nobody measured.
    row = raw[raw["kernel"] == "saxpy"].iloc[0]
    assert saxpy["dram_bytes"] == row["dram_read_bytes"] + row["dram_write_bytes"]
    assert saxpy["achieved_gbps"] == pytest.approx(saxpy["dram_bytes"] / (row["duration_ns"] / 1e9) / 1e9)
    assert saxpy["fp32_flops"] == 2 * row["ffma"] and saxpy["fp64_flops"] != saxpy["fp64_flops"]
    assert "dadd" not in raw and row["dfma"] == 0
    assert saxpy["bottleneck"].startswith("memory-bound") or saxpy["dram_pct"] < 60
    stages = stage_table(kernels, ["bounds"])
    assert stages.iloc[0]["kernels"] == 2
    png = roofline_png(kernels, match_device("NVIDIA H200")[1], "capture")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
