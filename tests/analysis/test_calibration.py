"""Calibrated peaks: cached per GPU UUID, validated like any input, used by rooflines that say so."""
import json

import pytest

from app.analysis import calibration
from app.analysis.kernel_metrics import kernel_table
from app.analysis.roofline import plan_roofline
from app.kernel.cli import main
from app.runtime import device as devmod
from tests.analysis.test_kernel_sanity import raw_table

UUID = "GPU-1904f39e-c822-6777-12c4-cc5de708684c"
CAL = {"uuid": UUID, "name": "NVIDIA H200", "measured_at": "2026-11-26T09:00:00Z", "memory_gbps": 4000.0,
       "fp64_tflops": 33.0, "fp32_tflops": 60.0}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("APP_CACHE_DIR", str(tmp_path))
    return tmp_path / "calibration"


def test_calibrated_peaks_replace_the_datasheet_and_say_so():
    calibration.save(CAL)
    _, spec = calibration.spec_for("NVIDIA H200", UUID)
    assert spec["memory_gbps"] == 4000.0 and spec["peak_tflops"]["fp64"] == 33.0
    assert spec["datasheet"]["memory_gbps"] == 4800.0
    assert spec["peaks_source"].startswith("calibrated on this GPU") and "2026-11-26" in spec["peaks_source"]
    _, other = calibration.spec_for("NVIDIA H200", "GPU-00000000-0000-0000-0000-000000000000")
    assert other["memory_gbps"] == 4800.0 and other["peaks_source"] == "datasheet"


def test_a_roofline_uses_them():
    calibration.save(CAL)
    stages = [{"name": "s", "elapsed_seconds": 1e-3, "cost": {"kind": "dram", "bytes": 2e9, "flops": 0.0}}]
    roof = plan_roofline("NVIDIA H200", "gpu", stages, uuid=UUID)
    assert roof["peak_gbps"] == 4000.0 and roof["peaks_source"].startswith("calibrated")
    assert roof["stages"]["s"]["pct_of_roofline"] == pytest.approx(50.0)       # 2 GB at 4 TB/s = 0.5 ms of 1 ms
    assert plan_roofline("NVIDIA H200", "gpu", stages)["peak_gbps"] == 4800.0     # no UUID: the datasheet
    _, spec = calibration.spec_for("NVIDIA H200", UUID)
    k = kernel_table(raw_table(duration_ns=1e6, dram_read_bytes=1e9, dram_write_bytes=1e9), "join", ["bounds"],
                     "NVIDIA H200", spec).iloc[0]
    assert k["pct_of_roofline"] == pytest.approx(50.0)


@pytest.mark.parametrize("change,why", [
    ({"memory_gbps": -1.0}, "no valid 'memory_gbps'"),
    ({"fp64_tflops": float("nan")}, "no valid 'fp64_tflops'"),
    ({"uuid": "GPU-other"}, "records GPU-other"),
    # peaks no H200 has: ten times its datasheet's, or a fiftieth of it (a broken or shared run)
    ({"memory_gbps": 48000.0}, "its memory_gbps 48,000.0 is 10.00x the datasheet's 4,800.0, outside 0.2-1.05x"),
    ({"fp64_tflops": 340.0}, "its fp64_tflops 340.0 is 10.00x the datasheet's 34.0"),
    ({"memory_gbps": 1.0}, "its memory_gbps 1.0 is 0.00x the datasheet's 4,800.0"),
])
def test_a_bad_cache_file_is_ignored_with_the_reason(cache, change, why):
    path = calibration.save(CAL)
    path.write_text(json.dumps(CAL | change))
    cal, reason = calibration.load(UUID)
    assert cal is None and why in reason
    _, spec = calibration.spec_for("NVIDIA H200", UUID)
    assert spec["memory_gbps"] == 4800.0 and why in spec["peaks_source"]


def test_garbage_is_ignored(cache):
    cache.mkdir(parents=True)
    (cache / f"{UUID}.json").write_text("{not json")
    cal, reason = calibration.load(UUID)
    assert cal is None and "unreadable" in reason and calibration.cached() == []


def test_devices_lists_the_calibration_of_the_gpu_here(monkeypatch, capsys):
    calibration.save(CAL)
    monkeypatch.setattr(devmod, "probe_gpu", lambda: (True, "", {"name": "NVIDIA H200", "uuid": UUID}))
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "calibrated here" in out and "4,000.0" in out and "are used by its rooflines" in out
    assert main(["devices", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (h200,) = [r for r in doc["devices"] if r["present"]]
    assert h200["calibrated"]["memory_gbps"] == 4000.0


def test_calibrate_without_a_gpu_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(devmod, "probe_gpu", lambda: (False, "CUDA reports no devices", {}))
    assert main(["calibrate"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a usable one: CUDA reports no devices" in err[0]


def test_a_calibration_of_another_model_is_not_this_cards(cache):
    """A cache entry under this UUID that names another model (copied between machines, say) is not used."""
    calibration.save(CAL | {"name": "NVIDIA H100 80GB HBM3", "memory_gbps": 3000.0, "fp64_tflops": 30.0,
                            "fp32_tflops": 60.0})
    _, spec = calibration.spec_for("NVIDIA H200", UUID)
    assert spec["memory_gbps"] == 4800.0
    assert "it was measured on a NVIDIA H100 80GB HBM3, not a NVIDIA H200" in spec["peaks_source"]
