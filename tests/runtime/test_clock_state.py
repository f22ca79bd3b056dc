"""Clocks are "locked" only when the lock script's state file names this GPU (by UUID) and
the GPU's clocks, read now, match what the script set. The file is input like any other."""
import json
import subprocess
from pathlib import Path

import pytest

from app.report.clock_text import clock_cell, lock_word, throttle_note
from app.runtime.clocks import STATE_FIELDS, TOLERANCE_MHZ, clock_report, read_state, state_path_for
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
                            "FAKE_SMI_LOG": str(smi["tmp"] / "smi.log"), "APP_CLOCK_STATE": str(smi["state"]), "APP_LOCK_DIR": str(smi["tmp"])})
    assert r.returncode == 0, r.stderr
    assert not smi["state"].exists()                              # the record is this GPU's own file
    got, why = read_state(state_path_for(UUID), UUID)
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


def test_each_gpu_has_its_own_record_and_an_old_single_record_is_still_read(smi, monkeypatch):
    env = {"PATH": "/usr/bin:/bin", "NVIDIA_SMI": str(smi["fake"]), "FAKE_SMI_LOG": str(smi["tmp"] / "smi.log"),
           "APP_CLOCK_STATE": str(smi["state"]), "APP_LOCK_DIR": str(smi["tmp"])}
    lock = ["bash", str(ROOT / "scripts" / "lock-gpu-clock.sh")]
    assert subprocess.run(lock + ["--gpu", "0"], capture_output=True, env=env).returncode == 0
    assert subprocess.run(lock + ["--gpu", "1"], capture_output=True, env=env | {"FAKE_SMI_UUID": OTHER}).returncode == 0
    assert clock_report("gpu", UUID)["locked"] is True                 # GPU 1's lock did not erase GPU 0's
    assert clock_report("gpu", OTHER)["locked"] is True
    assert read_state(state_path_for(UUID), UUID)[0]["gpu"] == 0
    assert read_state(state_path_for(OTHER), OTHER)[0]["gpu"] == 1
    reset = ["bash", str(ROOT / "scripts" / "reset-gpu-clock.sh"), "--gpu", "1"]
    assert subprocess.run(reset, capture_output=True, env=env | {"FAKE_SMI_UUID": OTHER}).returncode == 0
    assert not (Path(state_path_for(OTHER))).exists() and Path(state_path_for(UUID)).exists()
    Path(state_path_for(UUID)).unlink()
    write_state(smi)                                                   # an older single-record file, for GPU 0
    assert clock_report("gpu", UUID)["locked"] is True
    report = clock_report("gpu", OTHER)
    assert report["locked"] is False and report["reason"] == "other-gpu"


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


@pytest.mark.parametrize("env, uuid, reason, fragment, cell", [
    ({"FAKE_SMI_SM": "[N/A]"}, UUID, "clocks-unreadable", "sm_mhz unreadable",
     "unknown (clocks unreadable: start: sm_mhz unreadable)"),
    ({"FAKE_SMI_SM": "garbage"}, UUID, "clocks-unreadable", "sm_mhz unreadable",
     "unknown (clocks unreadable: start: sm_mhz unreadable)"),
    ({"FAKE_SMI_FAIL": "--format=csv,noheader,nounits"}, UUID, "clocks-unreadable", "could not be read",
     "unknown (clocks unreadable: start: nvidia-smi: nvidia-smi failed"),
    ({"FAKE_SMI_UUID": "[N/A]"}, None, "uuid-unknown", "UUID could not be read",
     "unknown (this GPU's UUID is unreadable)"),
])
def test_an_unreadable_reading_is_unknown_never_not_locked(smi, monkeypatch, capsys, env, uuid, reason, fragment,
                                                           cell):
    from app.report.sections import device_section
    write_state(smi)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    report = clock_report("gpu", uuid)
    assert report["locked"] is None and report["reason"] == reason
    assert json.loads(json.dumps(report))["locked"] is None              # params.json: "locked": null
    assert fragment in report["detail"], report["detail"]
    assert capsys.readouterr().err.startswith("warning: lock unknown")
    assert clock_cell(report).startswith(cell), clock_cell(report)
    assert "not locked" not in clock_cell(report)
    trace = {"selected_runtime": "gpu", "requested_runtime": "gpu", "device": {},
             "metadata": {"planner_selected_runtime": "gpu", "selection_reason": "asked",
                          "nvtx": {"emitted": False, "ranges": 0, "domain": "app", "detail": "off"}}}
    row = next(r for r in device_section(trace, {"clocks": report}).rows if r[0] == "clocks locked")
    assert row[1].startswith("unknown (lock unknown: ")
    old = dict(report, locked=False)                     # a record written before "locked" could be null
    assert clock_cell(old).startswith(cell) and lock_word(old) == "unknown"


