"""The device lock against a real second process, a planted symbolic link, and another user's file."""
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from app.errors import LockUnusable, ProfileBusy
from app.kernel.cli import main
from app.runtime.device import Selection
from app.runtime.lock import device_key, device_lock, lock_dir
from tests.users import NOBODY, can_be_nobody
from tests.conftest import child_env



@pytest.fixture(autouse=True)
def _refuse_at_once(monkeypatch):
    """These tests hold their own locks: a busy one is refused at once unless a test sets APP_LOCK_WAIT."""
    monkeypatch.delenv("APP_LOCK_WAIT", raising=False)


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
    err = capsys.readouterr().err
    assert err.count(f"waiting for cpu: pid {p.pid} is profiling on it (uid {os.geteuid()}); waiting up to 20 s") == 1


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
    assert message.startswith(f"another profile is running on cpu (pid {p.pid}, uid {os.geteuid()}, lock ")
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


def test_a_lock_file_of_another_user_in_your_own_folder_is_refused_not_a_crash(tmp_path, monkeypatch, capsys):
    """In the private default folder a file of someone else's is planted: refused, and never "remove it"."""
    monkeypatch.delenv("APP_LOCK_DIR")
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    lock = Path(lock_dir()) / "app-kernel-profile-cpu.lock"
    lock.write_text("123")
    if os.geteuid() == 0:
        os.chown(lock, 12345, 12345)                     # really another owner
    else:
        monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)   # the ownership check, simulated
    assert main(["join", "--points", "100", "--polygons", "10", "--device", "cpu",
                 "--out", str(tmp_path / "out")]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a regular file owned by you" in err[0]
    assert "remove" not in err[0] and "APP_LOCK_DIR" in err[0]
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


def test_lock_records_the_holder_pid_private_in_your_own_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("APP_LOCK_DIR")
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with device_lock("cpu") as path:
        assert Path(path).read_text() == str(os.getpid())
        assert oct(os.stat(path).st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_a_lock_in_app_lock_dir_is_made_for_everyone_whatever_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        with device_lock("cpu") as path:
            assert Path(path).read_text() == str(os.getpid())
            assert oct(os.stat(path).st_mode & 0o777) == "0o666"
    finally:
        os.umask(old)


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
    err = capsys.readouterr().err
    assert f"waiting for another profile on this host (pid {p.pid}, uid {os.geteuid()}) to finish its measured runs" \
        in err
    assert "waiting up to 900 s (set APP_LOCK_WAIT to wait longer)" in err and "host-measurement-window" not in err


def test_the_measurement_window_says_what_it_waited_for_in_words(holder):
    from app.runtime.lock import measurement_window

    p = holder("host-measurement-window")
    with pytest.raises(ProfileBusy) as refused:
        with measurement_window(wait=0.2):
            pass
    message = str(refused.value)
    assert message.startswith(f"another profile on this host (pid {p.pid}, uid {os.geteuid()}) was still in its "
                              "measured runs after waiting 0.2 s; measured runs take turns host-wide")
    assert "APP_LOCK_WAIT" in message and "per device" not in message


def test_a_hard_link_a_fifo_or_a_large_file_is_refused_and_left_alone(tmp_path):
    lock = tmp_path / "app-kernel-profile-cpu.lock"
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.link(victim, lock)                                   # another file under the lock's name
    with pytest.raises(LockUnusable, match="2 hard links"):
        with device_lock("cpu"):
            pass
    assert victim.read_text() == "precious"
    lock.unlink()
    lock.write_text("x" * 100)
    with pytest.raises(LockUnusable, match="100 bytes, so it is not a lock file"):
        with device_lock("cpu"):
            pass
    assert lock.read_text() == "x" * 100
    lock.unlink()
    os.mkfifo(lock)
    with pytest.raises(LockUnusable, match="is not a regular file"):      # and no hang on opening it
        with device_lock("cpu"):
            pass


def test_python_m_lock_path_prints_the_lock_file(tmp_path):
    env = child_env(APP_LOCK_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "app.runtime.lock", "path", "gpu-GPU-abc"], capture_output=True,
                       text=True, env=env, timeout=30)
    assert r.returncode == 0 and r.stdout == f"{tmp_path}/app-kernel-profile-gpu-GPU-abc.lock\n", r.stderr
    assert subprocess.run([sys.executable, "-m", "app.runtime.lock"], capture_output=True, env=env,
                          timeout=30).returncode == 64


# -- Two users sharing one APP_LOCK_DIR: really another user (nobody), started with setpriv.



needs_second_user = pytest.mark.skipif(not can_be_nobody(), reason="needs root and setpriv to run as another user")


@pytest.fixture
def shared_dir(monkeypatch):
    """A folder both users can write, as a team's APP_LOCK_DIR would be (sticky, like /tmp)."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="app-shared-locks-", dir="/tmp"))
    d.chmod(0o1777)
    monkeypatch.setenv("APP_LOCK_DIR", str(d))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _as_nobody(code: str, shared: Path, *args: str, **kw) -> subprocess.Popen:
    env = child_env(APP_LOCK_DIR=str(shared), HOME=str(shared))
    env.pop("APP_LOCK_WAIT", None)
    return subprocess.Popen([*NOBODY, sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(shared), **kw)


TAKE = ("import sys\nfrom app.errors import AppError\nfrom app.runtime.lock import device_lock\n"
        "try:\n    with device_lock(sys.argv[1]):\n        print('took it')\n"
        "except AppError as e:\n    print(e, file=sys.stderr); sys.exit(e.exit_code)\n")


@needs_second_user
def test_a_shared_lock_dir_lets_a_second_user_take_turns(shared_dir):
    """Root profiled once (its lock file stays); nobody profiles now that no one holds it: it may, and back."""
    with device_lock("gpu-GPU-x"):
        pass
    p = _as_nobody(TAKE, shared_dir, "gpu-GPU-x")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0 and out == "took it\n", err
    p = _as_nobody(TAKE, shared_dir, "gpu-GPU-y")          # a lock nobody makes is usable by root after it
    assert p.communicate(timeout=60)[0] == "took it\n"
    assert os.stat(shared_dir / "app-kernel-profile-gpu-GPU-y.lock").st_uid == 65534
    with device_lock("gpu-GPU-y") as path:
        assert Path(path).read_text() == str(os.getpid())


@needs_second_user
def test_a_shared_lock_dir_serialises_two_users_and_names_the_holder(shared_dir, holder):
    """Root holds the GPU: nobody is refused with root's pid and uid, and never told to remove the lock."""
    p = holder("gpu-GPU-x")
    q = _as_nobody(TAKE, shared_dir, "gpu-GPU-x")
    out, err = q.communicate(timeout=60)
    assert q.returncode == 4 and out == ""
    assert err.strip() == (f"another profile is running on gpu-GPU-x (pid {p.pid}, uid 0, lock {shared_dir}/"
                           "app-kernel-profile-gpu-GPU-x.lock); wait for it to finish -- one profiling at a time "
                           "per device")
    p.kill()
    p.wait()
    hold = _as_nobody("import sys, time\nfrom app.runtime.lock import device_lock\nwith device_lock(sys.argv[1]):\n"
                      "    print('held', flush=True); time.sleep(30)\n", shared_dir, "gpu-GPU-x")
    try:
        assert hold.stdout.readline().strip() == "held"
        with pytest.raises(ProfileBusy, match=rf"\(pid {hold.pid}, uid 65534, lock "):
            with device_lock("gpu-GPU-x"):
                pass
    finally:
        hold.kill()
        hold.wait()


@needs_second_user
def test_an_old_private_lock_of_another_user_is_explained_not_removed(shared_dir):
    """A lock made 0600 by an older version: nobody cannot read it. The fix named is chmod, never rm."""
    lock = shared_dir / "app-kernel-profile-gpu-GPU-x.lock"
    lock.write_text("1")
    lock.chmod(0o600)
    q = _as_nobody(TAKE, shared_dir, "gpu-GPU-x")
    out, err = q.communicate(timeout=60)
    assert q.returncode == 4 and len(err.strip().splitlines()) == 1, err
    assert "uid 0, mode 0600" in err and "chmod a+rw" in err and "remove" not in err
    assert lock.exists() and stat.S_IMODE(lock.stat().st_mode) == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a file away to another user")
def test_a_foreign_lock_in_your_own_folder_names_its_holder_when_held(tmp_path, monkeypatch):
    monkeypatch.delenv("APP_LOCK_DIR")
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    lock = Path(lock_dir()) / "app-kernel-profile-cpu.lock"
    lock.write_text("")
    os.chown(lock, 12345, 12345)
    code = ("import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDONLY)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\ntime.sleep(30)\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(LockUnusable) as refused:
            with device_lock("cpu"):
                pass
        assert f"so it is not used; it is held by pid {p.pid} (uid 0): once no profile of uid 12345 runs" \
            in str(refused.value)
    finally:
        p.kill()
        p.wait()


def test_the_kernels_lock_table_is_read_for_flocks_on_this_file_only(tmp_path, monkeypatch):
    """/proc/locks as the kernel writes it: a POSIX lock, another file's flock and a waiter are no holders; the
    file's own device:inode first, its inode alone (an overlay shows another device) only where that is all."""
    import io

    from app.runtime import lock as lockmod

    f = tmp_path / "x.lock"
    f.write_bytes(b"\xff\xfe")                     # no pid, and no UTF-8 either: read with replacement
    st = os.stat(f)
    exact = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    table = {"text": ""}
    real_open = open

    def fake_open(path, *a, **k):
        return io.StringIO(table["text"]) if path == "/proc/locks" else real_open(path, *a, **k)
    monkeypatch.setattr(lockmod, "open", fake_open, raising=False)
    table["text"] = (f"1: POSIX  ADVISORY  WRITE 111 {exact} 0 EOF\n"
                     f"2: FLOCK  ADVISORY  WRITE 222 {exact} 0 EOF\n"
                     f"3: FLOCK  ADVISORY  WRITE 333 00:99:{st.st_ino} 0 EOF\n"
                     f"4: FLOCK  ADVISORY  WRITE 444 00:99:{st.st_ino + 1} 0 EOF\n"
                     f"5: -> FLOCK  ADVISORY  WRITE 555 {exact} 0 EOF\n")
    assert lockmod._flock_pids(st) == [222]
    table["text"] = (f"1: POSIX  ADVISORY  WRITE 111 {exact} 0 EOF\n"
                     f"3: FLOCK  ADVISORY  WRITE 333 00:99:{st.st_ino} 0 EOF\n"
                     f"4: FLOCK  ADVISORY  WRITE 444 00:99:{st.st_ino + 1} 0 EOF\n")
    assert lockmod._flock_pids(st) == [333]
    assert lockmod._held(st) is True
    table["text"] = f"4: FLOCK  ADVISORY  WRITE 444 00:99:{st.st_ino + 1} 0 EOF\n"
    assert lockmod._flock_pids(st) == [] and lockmod._held(st) is False
    fd = os.open(f, os.O_RDONLY)
    try:
        assert lockmod.holder(fd) == (None, None)                  # nothing written, nothing held
        assert lockmod._holder_text(fd) == "no process holds it now"
        table["text"] = f"2: FLOCK  ADVISORY  WRITE {os.getpid()} {exact} 0 EOF\n"
        assert lockmod.holder(fd) == (os.getpid(), os.geteuid())
        assert lockmod._holder_text(fd) == f"it is held by pid {os.getpid()} (uid {os.geteuid()})"
    finally:
        os.close(fd)
