"""Clock snapshots: nvidia-smi's CSV (through a fake executable) and NVML (a tiny fake module,
for the decoding only), the reasons bitmask, the sampler's summary, and real NVML on a GPU."""
import json
import sys
import threading
import time
import types

import pytest

from app.report.clock_text import clock_cell, throttle_note
from app.runtime import gpu_clocks
from app.runtime.gpu_clocks import ClockSampler, decode_reasons, parse_smi_line, snapshot, summarise_samples
from tests import fake_smi
from tests.fake_smi import UUID


@pytest.fixture
def smi(tmp_path, monkeypatch):
    return fake_smi.use(tmp_path, monkeypatch)


@pytest.mark.parametrize("mask, names, throttled", [
    (0x0, [], False),
    (0x1, ["gpu_idle"], False),
    (0x2, ["applications_clocks_setting"], False),
    (0x4, ["sw_power_cap"], True),
    (0x8 | 0x40, ["hw_slowdown", "hw_thermal_slowdown"], True),
    (0x20, ["sw_thermal_slowdown"], True),
    (0x80, ["hw_power_brake_slowdown"], True),
    (0x10 | 0x100, ["sync_boost", "display_clock_setting"], False),
    (0x1 | 0x1000, ["gpu_idle", "unknown_0x1000"], False),
    (None, None, None),
    (-1, None, None),                                   # not a real mask: unreadable, never every reason
    (1.5, None, None),
])
def test_reasons_bitmask(mask, names, throttled):
    assert decode_reasons(mask) == (names, throttled)


def test_snapshot_from_nvidia_smi(smi, monkeypatch):
    monkeypatch.setenv("FAKE_SMI_SM", "1980")
    monkeypatch.setenv("FAKE_SMI_MEM", "3201")
    monkeypatch.setenv("FAKE_SMI_REASONS", "0x0000000000000004")
    snap = snapshot(UUID)
    assert snap["available"] is True and snap["source"] == "nvidia-smi" and snap["uuid"] == UUID
    assert (snap["sm_mhz"], snap["mem_mhz"], snap["app_sm_mhz"], snap["app_mem_mhz"],
            snap["max_sm_mhz"], snap["max_mem_mhz"]) == (1980, 3201, 1755, 2619, 1980, 2619)
    assert snap["reasons"] == ["sw_power_cap"] and snap["throttled"] is True and snap["reasons_mask"] == "0x4"
    assert snap["name"] == "NVIDIA H100 80GB HBM3" and "unreadable" not in snap
    call = json.loads(smi.read_text().splitlines()[-1])
    assert call[:2] == ["-i", UUID]                       # the GPU by UUID, not by index
    assert call[-1] == "--format=csv,noheader,nounits"
    assert "clocks_event_reasons.active" in call[2]


def test_older_drivers_name_the_reasons_field_differently(smi, monkeypatch):
    monkeypatch.setenv("FAKE_SMI_OLD_DRIVER", "1")
    snap = snapshot(UUID)
    assert snap["available"] and snap["reasons"] == ["gpu_idle"]
    calls = [json.loads(line) for line in smi.read_text().splitlines()]
    assert calls[0][:2] == ["-i", UUID] and "clocks_throttle_reasons.active" in calls[-1][2]


def test_without_a_uuid_no_gpu_is_read_by_index(smi, monkeypatch, tmp_path):
    from app.runtime.clocks import clock_report
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("APP_CLOCK_STATE", str(tmp_path / "clock.json"))
    snap = snapshot(None)
    assert snap["available"] is False and "UUID is unknown" in snap["why"]
    report = clock_report("gpu", None)
    assert report["locked"] is None and report["start"]["available"] is False
    assert "UUID is unknown" in report["detail"], report["detail"]
    assert not smi.exists() or smi.read_text() == ""            # nvidia-smi -i 0 was never asked
    nv = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.setenv("APP_GPU_CLOCKS", "nvml")
    assert snapshot(None)["available"] is False and ("index", 0) not in nv.calls


def test_unreadable_fields_are_none_never_zero(smi, monkeypatch):
    monkeypatch.setenv("FAKE_SMI_MEM", "[N/A]")
    monkeypatch.setenv("FAKE_SMI_APP", "[Not Supported]")
    monkeypatch.setenv("FAKE_SMI_REASONS", "[N/A]")
    snap = snapshot(UUID)
    assert snap["mem_mhz"] is None and snap["app_sm_mhz"] is None and snap["reasons"] is None
    assert snap["throttled"] is None
    assert snap["unreadable"] == ["mem_mhz", "app_sm_mhz", "reasons"]
    cell = clock_cell({"locked": False, "reason": "no-lock", "start": snap})
    assert "mem n/a (mem_mhz unreadable) MHz" in cell and "throttling n/a (reasons unreadable)" in cell


