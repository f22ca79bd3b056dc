"""Clocks are "locked" only when the lock script's state file names this GPU (by UUID) and
the GPU's clocks, read now, match what the script set. The file is input like any other."""
import json
import subprocess
from pathlib import Path

import pytest

from app.report.clock_text import clock_cell, throttle_note
from app.runtime.clocks import STATE_FIELDS, TOLERANCE_MHZ, clock_report, read_state
from tests import fake_smi
from tests.fake_smi import UUID

ROOT = Path(__file__).resolve().parents[2]
OTHER = "GPU-00000000-1111-2222-3333-444444444444"
GOOD = {"gpu": 0, "uuid": UUID, "name": "NVIDIA H100 80GB HBM3", "locked_sm_mhz": 1755, "readback_sm_mhz": 1755,
        "locked_mem_mhz": 2619, "readback_mem_mhz": 2619, "max_sm_mhz": 1980, "max_mem_mhz": 2619,
        "locked_at": "2026-11-26T07:00:00Z", "by": "scripts/lock-gpu-clock.sh"}
OLD = {k: GOOD[k] for k in ("gpu", "name", "locked_sm_mhz", "readback_sm_mhz", "max_sm_mhz", "locked_at", "by")}


@pytest.fixture
def smi(tmp_path, monkeypatch):
    """A fake nvidia-smi as the only clock source (a real NVML must not answer these tests)."""
    fake_smi.use(tmp_path, monkeypatch)
    fake = tmp_path / "bin" / "nvidia-smi"
    monkeypatch.setenv("APP_CLOCK_STATE", str(tmp_path / "clock.json"))
    for var in ("FAKE_SMI_SM", "FAKE_SMI_MEM", "FAKE_SMI_REASONS", "FAKE_SMI_FAIL", "FAKE_SMI_UUID"):
        monkeypatch.delenv(var, raising=False)
    return {"fake": fake, "state": tmp_path / "clock.json", "tmp": tmp_path}


def write_state(smi, **changes):
    """The state file as the script writes it, and the fake GPU's clocks locked to match."""
    smi["state"].write_text(json.dumps(GOOD | changes))
    (smi["tmp"] / "smi.log.locked").write_text("1755")
    (smi["tmp"] / "smi.log.memlocked").write_text("2619")


def test_what_the_lock_script_really_writes_is_accepted_and_locked(smi, monkeypatch):
    """Run the real script against the fake nvidia-smi, then the profiler's decision."""
    r = subprocess.run(["bash", str(ROOT / "scripts" / "lock-gpu-clock.sh")], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "NVIDIA_SMI": str(smi["fake"]),
                            "FAKE_SMI_LOG": str(smi["tmp"] / "smi.log"), "APP_CLOCK_STATE": str(smi["state"])})
    assert r.returncode == 0, r.stderr
    got, why = read_state(str(smi["state"]), UUID)
    assert why is None and got["locked_sm_mhz"] == 1755 and got["locked_mem_mhz"] == 2619 and got["uuid"] == UUID
    report = clock_report("gpu", UUID, end=None)
    assert report["locked"] is True and report["reason"] == "locked", report["detail"]
    assert report["state"] == got and report["start"]["sm_mhz"] == 1755


def test_matching_uuid_and_clocks_is_locked(smi, capsys):
    write_state(smi)
    report = clock_report("gpu", UUID, end=None)
    assert report["locked"] is True
    assert "1755 MHz SM / 2619 MHz memory" in report["detail"] and UUID in report["detail"]
    assert set(report) >= {"locked", "reason", "detail", "uuid", "state", "start"}
    assert capsys.readouterr().err == ""
    cell = clock_cell(report)
    assert cell.startswith("locked at 1,755 MHz SM / 2,619 MHz mem (GPU-1904f39e… matches); SM 1,755 MHz")
    assert "no throttling" in cell


def test_within_tolerance_is_still_locked(smi, monkeypatch):
    write_state(smi)
    monkeypatch.setenv("FAKE_SMI_SM", str(1755 - TOLERANCE_MHZ))
    assert clock_report("gpu", UUID)["locked"] is True


def test_sm_lock_alone_is_locked_when_memory_was_not_locked(smi, monkeypatch):
    write_state(smi, locked_mem_mhz=None)
    monkeypatch.setenv("FAKE_SMI_MEM", "1593")                  # anything: the script did not lock it
    report = clock_report("gpu", UUID)
    assert report["locked"] is True and "memory clock not locked" in report["detail"]
    assert "(mem not locked)" in clock_cell(report)


