"""The clock scripts and the profiler's lock, interrupts, stale records and their messages.

Real second processes hold the profiling lock (as a profile would); real signals interrupt the
scripts while a slow fake nvidia-smi call is in flight. Never a real nvidia-smi: a wrapper
around tests/fake_smi.py adds what these cases need (a missing GPU index, a slow call, a
failure that is not a permission problem) and logs every call before it runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import child_path
from tests.fake_smi import UUID, install
from tests.users import NOBODY, can_be_nobody

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "scripts" / "lock-gpu-clock.sh"
RESET = ROOT / "scripts" / "reset-gpu-clock.sh"
COMMON = ROOT / "scripts" / "smi-common.sh"
KEY = "gpu-" + UUID                       # lock.py's device_key for the fake GPU
STATE_CHANGING = {"-pm", "-lgc", "-rgc", "-lmc", "-rmc"}

# WRAP_NGPU: indexes at or above it do not exist ("No devices were found", exit 6, as nvidia-smi says);
# WRAP_SLEEP_ON=ARG: a call with ARG sleeps WRAP_SLEEP seconds before it does anything (a change then lands
# late, or never if it is killed); WRAP_FAIL_ON=ARG: that call fails as a driver error (exit 15), not a
# permission one. Every call is logged to WRAP_LOG before it runs.
WRAPPER = """\
#!/usr/bin/env bash
idx=0; prev=""
for a in "$@"; do [[ "$prev" == "-i" ]] && idx="$a"; prev="$a"; done
printf '%s\\n' "$*" >> "$WRAP_LOG"
if (( idx >= ${{WRAP_NGPU:-8}} )); then echo "No devices were found"; exit 6; fi
for a in "$@"; do
    if [[ -n "${{WRAP_FAIL_ON:-}}" && "$a" == "$WRAP_FAIL_ON" ]]; then
        echo "Unable to determine the device handle for GPU0000:19:00.0: Unknown Error"; exit 15
    fi
    if [[ -n "${{WRAP_SLEEP_ON:-}}" && "$a" == "$WRAP_SLEEP_ON" ]]; then sleep "${{WRAP_SLEEP:-3}}"; fi
