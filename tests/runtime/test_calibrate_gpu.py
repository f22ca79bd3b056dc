"""`calibrate` on a real GPU: sustained peaks below the datasheet's and plausibly close to them, cached, and
used (and named) by the next profile's roofline."""
import json

import pytest

from app.analysis.devices import match_device
from app.kernel.cli import main

pytestmark = pytest.mark.gpu


def test_calibrate_measures_caches_and_is_used(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("APP_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["calibrate", "--json"]) == 0
    cal = json.loads(capsys.readouterr().out)
    _, spec = match_device(cal["name"])
    assert 0.5 < cal["memory_gbps"] / spec["memory_gbps"] < 1.02
    assert 0.5 < cal["fp64_tflops"] / spec["peak_tflops"]["fp64"] < 1.05
    assert 0.5 < cal["fp32_tflops"] / spec["peak_tflops"]["fp32"] < 1.05
    assert main(["join", "--points", "20000", "--polygons", "2000", "--out", str(tmp_path / "out")]) == 0
    (d,) = list((tmp_path / "out").glob("profiles/event/join/*/*"))
    assert json.loads((d / "trace.json").read_text())["roofline"]["peak_gbps"] == pytest.approx(cal["memory_gbps"])
    assert "calibrated on this GPU" in (d / "report.md").read_text()
