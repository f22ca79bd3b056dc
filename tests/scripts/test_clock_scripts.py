"""scripts/lock-gpu-clock.sh and scripts/reset-gpu-clock.sh against a fake nvidia-smi.

No GPU needed: NVIDIA_SMI points the scripts at a small Python stand-in that
logs its argv, answers --query-gpu with plausible CSV, and fails on request.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from tests.fake_smi import UUID, install

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "scripts" / "lock-gpu-clock.sh"
RESET = ROOT / "scripts" / "reset-gpu-clock.sh"

STATE_CHANGING = {"-pm", "-lgc", "-rgc", "-lmc", "-rmc"}
OTHER_UUID = "GPU-00000000-1111-2222-3333-444444444444"


@pytest.fixture
def smi(tmp_path: Path) -> dict:
    fake = install(tmp_path / "bin")
    log = tmp_path / "smi.log"
    env = {k: v for k, v in os.environ.items() if k != "GPU" and not k.startswith("FAKE_SMI_")}
    env.update(
        NVIDIA_SMI=str(fake),
        FAKE_SMI_LOG=str(log),
        APP_CLOCK_STATE=str(tmp_path / "state" / "clock.json"),
    )
    # "state": GPU UUID's own record (one file per GPU); "base": APP_CLOCK_STATE, where an older single record sat
    return {"env": env, "log": log, "state": tmp_path / "state" / f"clock.{UUID.lower()}.json",
            "base": tmp_path / "state" / "clock.json"}


def run(script: Path, smi: dict, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(script), *args],
        env={**smi["env"], **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def calls(smi: dict) -> list[list[str]]:
    if not smi["log"].exists():
        return []
    return [json.loads(line) for line in smi["log"].read_text().splitlines()]


def changes(smi: dict) -> list[list[str]]:
    return [c for c in calls(smi) if STATE_CHANGING & set(c)]


@pytest.mark.parametrize(
    "args, env, gpu, clock",
    [
        ((), {}, "0", "1755"),  # default applications clock
        (("--clock", "1410"), {}, "0", "1410"),
        (("--clock=1200", "--gpu=3"), {}, "3", "1200"),
        (("--gpu", "1"), {"GPU": "2"}, "1", "1755"),  # --gpu wins over GPU
        ((), {"GPU": "2"}, "2", "1755"),
        ((), {"FAKE_SMI_DEFAULT_APP": "[N/A]", "FAKE_SMI_APP": "1605"}, "0", "1605"),
    ],
)
def test_lock_commands_and_state(smi, args, env, gpu, clock):
    r = run(LOCK, smi, *args, **env)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert changes(smi) == [["-i", gpu, "-pm", "1"], ["-i", gpu, "-lgc", f"{clock},{clock}"],
                            ["-i", gpu, "-lmc", "2619,2619"]]
    queries = [c for c in calls(smi) if c not in changes(smi)]
    assert ["-i", gpu, "--query-gpu=clocks.sm,clocks.mem", "--format=csv,noheader,nounits"] in queries
    state = json.loads(smi["state"].read_text())
    assert state["gpu"] == int(gpu)
    assert state["uuid"] == UUID
    assert state["name"] == "NVIDIA H100 80GB HBM3"
    assert state["locked_sm_mhz"] == int(clock)
    assert state["readback_sm_mhz"] == int(clock)
    assert (state["locked_mem_mhz"], state["readback_mem_mhz"], state["max_mem_mhz"]) == (2619, 2619, 2619)
    assert state["max_sm_mhz"] == 1980
    assert state["by"] == "scripts/lock-gpu-clock.sh"
    datetime.strptime(state["locked_at"], "%Y-%m-%dT%H:%M:%SZ")
    assert not list(smi["state"].parent.glob("*.tmp.*"))


def test_lock_records_a_readback_below_the_lock(smi):
    r = run(LOCK, smi, FAKE_SMI_SM="1395")
    assert r.returncode == 0, r.stderr
    assert "1395" in r.stdout
    state = json.loads(smi["state"].read_text())
    assert (state["locked_sm_mhz"], state["readback_sm_mhz"]) == (1755, 1395)


def test_lock_dry_run_changes_nothing(smi):
    r = run(LOCK, smi, "--dry-run", "--gpu", "1")
    assert r.returncode == 0, r.stderr
    assert changes(smi) == []
    assert calls(smi), "the query may still run"
    assert not smi["state"].exists()
    assert f"{smi['env']['NVIDIA_SMI']} -i 1 -pm 1" in r.stdout
    assert f"{smi['env']['NVIDIA_SMI']} -i 1 -lgc 1755,1755" in r.stdout
    assert f"{smi['env']['NVIDIA_SMI']} -i 1 -lmc 2619,2619" in r.stdout
    assert not Path(str(smi["log"]) + ".locked").exists() and not Path(str(smi["log"]) + ".memlocked").exists()


@pytest.mark.parametrize("persistence_off", [False, True])
def test_reset_commands_and_state_removed(smi, persistence_off):
    assert run(LOCK, smi, "--gpu", "2").returncode == 0
    assert smi["state"].exists()
    smi["log"].unlink()
    r = run(RESET, smi, "--gpu", "2", *(["--persistence-off"] if persistence_off else []))
    assert r.returncode == 0, r.stderr
    expected = [["-i", "2", "-rgc"], ["-i", "2", "-rmc"]] + ([["-i", "2", "-pm", "0"]] if persistence_off else [])
    assert changes(smi) == expected
    assert calls(smi)[0] == ["-i", "2", "--query-gpu=uuid", "--format=csv,noheader,nounits"]   # which GPU
    assert not smi["state"].exists()
    assert not Path(str(smi["log"]) + ".locked").exists() and not Path(str(smi["log"]) + ".memlocked").exists()


def test_reset_keeps_state_of_another_gpu(smi):
    """The state file names a GPU by UUID: another GPU's lock is left alone, whatever the index."""
    assert run(LOCK, smi, "--gpu", "0").returncode == 0
    r = run(RESET, smi, "--gpu", "0", FAKE_SMI_UUID=OTHER_UUID)
    assert r.returncode == 0, r.stderr
    assert changes(smi)[-2:] == [["-i", "0", "-rgc"], ["-i", "0", "-rmc"]]
    assert f"records {UUID}, not GPU 0 ({OTHER_UUID}): left in place" in r.stdout
    assert json.loads(smi["state"].read_text())["uuid"] == UUID