def test_clocks_that_change_by_the_end_are_not_locked(smi):
    write_state(smi)
    start = clock_report("gpu", UUID)["start"]
    end = dict(start, sm_mhz=1395, reasons=["sw_power_cap"], throttled=True)
    report = clock_report("gpu", UUID, start=start, end=end)
    assert report["locked"] is False and report["reason"] == "sm-mismatch"
    assert "reads 1395 MHz at end (clock-event reasons: sw_power_cap)" in report["detail"]
    assert "THROTTLED (sw_power_cap)" in clock_cell(report)
    assert "sw_power_cap at the end" in throttle_note(report)


def test_clocks_that_move_between_the_runs_are_not_locked(smi, capsys):
    write_state(smi)
    start = clock_report("gpu", UUID)["start"]
    samples = {"n": 40, "sm_mhz": {"min": 345, "median": 1755, "max": 1980, "unread": 0},
               "mem_mhz": {"min": 2619, "median": 2619, "max": 2619, "unread": 0}, "reasons_seen": ["gpu_idle"]}
    report = clock_report("gpu", UUID, start=start, end=dict(start), samples=samples)
    assert report["start"]["sm_mhz"] == report["end"]["sm_mhz"] == 1755
    assert report["locked"] is False and report["reason"] == "sm-moved"
    assert "clocks moved between runs: 345-1980 MHz SM" in report["detail"], report["detail"]
    assert clock_cell(report).startswith("not locked (the SM clock moved between the timed runs)")
    steady = dict(samples, sm_mhz={"min": 1755 - TOLERANCE_MHZ, "median": 1755, "max": 1755, "unread": 0})
    assert clock_report("gpu", UUID, start=start, end=dict(start), samples=steady)["locked"] is True


def test_no_file_means_not_locked_without_a_warning(smi, capsys, monkeypatch):
    report = clock_report("gpu", UUID)
    assert report["locked"] is False and report["reason"] == "no-lock" and "state" not in report
    assert capsys.readouterr().err == ""
    assert clock_cell(report) == "not locked; SM 345 MHz, mem 2,619 MHz, no throttling (other reasons: gpu_idle)"


@pytest.mark.parametrize("state", [None, json.dumps({"locked": True}), json.dumps(GOOD | {"uuid": OTHER})])
def test_clocks_the_gpu_reports_held_are_unknown_not_not_locked(smi, monkeypatch, capsys, state):
    if state:
        smi["state"].write_text(state)
    monkeypatch.setenv("FAKE_SMI_SM", "1410")
    monkeypatch.setenv("FAKE_SMI_REASONS", "0x0000000000000002")
    report = clock_report("gpu", UUID)
    assert report["locked"] is None and report["reason"] == "held-unrecorded"
    assert "not locked by this tool's scripts" in report["detail"]
    assert "held by an applications clocks setting" in report["detail"] and "1410 MHz" in report["detail"]
    assert capsys.readouterr().err.startswith("warning: lock unknown")
    assert clock_cell(report).startswith("unknown (not locked by this tool's scripts; the GPU reports its clocks "
                                         "held by an applications clocks setting (someone else's lock?)); SM 1,410")
    assert lock_word(report) == "unknown"


def test_a_lock_at_the_max_clock_cannot_be_confirmed(smi, monkeypatch, capsys):
    """lock-gpu-clock.sh --clock 1980 (the max), then someone's nvidia-smi -rgc: boosting reads like the lock."""
    env = {"PATH": "/usr/bin:/bin", "NVIDIA_SMI": str(smi["fake"]), "FAKE_SMI_LOG": str(smi["tmp"] / "smi.log"),
           "APP_CLOCK_STATE": str(smi["state"]), "APP_LOCK_DIR": str(smi["tmp"])}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "lock-gpu-clock.sh"), "--clock", "1980"], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0, r.stderr
    subprocess.run([str(smi["fake"]), "-rgc"], check=True, env=env)
    monkeypatch.setenv("FAKE_SMI_SM", "1980")                    # boosting to its max
    report = clock_report("gpu", UUID)
    assert report["locked"] is None and report["reason"] == "locked-unconfirmed"
    assert "a GPU whose lock was undone and that boosts to its max reads the same" in report["detail"]
    assert clock_cell(report).startswith(
        "locked (recorded; the reading is consistent but cannot confirm it at the max clock); SM 1,980 MHz")
    assert lock_word(report) == "unknown"


def test_cpu_runs_have_no_clocks(smi):
    report = clock_report("cpu")
    assert report == {"locked": False, "reason": "cpu", "detail": "CPU run: GPU clocks do not apply"}
    assert clock_cell(report) == "n/a (CPU run)" and throttle_note(report) == ""


def test_no_clock_source_is_said_not_invented(smi, monkeypatch, tmp_path):
    monkeypatch.setenv("NVIDIA_SMI", str(tmp_path / "missing"))
    write_state(smi)
    report = clock_report("gpu", UUID)
    assert report["locked"] is None and report["reason"] == "clocks-unreadable"
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
