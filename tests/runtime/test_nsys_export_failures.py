"""nsys mode when its own `nsys export` fails quietly (exit 0 without a file, or a damaged file), with the fake
nsys replaying this project's H200 capture (tests/fixtures/nsys): one line saying what the export did, no
temporary path and no advice meant for the `timeline` command, nothing written."""
import tempfile
from pathlib import Path

import pytest

from app.kernel.cli import main
from app.runtime import device as devmod

FAKE = Path(__file__).parent / "fake_tools" / "nsys"
FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nsys"


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    sel = devmod.Selection("auto", "gpu", "gpu", "declared by the test", "NVIDIA H200", {"name": "NVIDIA H200"})
    monkeypatch.setattr("app.runtime.profiling.session.devmod.select", lambda requested: sel)
    monkeypatch.setenv("FAKE_NSYS_SQLITE", str(FIX / "join.sqlite"))


@pytest.mark.parametrize("mode,fragment", [
    ("export-nothing", "nsys export wrote no SQLite file (it exited 0 and printed nothing)"),
    ("export-damaged", "nsys export wrote an SQLite file this tool cannot read: it is not an SQLite database"),
])
def test_a_quiet_export_failure_is_one_line_about_the_export(tmp_path, capsys, monkeypatch, mode, fragment):
    monkeypatch.setenv("FAKE_NSYS_MODE", mode)
    out = tmp_path / "out"
    assert main(["join", "--points", "2000", "--polygons", "200", "--prof_type", "nsys", "--bench_runs", "2",
                 "--nsys", str(FAKE), "--out", str(out)]) == 8
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and err[0].startswith("error: " + fragment), err
    assert tempfile.gettempdir() + "/app-" not in err[0]          # no temporary path
    assert "pass an nsys capture" not in err[0] and "make one with" not in err[0]
    assert "--nsys PATH" in err[0]
    assert not out.exists()