def test_reset_matches_by_index_when_the_uuid_cannot_be_read(smi):
    assert run(LOCK, smi, "--gpu", "1").returncode == 0
    r = run(RESET, smi, "--gpu", "0", FAKE_SMI_FAIL="--query-gpu=uuid")
    assert r.returncode == 0, r.stderr
    assert "records GPU 1, not GPU 0: left in place" in r.stdout
    assert smi["state"].exists()
    r = run(RESET, smi, "--gpu", "1", FAKE_SMI_FAIL="--query-gpu=uuid")
    assert r.returncode == 0, r.stderr
    assert not smi["state"].exists()


@pytest.mark.parametrize("status", ["3", "0"])   # nvidia-smi may only warn, with exit 0
def test_lock_without_memory_clock_support_locks_the_sm_clock(smi, status):
    r = run(LOCK, smi, FAKE_SMI_NO_LMC=status)
    assert r.returncode == 0, r.stderr
    assert len(r.stderr.splitlines()) == 1
    assert "does not support locking its memory clock" in r.stderr and "only the SM clock" in r.stderr
    assert "not supported" in r.stderr                       # nvidia-smi's own words
    assert changes(smi)[-1] == ["-i", "0", "-lmc", "2619,2619"]
    assert not any("-rgc" in c or "-rmc" in c for c in changes(smi))     # the SM lock stands
    state = json.loads(smi["state"].read_text())
    assert state["locked_sm_mhz"] == 1755 and state["locked_mem_mhz"] is None
    assert "memory clock not locked" in r.stdout