done
exec {fake} "$@"
"""


@pytest.fixture
def smi(tmp_path: Path) -> dict:
    fake = install(tmp_path / "bin")
    wrapper = tmp_path / "bin" / "nvidia-smi-wrap"
    wrapper.write_text(WRAPPER.format(fake=fake))
    wrapper.chmod(0o755)
    locks = tmp_path / "locks"
    locks.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("GPU", "SUDO_UID", "SUDO_USER", "XDG_RUNTIME_DIR") and not k.startswith(("FAKE_SMI_", "WRAP_"))}
    env.update(NVIDIA_SMI=str(wrapper), FAKE_SMI_LOG=str(tmp_path / "smi.log"), WRAP_LOG=str(tmp_path / "wrap.log"),
               APP_CLOCK_STATE=str(tmp_path / "state" / "clock.json"), APP_LOCK_DIR=str(locks),
               HOME=str(tmp_path / "home"), PYTHONPATH=child_path())
    return {"env": env, "tmp": tmp_path, "log": tmp_path / "smi.log", "wrap_log": tmp_path / "wrap.log",
            "locks": locks, "state": tmp_path / "state" / f"clock.{UUID.lower()}.json"}


def run(script: Path, smi: dict, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), *args], env={**smi["env"], **env}, capture_output=True, text=True,
                          timeout=60)


def changes(smi: dict) -> list[list[str]]:
    if not smi["log"].exists():
        return []
    return [c for c in (json.loads(line) for line in smi["log"].read_text().splitlines()) if STATE_CHANGING & set(c)]


def locked(smi: dict) -> tuple[bool, bool]:
    """(SM, memory) clocks locked on the fake GPU."""
    return Path(str(smi["log"]) + ".locked").exists(), Path(str(smi["log"]) + ".memlocked").exists()


# -- 2. The scripts take the profiler's lock: no clock change lands in a profile.

@pytest.mark.parametrize("script, args", [(LOCK, ()), (RESET, ()), (LOCK, ("--dry-run",)), (RESET, ("--dry-run",))])
def test_a_script_refuses_while_a_profile_holds_the_gpu(smi, holder, script, args):
    if script is RESET:
        assert run(LOCK, smi).returncode == 0
        smi["log"].unlink()
    p = holder(KEY, smi["env"])
    r = run(script, smi, *args)
    assert r.returncode == 75, r.stderr
    assert r.stderr.splitlines() == [
        f"{script.stem}: GPU 0 is being profiled by pid {p.pid} (uid {os.geteuid()}); wait for it or stop it "
        f"(nothing was changed; its lock: {smi['locks']}/app-kernel-profile-{KEY}.lock)"]
    assert changes(smi) == []
    assert (script is RESET) == smi["state"].exists()          # a lock made before stays recorded


def test_a_profile_of_another_gpu_does_not_stop_the_script(smi, holder):
    holder("gpu-GPU-00000000-1111-2222-3333-444444444444", smi["env"])
    assert run(LOCK, smi).returncode == 0


def test_reset_without_the_uuid_waits_for_any_gpu_being_profiled(smi, holder):
    """The UUID cannot be read: which GPU's lock is its own is unknown, so every GPU's counts."""
    assert run(LOCK, smi).returncode == 0
    p = holder(KEY, smi["env"])
    r = run(RESET, smi, FAKE_SMI_FAIL="--query-gpu=uuid")
    assert r.returncode == 75 and f"being profiled by pid {p.pid}" in r.stderr


def test_a_profile_starting_during_a_clock_change_is_refused(smi, monkeypatch):
    """The script holds the GPU's lock while it changes clocks: a profile starting then waits or is refused."""
    from app.errors import ProfileBusy
    from app.runtime import lock

    env = {**smi["env"], "WRAP_SLEEP_ON": "-lgc", "WRAP_SLEEP": "3"}
    p = subprocess.Popen(["bash", str(LOCK)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while "-lgc" not in (smi["wrap_log"].read_text() if smi["wrap_log"].exists() else ""):
            assert time.monotonic() < deadline and p.poll() is None, p.communicate()
            time.sleep(0.02)
        monkeypatch.setenv("APP_LOCK_DIR", str(smi["locks"]))
        with pytest.raises(ProfileBusy, match=f"another profile is running on {KEY}"):
            with lock.device_lock(KEY, wait=0):
                pass
    finally:
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err


def _lock_dirs(env: dict) -> list[str]:
    r = subprocess.run(["bash", "-c", f'PROG=t; dry_run=1; source "{COMMON}"; profile_lock_dirs'], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def _tool_dir(env: dict) -> str:
    r = subprocess.run([sys.executable, "-m", "app.runtime.lock", "path", KEY], env=env, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return os.path.dirname(r.stdout.strip())


@pytest.mark.parametrize("case", ["APP_LOCK_DIR", "private runtime dir", "shared runtime dir", "no runtime dir"])
def test_the_scripts_lock_the_folder_the_profiler_uses(smi, case):
    """lock.py's folder rule, mirrored in smi-common.sh: the profiler's folder is always among the script's."""
    env = dict(smi["env"])
    home = smi["tmp"] / "home"
    home.mkdir()
    runtime = smi["tmp"] / "run"
    runtime.mkdir(mode=0o700)
    if case != "APP_LOCK_DIR":
        del env["APP_LOCK_DIR"]
    if case == "shared runtime dir":
        runtime.chmod(0o755)
    if case != "no runtime dir":
        env["XDG_RUNTIME_DIR"] = str(runtime)
    tool = _tool_dir(env)                       # the profiler makes its folder
    assert tool in _lock_dirs(env)
    if case == "APP_LOCK_DIR":
        assert _lock_dirs(env) == [str(smi["locks"])]
    expected = {"APP_LOCK_DIR": str(smi["locks"]), "private runtime dir": str(runtime / "app-kernel")}
    assert tool == expected.get(case, str(home / ".cache" / "app-kernel" / "locks"))




@pytest.mark.skipif(not can_be_nobody(), reason="needs root and setpriv to run as another user")
def test_under_sudo_the_script_sees_the_invoking_users_profile(smi, holder):
    """sudo bash scripts/lock-gpu-clock.sh: the profile runs as the user who ran sudo, in that user's own
    folder; the script (root) finds it through SUDO_UID and that user's home."""
    base = Path(tempfile.mkdtemp(prefix="app-sudo-test-", dir="/tmp"))
    try:
        base.chmod(0o755)
        user_home = base / "home"
        user_home.mkdir()
        os.chown(user_home, 65534, 65534)
        fake_bin = smi["tmp"] / "fakebin"                    # getent: nobody's home is user_home
        fake_bin.mkdir()
        root_home = base / "root"                           # root's own folders, kept out of the real /root
        (fake_bin / "getent").write_text(
            f'#!/bin/sh\n[ "$2" = 65534 ] && echo "nobody:x:65534:65534::{user_home}:/bin/sh" && exit 0\n'
            f'[ "$2" = 0 ] && echo "root:x:0:0::{root_home}:/bin/sh" && exit 0\nexec /usr/bin/getent "$@"\n')
        (fake_bin / "getent").chmod(0o755)
        user_env = {k: v for k, v in smi["env"].items() if k not in ("APP_LOCK_DIR",)}
        user_env["HOME"] = str(user_home)
        p = holder(KEY, user_env, prefix=tuple(NOBODY))
        sudo_env = {k: v for k, v in smi["env"].items() if k != "APP_LOCK_DIR"}     # sudo drops it
        sudo_env.update(SUDO_UID="65534", SUDO_USER="nobody", PATH=f"{fake_bin}:{os.environ['PATH']}")
        r = subprocess.run(["bash", str(LOCK)], env=sudo_env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 75 and f"being profiled by pid {p.pid} (uid 65534)" in r.stderr, r.stderr
        assert changes(smi) == []
        p.kill()
        p.wait()
        (user_home / ".cache" / "app-kernel" / "locks" / f"app-kernel-profile-{KEY}.lock").unlink()
        r = subprocess.run(["bash", str(LOCK)], env=sudo_env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        made = user_home / ".cache" / "app-kernel" / "locks" / f"app-kernel-profile-{KEY}.lock"
        st = made.stat()                                     # made for the user, as lock.py would: usable by them
        assert (st.st_uid, oct(st.st_mode & 0o777)) == (65534, "0o600")
        holder(KEY, user_env, prefix=tuple(NOBODY))
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- 3. An interrupted lock leaves no lock behind, and says so.

def _start(script: Path, smi: dict, **env: str) -> subprocess.Popen:
    def foreground_job():                # as a terminal's foreground job: SIGINT at its default, own group
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.setpgid(0, 0)
    return subprocess.Popen(["bash", str(script)], env={**smi["env"], **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=foreground_job)


def _wait_for_call(smi: dict, arg: str, p: subprocess.Popen) -> None:
    deadline = time.monotonic() + 20
    while arg not in (smi["wrap_log"].read_text() if smi["wrap_log"].exists() else ""):
        assert time.monotonic() < deadline and p.poll() is None, p.communicate()
        time.sleep(0.02)
    time.sleep(0.2)                      # inside the call now


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
@pytest.mark.parametrize("in_flight", ["-lmc", "-lgc"])
def test_an_interrupted_lock_resets_the_clocks_and_leaves_no_record(smi, signum, status, in_flight):
    """The signal lands while nvidia-smi changes a clock. Ctrl-C goes to the terminal's foreground process group
    (nvidia-smi, under timeout, has a group of its own); SIGTERM and SIGHUP go to the script."""
    p = _start(LOCK, smi, WRAP_SLEEP_ON=in_flight, WRAP_SLEEP="2")
    _wait_for_call(smi, in_flight, p)
    if signum == signal.SIGINT:
        os.killpg(p.pid, signum)
    else:
        p.send_signal(signum)
    out, err = p.communicate(timeout=60)
    time.sleep(2.5)                      # long past the in-flight call's own end: it must not land late
    assert p.returncode == status, err
    assert err.splitlines()[-1] == "lock-gpu-clock: interrupted: clocks reset (GPU 0: nothing is locked, no record " \
                                   "is left)", err
    assert locked(smi) == (False, False), changes(smi)
    assert not smi["state"].exists() and "locked:" not in out
    assert changes(smi)[-1] == ["-i", "0", "-rgc"]


def test_a_signal_during_the_exits_own_reset_does_not_stop_it(smi):
    """-lmc fails, so the exit resets the SM clock; a SIGTERM while that reset's -rmc runs must not cut it short
    (the -rgc after it would never run, leaving the SM clock locked with no record) nor be called 'no change'."""
    p = _start(LOCK, smi, FAKE_SMI_FAIL="-lmc", WRAP_SLEEP_ON="-rmc", WRAP_SLEEP="2")
    _wait_for_call(smi, "-rmc", p)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode != 0 and "no clock was changed" not in err, err
    assert locked(smi) == (False, False), changes(smi)
    assert changes(smi)[-1] == ["-i", "0", "-rgc"] and not smi["state"].exists()


def test_an_interrupt_before_any_clock_change_changes_nothing(smi):
    p = _start(LOCK, smi, WRAP_SLEEP_ON="-pm", WRAP_SLEEP="2")
    _wait_for_call(smi, "-pm", p)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 143 and err.splitlines() == ["lock-gpu-clock: interrupted: no clock was changed"], err
    assert not any("-lgc" in c or "-rgc" in c for c in changes(smi))


def test_an_interrupt_after_the_lock_was_recorded_undoes_it_too(smi):
    p = _start(LOCK, smi, WRAP_SLEEP_ON="--query-gpu=clocks.sm,clocks.mem", WRAP_SLEEP="2")
    _wait_for_call(smi, "--query-gpu=clocks.sm,clocks.mem", p)
    assert smi["state"].exists()
    p.send_signal(signal.SIGHUP)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 129 and "interrupted: clocks reset" in err
    assert locked(smi) == (False, False) and not smi["state"].exists()


def test_an_interrupted_reset_says_what_may_still_be_locked(smi):
    assert run(LOCK, smi).returncode == 0
    p = _start(RESET, smi, WRAP_SLEEP_ON="-rgc", WRAP_SLEEP="2")
    _wait_for_call(smi, "-rgc", p)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 143
    assert err.splitlines() == ["reset-gpu-clock: interrupted while resetting GPU 0's SM clock: it may still be "
                                "locked; run it again"]
    assert smi["state"].exists()                                # still locked, still recorded
    time.sleep(2.5)
    assert locked(smi)[0]                                       # the killed -rgc never landed


# -- 6. A record goes as soon as the clocks it records are not locked as recorded.

def test_a_failed_relock_leaves_no_stale_record(smi):
    assert run(LOCK, smi, "--clock", "1410").returncode == 0
    assert json.loads(smi["state"].read_text())["locked_sm_mhz"] == 1410
    r = run(LOCK, smi, "--clock", "1605", FAKE_SMI_FAIL="-lmc")
    assert r.returncode == 1
    assert locked(smi) == (False, False)                       # undone: the memory lock failed
    assert not smi["state"].exists(), "the record of the 1410 MHz lock still claims a lock"


def test_a_partly_failed_reset_leaves_no_stale_record(smi):
    assert run(LOCK, smi).returncode == 0
    r = run(RESET, smi, FAKE_SMI_FAIL="-rmc")
    assert r.returncode == 1 and "-rmc' failed (exit 4)" in r.stderr
    assert not locked(smi)[0] and not smi["state"].exists()    # the SM clock is reset: no record claims a lock


# -- 7. Messages that say what failed and what is left.

def test_a_failed_memory_lock_says_what_failed(smi):
    r = run(LOCK, smi, FAKE_SMI_FAIL="-lmc")
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert len(lines) == 2, r.stderr
    assert "'nvidia-smi -i 0 -lmc 2619,2619' failed (exit 4): Insufficient Permissions; changing clocks" in lines[0]
    assert lines[1] == "lock-gpu-clock: locking the memory clock failed, so the SM clock lock is undone; " \
                       "resetting the clocks of GPU 0"
    assert "recorded" not in r.stderr


def test_a_failed_read_back_says_the_clocks_are_locked_and_recorded(smi):
    r = run(LOCK, smi, FAKE_SMI_FAIL="--query-gpu=clocks.sm,clocks.mem")
    assert r.returncode == 1
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"lock-gpu-clock: GPU 0 ({UUID}) is locked (SM at 1755 MHz, memory at 2619 MHz) and "
                           f"recorded in {smi['state']}, but reading the clocks back failed")
    assert "reset-gpu-clock.sh --gpu 0" in line and locked(smi) == (True, True)


@pytest.mark.parametrize("script, arg", [(LOCK, "-lgc"), (LOCK, "-pm"), (RESET, "-rgc")])
def test_root_is_named_only_for_a_permission_failure(smi, script, arg):
    if script is RESET:
        assert run(LOCK, smi).returncode == 0
    r = run(script, smi, WRAP_FAIL_ON=arg)
    assert r.returncode == 1
    first = r.stderr.splitlines()[0]
    assert "failed (exit 15): Unable to determine the device handle" in first and "check the NVIDIA driver" in first
    assert "root" not in r.stderr and "sudo" not in first


@pytest.mark.parametrize("args", [(), ("--dry-run",)])
def test_reset_of_a_gpu_that_does_not_exist_stops_at_once(smi, args):
    assert run(LOCK, smi).returncode == 0
    smi["log"].unlink()
    r = run(RESET, smi, "--gpu", "3", *args, WRAP_NGPU="1")
    assert r.returncode == 1
    assert r.stderr.splitlines() == ["reset-gpu-clock: no GPU 3 ('nvidia-smi -i 3' exit 6: No devices were found); "
                                     "nvidia-smi -L lists the GPUs; nothing was changed"]
    assert r.stdout == "" and changes(smi) == [] and smi["state"].exists()


def test_lock_of_a_gpu_that_does_not_exist_says_so(smi):
    r = run(LOCK, smi, "--gpu", "3", WRAP_NGPU="1")
    assert r.returncode == 1
    (line,) = r.stderr.splitlines()
    assert "No devices were found; there is no GPU 3: nvidia-smi -L lists the GPUs" in line
    assert "root" not in line
