"""The Configuration cell and the throttle note every report shows for params.json's clocks."""
from app.report.clock_text import clock_cell, throttle_note
from tests.fake_smi import UUID


def snap(sm, mem=3201, reasons=(), **extra):
    throttled = any(r in ("sw_power_cap", "hw_slowdown") for r in reasons)
    return {"available": True, "source": "nvml", "uuid": UUID, "sm_mhz": sm, "mem_mhz": mem, "app_sm_mhz": 1980,
            "app_mem_mhz": 3201, "max_sm_mhz": 1980, "max_mem_mhz": 3201, "reasons": list(reasons),
            "throttled": throttled} | extra


STATE = {"uuid": UUID, "locked_sm_mhz": 1755, "locked_mem_mhz": 3201}


def test_not_locked_with_the_clocks_seen():
    clocks = {"locked": False, "reason": "no-lock", "start": snap(345, reasons=["gpu_idle"]), "end": snap(1980)}
    assert clock_cell(clocks) == "not locked; SM 345→1,980 MHz, mem 3,201 MHz, no throttling (other reasons: gpu_idle)"
    assert throttle_note(clocks) == ""


def test_locked_names_the_gpu():
    clocks = {"locked": True, "reason": "locked", "uuid": UUID, "state": STATE,
              "start": snap(1755, reasons=["applications_clocks_setting"]), "end": snap(1755)}
    assert clock_cell(clocks).startswith("locked at 1,755 MHz SM / 3,201 MHz mem (GPU-1904f39e… matches); "
                                         "SM 1,755 MHz, mem 3,201 MHz, no throttling")


def test_samples_range_and_throttling():
    samples = {"n": 250, "sm_mhz": {"min": 1410, "median": 1980, "max": 1980},
               "mem_mhz": {"min": 3201, "median": 3201, "max": 3201},
               "reasons_seen": ["sw_power_cap"], "throttled_samples": 12}
    clocks = {"locked": False, "reason": "no-lock", "start": snap(1980), "end": snap(1980), "samples": samples}
    cell = clock_cell(clocks)
    assert "SM 1,980 MHz (timed runs 1,410–1,980, median 1,980; 250 readings)" in cell
    assert cell.endswith("THROTTLED (sw_power_cap)")
    note = throttle_note(clocks)
    assert "sw_power_cap in 12 of 250 samples taken between the timed runs" in note


def test_unreadable_values_are_named_not_invented():
    clocks = {"locked": False, "reason": "no-lock", "start": snap(1980, mem=None), "end": {"available": False,
                                                                                           "why": "gone"}}
    cell = clock_cell(clocks)
    assert "mem n/a (mem_mhz unreadable) MHz" in cell and "end clocks n/a (unreadable)" in cell
    assert clock_cell({"locked": False, "reason": "no-lock",
                       "start": {"available": False, "why": "nvidia-smi not found"}}) == \
        "not locked; clocks n/a (nvidia-smi not found)"
    assert clock_cell(None) == "n/a (no clock record)"


def test_reasons_for_not_locked():
    base = {"locked": False, "start": snap(345)}
    assert clock_cell(base | {"reason": "sm-mismatch"}).startswith(
        "not locked (the SM clock no longer matches the recorded lock); SM 345 MHz")
    assert clock_cell(base | {"reason": "other-gpu", "state": {"uuid": "GPU-00000000-1111-2222-3333-444444444444"}}
                      ).startswith("not locked (the lock file is for GPU-00000000…)")