def test_reset_without_memory_clock_support_is_not_an_error(smi):
    assert run(LOCK, smi, FAKE_SMI_NO_LMC="3").returncode == 0
    r = run(RESET, smi, FAKE_SMI_NO_LMC="3")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert "does not support 'nvidia-smi -i 0 -rmc'" in r.stdout
    assert not smi["state"].exists()


@pytest.mark.parametrize("env, mem", [
    ({}, "2619"),                                                           # default applications memory clock
    ({"FAKE_SMI_DEFAULT_APP_MEM": "[N/A]", "FAKE_SMI_APP_MEM": "1593"}, "1593"),
    ({"FAKE_SMI_DEFAULT_APP_MEM": "[N/A]", "FAKE_SMI_APP_MEM": "[N/A]", "FAKE_SMI_MAX_MEM": "3201"}, "3201"),
])
def test_lock_memory_clock_choice(smi, env, mem):
    r = run(LOCK, smi, **env)
    assert r.returncode == 0, r.stderr
    assert changes(smi)[-1] == ["-i", "0", "-lmc", f"{mem},{mem}"]
    state = json.loads(smi["state"].read_text())
    assert state["locked_mem_mhz"] == state["readback_mem_mhz"] == int(mem)


def test_a_failing_memory_lock_undoes_the_sm_lock(smi):
    r = run(LOCK, smi, FAKE_SMI_FAIL="-lmc")
    assert r.returncode == 1
    assert "-lmc 2619,2619' failed (exit 4)" in r.stderr and "sudo" in r.stderr
    assert "resetting the clocks of GPU 0" in r.stderr
    made = changes(smi)
    assert made[-2:] == [["-i", "0", "-rmc"], ["-i", "0", "-rgc"]]
    assert not smi["state"].exists()
    assert not Path(str(smi["log"]) + ".locked").exists()


@pytest.mark.parametrize("uuid", ["[N/A]", "", "GPU-not-a-uuid"])
def test_lock_refuses_a_gpu_without_uuid(smi, uuid):
    r = run(LOCK, smi, FAKE_SMI_UUID=uuid)
    assert r.returncode == 1
    assert len(r.stderr.splitlines()) == 1 and "reports no UUID" in r.stderr and "nothing was changed" in r.stderr
    assert changes(smi) == []
    assert not smi["state"].exists()


def test_reset_dry_run_changes_nothing(smi):
    assert run(LOCK, smi).returncode == 0
    smi["log"].unlink()
    r = run(RESET, smi, "--dry-run", "--persistence-off")
    assert r.returncode == 0, r.stderr
    assert changes(smi) == []
    assert smi["state"].exists()
    assert f"{smi['env']['NVIDIA_SMI']} -i 0 -rgc" in r.stdout
    assert f"{smi['env']['NVIDIA_SMI']} -i 0 -rmc" in r.stdout
    assert f"{smi['env']['NVIDIA_SMI']} -i 0 -pm 0" in r.stdout


@pytest.mark.parametrize(
    "script, fail, root_hint",
    [
        (LOCK, "-pm", True),
        (LOCK, "-lgc", True),
        (LOCK, "--format=csv,noheader,nounits", False),  # the query itself fails
        (RESET, "-rgc", True),
    ],
)
def test_failing_nvidia_smi(smi, script, fail, root_hint):
    if script is RESET:
        assert run(LOCK, smi).returncode == 0
    r = run(script, smi, FAKE_SMI_FAIL=fail)
    assert r.returncode != 0
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert "failed (exit 4)" in lines[0] and "Insufficient Permissions" in lines[0]
    assert ("sudo" in lines[0] and "root" in lines[0]) == root_hint
    if script is LOCK:
        state_dir = smi["state"].parent
        assert not state_dir.exists() or not any(state_dir.iterdir()), "no state file, no temp file"
    else:
        assert smi["state"].exists(), "clocks are still locked, so the state file stays"