@pytest.mark.parametrize("value", ["inf", "1e999", "-inf", "nan", "garbage"])
def test_absurd_numbers_are_unreadable_never_a_crash(smi, monkeypatch, value):
    monkeypatch.setenv("FAKE_SMI_SM", value)
    monkeypatch.setenv("FAKE_SMI_MAX", value)
    snap = snapshot(UUID)
    assert snap["available"] and snap["sm_mhz"] is None and snap["max_sm_mhz"] is None
    assert snap["unreadable"] == ["sm_mhz", "max_sm_mhz"]


@pytest.mark.parametrize("value", ["-1", "-0x1", "1.5", "0x1.8"])
def test_a_negative_or_non_integer_reason_mask_is_unreadable(smi, monkeypatch, value):
    monkeypatch.setenv("FAKE_SMI_REASONS", value)
    snap = snapshot(UUID)
    assert snap["reasons"] is None and snap["reasons_mask"] is None and snap["throttled"] is None
    assert snap["unreadable"] == ["reasons"]


def test_failing_or_missing_nvidia_smi_is_unavailable(smi, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_SMI_FAIL", "--format=csv,noheader,nounits")
    snap = snapshot(UUID)
    assert snap["available"] is False and "Insufficient Permissions" in snap["why"]
    monkeypatch.setenv("NVIDIA_SMI", str(tmp_path / "none"))
    assert "nvidia-smi not found" in snapshot(UUID)["why"]


def test_a_hanging_nvidia_smi_is_bounded(smi, monkeypatch, tmp_path):
    hang = tmp_path / "hang"
    hang.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(30)\n")
    hang.chmod(0o755)
    monkeypatch.setenv("NVIDIA_SMI", str(hang))
    monkeypatch.setattr(gpu_clocks, "SMI_TIMEOUT_S", 1)
    assert "did not answer within 1 s" in snapshot(UUID)["why"]


def test_name_with_a_comma_is_kept_whole():
    uuid, values, mask, name = parse_smi_line(f"{UUID}, 1980, 3201, 1980, 3201, 1980, 3201, 0x0, NVIDIA H200, NVL")
    assert uuid == UUID and values["sm_mhz"] == 1980 and mask == 0 and name == "NVIDIA H200, NVL"


def fake_pynvml(mask=0, unsupported=()):
    """Just enough of pynvml for the decoding: the real-GPU probe's values (H200, driver 580)."""
    class NVMLError(Exception):
        pass

    def clock(table):
        def get(handle, kind):
            if (table, kind) in unsupported:
                raise NVMLError("Not Supported")
            return {"cur": {0: 1980, 1: 3201}, "app": {0: 1980, 1: 3201}, "max": {0: 1980, 1: 3201}}[table][kind]
        return get

    calls = []
    return types.SimpleNamespace(
        NVMLError=NVMLError, NVML_CLOCK_SM=0, NVML_CLOCK_MEM=1, calls=calls,
        nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetHandleByUUID=lambda u: calls.append(("uuid", u)) or "h",
        nvmlDeviceGetHandleByIndex=lambda i: calls.append(("index", i)) or "h",
        nvmlDeviceGetClockInfo=clock("cur"), nvmlDeviceGetApplicationsClock=clock("app"),
        nvmlDeviceGetMaxClockInfo=clock("max"),
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: mask,
        nvmlDeviceGetUUID=lambda h: UUID.encode(), nvmlDeviceGetName=lambda h: "NVIDIA H200",
    )


def test_snapshot_from_nvml_decoding(monkeypatch):
    nv = fake_pynvml(mask=0x1 | 0x20, unsupported={("app", 1)})
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.setenv("APP_GPU_CLOCKS", "nvml")
    snap = snapshot(UUID)
    assert snap["source"] == "nvml" and snap["uuid"] == UUID and snap["name"] == "NVIDIA H200"
    assert (snap["sm_mhz"], snap["mem_mhz"], snap["app_sm_mhz"], snap["max_sm_mhz"]) == (1980, 3201, 1980, 1980)
    assert snap["app_mem_mhz"] is None and snap["unreadable"] == ["app_mem_mhz"]     # not supported: not zero
    assert snap["reasons"] == ["gpu_idle", "sw_thermal_slowdown"] and snap["throttled"] is True
    assert nv.calls[0] == "init" and ("uuid", UUID) in nv.calls and nv.calls[-1] == "shutdown"


def test_a_negative_nvml_reason_mask_is_unreadable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(mask=-1))
    monkeypatch.setenv("APP_GPU_CLOCKS", "nvml")
    snap = snapshot(UUID)
    assert snap["reasons"] is None and snap["reasons_mask"] is None and "reasons" in snap["unreadable"]


