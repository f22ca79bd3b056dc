"""The device lock against a real second process, a planted symbolic link, and another user's file."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.errors import LockUnusable, ProfileBusy
from app.kernel.cli import main
from app.runtime.device import Selection
from app.runtime.lock import device_key, device_lock, lock_dir

ROOT = Path(__file__).resolve().parents[2]
HOLD = ("import sys, time; from app.runtime.lock import device_lock\n"
        "with device_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(30)\n")


@pytest.fixture
def holder():
    """Start a second process that holds the lock for a key; yields a starter function."""
    procs = []

    def start(key):
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        p = subprocess.Popen([sys.executable, "-c", HOLD, key], stdout=subprocess.PIPE, text=True, env=env)
        procs.append(p)
        assert p.stdout.readline().strip() == "held"
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_a_second_process_holding_the_lock_refuses_the_profile(holder, tmp_path, capsys):
    p = holder("cpu")
    out = tmp_path / "out"
    assert main(["join", "--points", "100", "--polygons", "10", "--device", "cpu", "--out", str(out)]) == 4
    err = capsys.readouterr().err
    assert f"another profile is running on cpu (pid {p.pid}" in err and not out.exists()


def test_released_when_the_holder_dies(holder, tmp_path):
    p = holder("cpu")
    p.kill()
    p.wait()
    with device_lock("cpu"):            # the kernel dropped the dead holder's lock
        pass


def test_profiles_on_two_gpus_do_not_refuse_each_other(holder):
    holder("gpu-GPU-aaaa")
    with device_lock("gpu-GPU-bbbb"):
        pass
    with pytest.raises(ProfileBusy):
        with device_lock("gpu-GPU-aaaa"):
            pass


def test_app_lock_wait_waits_for_a_real_holder_then_takes_the_lock(holder, monkeypatch, capsys):
    import threading
    import time

    p = holder("cpu")
    threading.Timer(0.3, p.kill).start()          # the holder goes away while we wait
    monkeypatch.setenv("APP_LOCK_WAIT", "20")
    t0 = time.monotonic()
    with device_lock("cpu"):
        waited = time.monotonic() - t0
    assert 0.2 < waited < 10
    assert capsys.readouterr().err.count(f"waiting for cpu: pid {p.pid} is profiling on it") == 1     # said once


@pytest.mark.parametrize("value", [None, "0"])
def test_a_busy_lock_is_refused_at_once_by_default_and_with_zero(holder, monkeypatch, value):
    import time

    p = holder("cpu")
    if value is None:
        monkeypatch.delenv("APP_LOCK_WAIT", raising=False)
    else:
        monkeypatch.setenv("APP_LOCK_WAIT", value)
    t0 = time.monotonic()
    with pytest.raises(ProfileBusy) as refused:
        with device_lock("cpu"):
            pass
    assert time.monotonic() - t0 < 0.5
    message = str(refused.value)
    assert message.startswith(f"another profile is running on cpu (pid {p.pid}, lock ")
    assert message.endswith("); wait for it to finish -- one profiling at a time per device")     # no wait named


def test_app_lock_wait_gives_up_after_its_seconds(holder, monkeypatch):
    holder("cpu")
    monkeypatch.setenv("APP_LOCK_WAIT", "0.2")
    with pytest.raises(ProfileBusy, match="after waiting 0.2 s"):
        with device_lock("cpu"):
            pass


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_a_bad_app_lock_wait_is_one_line(value, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("APP_LOCK_WAIT", value)
    assert main(["join", "--points", "100", "--polygons", "10", "--device", "cpu", "--out", str(tmp_path)]) == 4
    assert "APP_LOCK_WAIT" in capsys.readouterr().err


def test_key_is_the_physical_gpu():
    sel = lambda info: Selection("gpu", "gpu", "gpu", "", "H200", info)  # noqa: E731
    assert device_key(sel({"uuid": "GPU-5e1f97fb-7fd8", "index": 0})) == "gpu-GPU-5e1f97fb-7fd8"
    assert device_key(sel({"pci_bus_id": "0000:06:00", "index": 0})) == "gpu-0000_06_00"
    assert device_key(sel({"index": 3})) == "gpu-index3"         # neither known: the device's index tells GPUs apart
    assert device_key(Selection("auto", "cpu", "cpu", "", "cpu", {})) == "cpu"


def test_a_planted_symlink_is_refused_and_its_target_untouched(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "app-kernel-profile-cpu.lock").symlink_to(victim)
    with pytest.raises(LockUnusable, match="symbolic link"):
        with device_lock("cpu"):
            pass
    assert victim.read_text() == "precious"


def test_a_lock_file_of_another_user_is_refused_not_a_crash(tmp_path, monkeypatch, capsys):
    lock = tmp_path / "app-kernel-profile-cpu.lock"
    lock.write_text("123")
    if os.geteuid() == 0:
        os.chown(lock, 12345, 12345)                     # really another owner
    else:
        monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)   # the ownership check, simulated
    assert main(["join", "--points", "100", "--polygons", "10", "--device", "cpu",
                 "--out", str(tmp_path / "out")]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a regular file owned by you" in err[0]
    assert lock.read_text() == "123"


@pytest.mark.parametrize("value", ["does/not/exist", "file"])
def test_unusable_lock_dir_is_one_line(tmp_path, monkeypatch, capsys, value):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("APP_LOCK_DIR", str(tmp_path / value))
    assert main(["join", "--points", "100", "--polygons", "10", "--device", "cpu",
                 "--out", str(tmp_path / "out")]) == 4
    assert "is not a writable folder" in capsys.readouterr().err


def test_default_folder_is_private(tmp_path, monkeypatch):
    monkeypatch.delenv("APP_LOCK_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    d = lock_dir()
    assert d == str(tmp_path / ".cache" / "app-kernel" / "locks")
    assert oct(os.stat(d).st_mode & 0o777) == "0o700"
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert lock_dir() == str(runtime / "app-kernel")
    runtime.chmod(0o777)                                  # a world-writable runtime dir is not used
    assert lock_dir() == str(tmp_path / ".cache" / "app-kernel" / "locks")


def test_lock_records_the_holder_pid(tmp_path):
    with device_lock("cpu") as path:
        assert Path(path).read_text() == str(os.getpid())
        assert oct(os.stat(path).st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("raw,expected", [
    (bytes(range(16)), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"),
    (list(range(16)), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"),
    (b"short", None), (None, None), ("not bytes", None), (12, None), ([300] * 16, None),
])
def test_gpu_identity_never_breaks_the_probe(raw, expected):
    from app.runtime.device import _pci, _uuid

    assert _uuid(raw) == expected
    assert _pci({"pciDomainID": 0, "pciBusID": 6, "pciDeviceID": 0}) == "0000:06:00"
    assert _pci({}) is None and _pci({"pciDomainID": "x", "pciBusID": 1, "pciDeviceID": 2}) is None


def test_a_uuid_cut_at_a_zero_byte_is_read_again_from_the_driver():
    """CuPy returns the UUID as a C string: a GPU whose UUID holds a zero byte came back short."""
    from app.runtime.device import _uuid

    full = bytes.fromhex("6ac39380310 0f2652c683d94223eac8b".replace(" ", ""))
    assert _uuid(full[:5], lambda: full) == "GPU-6ac39380-3100-f265-2c68-3d94223eac8b"
    assert _uuid(b"", lambda: None) is None
    assert _uuid(full[:5], lambda: 1 / 0) is None            # a failing driver call is not a crash
    assert _uuid(full, lambda: 1 / 0) == "GPU-6ac39380-3100-f265-2c68-3d94223eac8b"


@pytest.mark.gpu
def test_the_probed_uuid_is_the_one_nvidia_smi_names_for_this_gpu():
    import subprocess

    from app.runtime.device import _driver_uuid, _uuid, probe_gpu

    info = probe_gpu()[2]
    smi = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id,uuid", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=30).stdout
    by_bus = {}
    for line in smi.splitlines():                         # 00000000:18:00.0, GPU-...
        bus, uuid = (x.strip().lower() for x in line.split(","))
        domain, bus_no, dev_fn = bus.split(":")
        by_bus[f"{int(domain, 16):04x}:{bus_no}:{dev_fn.split('.')[0]}"] = uuid
    assert info["uuid"].lower() == by_bus[info["pci_bus_id"].lower()]
    assert _uuid(b"", _driver_uuid) == info["uuid"]          # the driver's own 16 bytes, read for real


def test_the_measurement_window_waits_for_a_real_holder(holder, capsys):
    """Another profile of this host holds the window: ours waits for it instead of timing beside it."""
    import threading

    from app.runtime.lock import measurement_window

    p = holder("host-measurement-window")
    threading.Timer(0.3, p.kill).start()
    with measurement_window() as window:
        pass
    assert 0.2 < window["waited_seconds"] < 30
    assert f"waiting for host-measurement-window: pid {p.pid}" in capsys.readouterr().err