def test_lock_clock_above_max_is_refused(smi):
    r = run(LOCK, smi, "--clock", "2500")
    assert r.returncode == 1
    assert len(r.stderr.splitlines()) == 1 and "1980" in r.stderr
    assert changes(smi) == []
    assert not smi["state"].exists()


@pytest.mark.parametrize("script", [LOCK, RESET])
@pytest.mark.parametrize("args", [("--dry-run",), ()])
def test_missing_nvidia_smi_exits_2(smi, tmp_path, script, args):
    r = run(script, smi, *args, NVIDIA_SMI=str(tmp_path / "no-such-nvidia-smi"))
    assert r.returncode == 2
    assert len(r.stderr.splitlines()) == 1 and "nvidia-smi not found" in r.stderr
    assert not smi["state"].exists()


@pytest.mark.parametrize("script", [LOCK, RESET])
@pytest.mark.parametrize("args", [("--gpu", "x"), ("--bogus",), ("--gpu",)])
def test_bad_usage(smi, script, args):
    r = run(script, smi, *args)
    assert r.returncode == 64
    assert len(r.stderr.splitlines()) == 1
    assert calls(smi) == []


@pytest.mark.parametrize("script", [LOCK, RESET])
def test_script_is_executable_strict_bash(script):
    assert os.access(script, os.X_OK)
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "\nset -euo pipefail\n" in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert subprocess.run(["bash", str(script), "--help"], capture_output=True).returncode == 0


HANG = """\
#!{python}
import time
time.sleep(60)
"""


@pytest.mark.parametrize("script", [LOCK, RESET])
def test_a_hanging_nvidia_smi_is_stopped(smi, tmp_path, script):
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.write_text(HANG.format(python=sys.executable))
    r = run(script, smi, SMI_TIMEOUT="1")
    assert r.returncode == 1
    assert len(r.stderr.splitlines()) == 1 and "did not answer within 1 s" in r.stderr
    assert not smi["state"].exists()


def test_a_lock_that_cannot_be_recorded_is_undone(smi, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    r = run(LOCK, smi, APP_CLOCK_STATE=str(blocker / "clock.json"))
    assert r.returncode != 0
    assert "could not be recorded" in r.stderr and "resetting the clocks of GPU 0" in r.stderr
    made = [" ".join(c) for c in changes(smi)]
    assert any("-lgc" in c for c in made) and any("-lmc" in c for c in made)
    assert made[-2].endswith("-rmc") and made[-1].endswith("-rgc")        # locked, then reset


def test_a_failed_read_back_still_leaves_the_lock_recorded(smi):
    r = run(LOCK, smi, FAKE_SMI_FAIL="--query-gpu=clocks.sm,clocks.mem")      # only the read-back query fails
    assert r.returncode == 1
    state = json.loads(smi["state"].read_text())       # the clocks are locked, and it says so
    assert state["locked_sm_mhz"] == 1755 and state["readback_sm_mhz"] is None
    assert state["locked_mem_mhz"] == 2619 and state["readback_mem_mhz"] is None


def test_state_file_is_not_written_through_a_planted_link(smi, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    smi["state"].parent.mkdir(parents=True, exist_ok=True)
    for pid in range(os.getpid(), os.getpid() + 200):   # the old predictable temp names
        (smi["state"].parent / f"{smi['state'].name}.tmp.{pid}").symlink_to(victim)
    assert run(LOCK, smi).returncode == 0
    assert victim.read_text() == "precious"
    assert json.loads(smi["state"].read_text())["by"] == "scripts/lock-gpu-clock.sh"