def test_nvml_missing_falls_back_to_nvidia_smi(smi, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)          # import pynvml -> ImportError
    monkeypatch.delenv("APP_GPU_CLOCKS")
    snap = snapshot(UUID)
    assert snap["available"] and snap["source"] == "nvidia-smi"


def test_sampler_with_fake_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(mask=0x4))
    monkeypatch.delenv("APP_GPU_CLOCKS", raising=False)
    with ClockSampler(UUID, interval_s=0.001, max_samples=16) as sampler:
        for _ in range(100):                                # the timed runs' loop: a poll before each run
            time.sleep(0.002)
            sampler.poll()
    s = sampler.summary()
    assert 2 <= s["n"] <= 16                                # bounded: halved and slowed when full
    assert s["interval_ms"] > 1 and "never during one" in s["when"]
    assert s["sm_mhz"]["min"] == s["sm_mhz"]["max"] == 1980 and s["mem_mhz"]["median"] == 3201
    assert s["reasons_seen"] == ["sw_power_cap"] and s["throttled_samples"] == s["n"]
    clocks = {"locked": False, "reason": "no-lock", "samples": s,
              "start": snapshot(UUID) | {"reasons": [], "throttled": False}}
    assert "THROTTLED (sw_power_cap)" in clock_cell(clocks)
    assert f"sw_power_cap in {s['n']} of {s['n']} samples" in throttle_note(clocks)


def test_sampler_reads_only_when_polled_and_at_most_once_an_interval(monkeypatch):
    """No thread reads NVML beside the timed runs (one slowed the default join by ~3% on an H100): a sample is
    taken at start, at a poll once the interval has passed, and at stop -- nowhere else."""
    nv = fake_pynvml(mask=0)
    reads, clock = [], nv.nvmlDeviceGetClockInfo
    nv.nvmlDeviceGetClockInfo = lambda handle, kind: reads.append(kind) or clock(handle, kind)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.delenv("APP_GPU_CLOCKS", raising=False)
    threads = threading.active_count()
    with ClockSampler(UUID, interval_s=60.0) as sampler:
        assert threading.active_count() == threads
        assert len(sampler.samples) == 1 and len(reads) == 2     # the first sample (SM, memory), at start
        time.sleep(0.05)
        assert len(reads) == 2                              # nothing read while the "run" went on
        for _ in range(5):
            sampler.poll()                                  # within the interval: no sample
        assert len(sampler.samples) == 1 and len(reads) == 2
        sampler.interval_s = 0.0
        sampler.poll()
        assert len(sampler.samples) == 2 and len(reads) == 4
    assert sampler.summary()["n"] == 3 and len(reads) == 6  # and the last, at stop


def test_sampler_without_nvml_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.delenv("APP_GPU_CLOCKS", raising=False)
    with ClockSampler(UUID) as sampler:
        pass
    s = sampler.summary()
    assert s["n"] == 0 and "pynvml is not installed" in s["why"]


def test_sample_summary():
    s = summarise_samples([(1980, 3201, 0), (1755, 3201, 0x4), (None, 3201, None)], 0.02, 0.06)
    assert s["n"] == 3 and s["sm_mhz"] == {"min": 1755, "median": 1867.5, "max": 1980, "unread": 1}
    assert s["reasons_seen"] == ["sw_power_cap"] and s["throttled_samples"] == 1 and s["reasons_unread"] == 1


@pytest.mark.gpu
def test_real_gpu_clocks(monkeypatch):
    """On a GPU machine: NVML (nvidia-ml-py) answers with sane values for CUDA device 0."""
    from app.runtime.device import probe_gpu

    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed (pip install -e '.[nvml]')")
    monkeypatch.setenv("APP_GPU_CLOCKS", "nvml")
    _, _, info = probe_gpu()
    assert info.get("uuid"), f"no UUID from probe_gpu: clocks are not read without one ({info})"
    snap = snapshot(info["uuid"])
    assert snap["available"], snap
    assert snap["source"] == "nvml" and snap["uuid"].startswith("GPU-")
    assert snap["uuid"].lower() == info["uuid"].lower()
    assert 0 < snap["sm_mhz"] <= snap["max_sm_mhz"]
    assert 0 < snap["mem_mhz"] <= snap["max_mem_mhz"]
    assert isinstance(snap["reasons"], list) and isinstance(snap["throttled"], bool)
    with ClockSampler(snap["uuid"]) as sampler:
        for _ in range(8):
            time.sleep(0.03)
            sampler.poll()
    s = sampler.summary()
    assert s["n"] >= 3 and 0 < s["sm_mhz"]["min"] <= s["sm_mhz"]["max"] <= snap["max_sm_mhz"]
