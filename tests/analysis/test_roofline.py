import pytest

from app.analysis import advice
from app.analysis.devices import load_devices, match_device, ridge_points
from app.analysis.roofline import plan_roofline, roofline_point
from app.runtime.stats import spread


@pytest.mark.parametrize("cuda_name,key", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H200", "H200"),
    ("NVIDIA H100 NVL", "H100 NVL"), ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"), ("NVIDIA L40S", "L40S"), ("NVIDIA GeForce RTX 4090", "RTX 4090"),
])
def test_devices_match_on_cuda_name(cuda_name, key):
    got, spec = match_device(cuda_name)
    assert got == key
    assert spec["peak_tflops"]["fp64"] > 0 and spec["memory_gbps"] > 0 and spec["sm_count"] > 0
    assert spec["sources"]["default"]


def test_every_device_has_the_required_fields_once():
    table = load_devices()
    for key, spec in table["devices"].items():
        for field in ("match", "sm_count", "l2_bytes", "base_clock_mhz", "boost_clock_mhz", "memory_gbps",
                      "peak_tflops"):
            assert field in spec, (key, field)
        assert {"fp64", "fp32"} <= set(spec["peak_tflops"]), key


def test_ridge_point_is_peak_flops_over_peak_bandwidth():
    _, spec = match_device("NVIDIA H200")
    assert ridge_points(spec)["fp64"] == pytest.approx(34.0e12 / 4800e9)


def test_roofline_point_memory_bound_stage():
    _, spec = match_device("NVIDIA H100 80GB HBM3")
    p = roofline_point(bytes_=3.35e12, flops=0.0, seconds=2.0, spec=spec)
    assert p["achieved_gbps"] == pytest.approx(1675.0)
    assert p["dram_pct"] == pytest.approx(50.0)
    assert p["pct_of_roofline"] == pytest.approx(50.0) and p["bound_by"] == "memory"


def test_unknown_device_and_cpu_say_why():
    assert "not in conf/devices.json" in plan_roofline("NVIDIA Quadro X", "gpu", [])["why"]
    assert "CPU" in plan_roofline("Xeon", "cpu", [])["why"]


@pytest.mark.parametrize("dram,comp,expected", [(75, 10, "memory-bound"), (10, 80, "compute-bound"),
                                                (10, 10, "latency-bound"), (None, None, "n/a")])
def test_bottleneck_classes_follow_seed_004(dram, comp, expected):
    assert advice.classify(dram, comp) == expected


def test_spread_flags_instability():
    assert spread([1.0] * 6)["stable"] is True
    s = spread([1.0, 1.1, 0.9] * 2)
    assert s["stable"] is False and s["rel_stdev"] == pytest.approx(0.0894, rel=0.01)     # stdev / median
    assert spread([1.0])["stable"] is None and spread([1.0, 1.1, 0.9])["stable"] is None   # too few to judge