@pytest.mark.parametrize("changes, env, uuid, reason, fragment", [
    ({"uuid": OTHER}, {}, UUID, "other-gpu", f"records a lock of {OTHER}"),
    ({}, {"FAKE_SMI_SM": "345"}, UUID, "sm-mismatch", "SM clock lock at 1755 MHz"),        # stale: reset since
    ({}, {"FAKE_SMI_SM": "1739"}, UUID, "sm-mismatch", "reads 1739 MHz at start"),         # just past tolerance
    ({}, {"FAKE_SMI_MEM": "1593"}, UUID, "mem-mismatch", "memory clock lock at 2619 MHz"),
    ({}, {"FAKE_SMI_SM": "[N/A]"}, UUID, "clocks-unreadable", "sm_mhz unreadable"),
    ({}, {"FAKE_SMI_FAIL": "--format=csv,noheader,nounits"}, UUID, "clocks-unreadable", "could not be read"),
    ({}, {"FAKE_SMI_UUID": "[N/A]"}, None, "uuid-unknown", "UUID could not be read"),
])
def test_anything_else_is_not_locked_with_the_reason(smi, monkeypatch, capsys, changes, env, uuid, reason, fragment):
    write_state(smi, **changes)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    report = clock_report("gpu", uuid)
    assert report["locked"] is False and report["reason"] == reason
    assert fragment in report["detail"], report["detail"]
    assert report["state"]["uuid"] == changes.get("uuid", UUID)        # the validated state is kept as evidence
    assert capsys.readouterr().err.startswith("warning: not locked")
    assert clock_cell(report).startswith("not locked (")


def test_clocks_that_change_by_the_end_are_not_locked(smi):
    write_state(smi)
    start = clock_report("gpu", UUID)["start"]
    end = dict(start, sm_mhz=1395, reasons=["sw_power_cap"], throttled=True)
    report = clock_report("gpu", UUID, start=start, end=end)
    assert report["locked"] is False and report["reason"] == "sm-mismatch"
    assert "reads 1395 MHz at end (clock-event reasons: sw_power_cap)" in report["detail"]
    assert "THROTTLED (sw_power_cap)" in clock_cell(report)
    assert "sw_power_cap at the end" in throttle_note(report)


def test_no_file_means_not_locked_without_a_warning(smi, capsys, monkeypatch):
    report = clock_report("gpu", UUID)
    assert report["locked"] is False and report["reason"] == "no-lock" and "state" not in report
    assert capsys.readouterr().err == ""
    assert clock_cell(report) == "not locked; SM 345 MHz, mem 2,619 MHz, no throttling (other reasons: gpu_idle)"


def test_cpu_runs_have_no_clocks(smi):
    report = clock_report("cpu")
    assert report == {"locked": False, "reason": "cpu", "detail": "CPU run: GPU clocks do not apply"}
    assert clock_cell(report) == "n/a (CPU run)" and throttle_note(report) == ""


def test_no_clock_source_is_said_not_invented(smi, monkeypatch, tmp_path):
    monkeypatch.setenv("NVIDIA_SMI", str(tmp_path / "missing"))
    write_state(smi)
    report = clock_report("gpu", UUID)
    assert report["locked"] is False and report["reason"] == "clocks-unreadable"
    assert report["start"] == {"available": False, "why": report["start"]["why"]}
    assert "nvidia-smi not found" in report["start"]["why"]
    assert "clocks n/a (nvidia-smi: nvidia-smi not found" in clock_cell(report)


@pytest.mark.parametrize("doc,why", [
    ("not json", "unreadable"),
    (json.dumps({"locked": True}), "not the lock script's format"),
    (json.dumps(GOOD | {"extra": 1}), "not the lock script's format"),
    (json.dumps(OLD), "did not record the GPU's UUID"),
    (json.dumps(GOOD | {"locked_sm_mhz": "1755"}), "field 'locked_sm_mhz' has the wrong type"),
    (json.dumps(GOOD | {"locked_mem_mhz": 2619.0}), "field 'locked_mem_mhz' has the wrong type"),
    (json.dumps(GOOD | {"gpu": True}), "field 'gpu' has the wrong type"),
    (json.dumps(GOOD | {"uuid": None}), "field 'uuid' has the wrong type"),
    (json.dumps(GOOD | {"by": "me"}), "not written by scripts/lock-gpu-clock.sh"),
    (json.dumps(GOOD | {"locked_sm_mhz": 0}), "not written by scripts/lock-gpu-clock.sh"),
    (json.dumps(GOOD | {"locked_mem_mhz": -1}), "not written by scripts/lock-gpu-clock.sh"),
    (json.dumps(GOOD | {"uuid": "GPU-0"}), "field 'uuid' is not a GPU UUID"),
    (json.dumps(GOOD | {"uuid": OTHER}), f"it records GPU {OTHER}"),
])
def test_a_malformed_file_is_ignored_with_a_reason(tmp_path, doc, why):
    p = tmp_path / "clock.json"
    p.write_text(doc)
    state, reason = read_state(str(p), UUID)
    assert state is None and why in reason


def test_state_fields_are_what_the_script_writes():
    text = (ROOT / "scripts" / "lock-gpu-clock.sh").read_text()
    for field in STATE_FIELDS:
        assert f'"{field}":' in text


def test_an_ignored_file_is_reported_as_not_locked_with_a_warning(smi, capsys):
    smi["state"].write_text(json.dumps({"locked": True, "by": "anyone"}))
    report = clock_report("gpu", UUID)
    assert report["locked"] is False and "was ignored (not the lock script's format)" in report["detail"]
    assert capsys.readouterr().err.startswith("warning: not locked as far as this tool can tell")
    assert clock_cell(report).startswith("not locked (lock file ignored); SM 345 MHz")
