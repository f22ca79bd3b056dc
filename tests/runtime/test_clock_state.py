"""The clock state file is input like any other: only what the lock script writes, for this GPU, counts."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.runtime.clocks import clock_report, read_state

ROOT = Path(__file__).resolve().parents[2]
GOOD = {"gpu": 0, "name": "NVIDIA H100 80GB HBM3", "locked_sm_mhz": 1755, "readback_sm_mhz": 1755,
        "max_sm_mhz": 1980, "locked_at": "2026-11-26T07:00:00Z", "by": "scripts/lock-gpu-clock.sh"}


def test_what_the_lock_script_really_writes_is_accepted(tmp_path):
    """Run the real script against a fake nvidia-smi and read its file back."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!{sys.executable}\nimport sys\nq=[a for a in sys.argv if a.startswith('--query-gpu=')]\n"
                    "vals={'clocks.max.sm':'1980','clocks.applications.graphics':'1755',"
                    "'clocks.default_applications.graphics':'1755','name':'NVIDIA H100 80GB HBM3','clocks.sm':'1755'}\n"
                    "print(', '.join(vals[k] for k in q[0].split('=',1)[1].split(','))) if q else None\n")
    fake.chmod(0o755)
    state = tmp_path / "clock.json"
    r = subprocess.run(["bash", str(ROOT / "scripts" / "lock-gpu-clock.sh")], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "NVIDIA_SMI": str(fake), "APP_CLOCK_STATE": str(state)})
    assert r.returncode == 0, r.stderr
    got, why = read_state(str(state), "NVIDIA H100 80GB HBM3")
    assert why is None and got["locked_sm_mhz"] == 1755


@pytest.mark.parametrize("doc,why", [
    ("not json", "unreadable"),
    (json.dumps({"locked": True}), "not the lock script's format"),
    (json.dumps(GOOD | {"extra": 1}), "not the lock script's format"),
    (json.dumps(GOOD | {"locked_sm_mhz": "1755"}), "field 'locked_sm_mhz' has the wrong type"),
    (json.dumps(GOOD | {"gpu": True}), "field 'gpu' has the wrong type"),
    (json.dumps(GOOD | {"by": "me"}), "not written by scripts/lock-gpu-clock.sh"),
    (json.dumps(GOOD | {"gpu": 1}), "records GPU 1"),
    (json.dumps(GOOD | {"name": "NVIDIA A100"}), "records GPU 0 (NVIDIA A100), not GPU 0 (NVIDIA H100 80GB HBM3)"),
])
def test_anything_else_is_ignored_with_a_reason(tmp_path, doc, why):
    p = tmp_path / "clock.json"
    p.write_text(doc)
    state, reason = read_state(str(p), "NVIDIA H100 80GB HBM3")
    assert state is None and why in reason


def test_an_ignored_file_is_reported_as_not_locked_with_a_warning(tmp_path, monkeypatch, capsys):
    p = tmp_path / "clock.json"
    p.write_text(json.dumps({"locked": True, "by": "anyone"}))
    monkeypatch.setenv("APP_CLOCK_STATE", str(p))
    monkeypatch.setenv("NVIDIA_SMI", str(tmp_path / "missing"))
    report = clock_report("gpu")
    assert report["locked"] is False and "was ignored (not the lock script's format)" in report["detail"]
    assert capsys.readouterr().err.startswith("warning: not locked as far as this tool can tell")


def test_no_file_means_not_locked_without_a_warning(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("APP_CLOCK_STATE", str(tmp_path / "none.json"))
    monkeypatch.setenv("NVIDIA_SMI", str(tmp_path / "missing"))
    assert clock_report("gpu")["locked"] is False and capsys.readouterr().err == ""
