"""A tool (ncu, nsys, a worker) dies with the profile that started it, and the temporary folders of a profile
killed outright are removed by the next one. Real processes, killed for real."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.runtime.profiling.tools import remove_stale_tmpdirs, tool_tmpdir
from tests.conftest import child_env

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

# The profile: runs a "tool" (a sleeper that writes its pid) through run_tool, in a tool_tmpdir.
PROFILE = """\
import sys
from app.runtime.profiling.tools import run_tool, tool_tmpdir
with tool_tmpdir("ncu", parent=sys.argv[2]) as tmp:
    print(tmp, flush=True)
    run_tool([sys.executable, "-c", "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); "
              "time.sleep(60)", sys.argv[1]], timeout=120, label="ncu worker")
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:                                  # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_a_tool_dies_with_a_profile_killed_outright(tmp_path):
    pidfile = tmp_path / "tool.pid"
    env = child_env()
    p = subprocess.Popen([sys.executable, "-c", PROFILE, str(pidfile), str(tmp_path)], stdout=subprocess.PIPE,
                         text=True, env=env)
    tmp = Path(p.stdout.readline().strip())
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    tool = int(pidfile.read_text())
    try:
        assert alive(tool) and tmp.is_dir()
        p.send_signal(signal.SIGKILL)     # no clean-up runs: the OOM killer, kill -9
        p.wait()
        deadline = time.monotonic() + 10
        while alive(tool) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(tool), "the tool outlived the profile that started it (and would keep using the GPU)"
        assert tmp.is_dir()                                          # its folder stayed behind ...
        with tool_tmpdir("ncu", parent=str(tmp_path)) as mine:       # ... until the next profile's tool run
            assert not tmp.exists() and Path(mine).is_dir()
        assert not Path(mine).exists()
    finally:
        if alive(tool):
            os.kill(tool, signal.SIGKILL)


def test_only_folders_of_dead_makers_are_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale_no_lock = tmp_path / f"app-kernel-tool-ncu-{dead.pid}-abc123"   # its maker died before its lock file
    stale_no_lock.mkdir()
    old = time.time() - 3600
    os.utime(stale_no_lock, (old, old))
    fresh_no_lock = tmp_path / f"app-kernel-tool-nsys-{dead.pid}-def456"  # too young to judge: kept
    fresh_no_lock.mkdir()
    other = tmp_path / "app-ncu-notours"                            # not one of tool_tmpdir's names: kept
    other.mkdir()
    # Another program's folder named like ours by chance (app-build-2024-final), old, its "pid" dead: kept
    # (the name alone judges nothing: it holds files of its own); and one of ours in the same state that holds
    # more than the lock file's temporary name is kept too.
    theirs = tmp_path / f"app-build-{dead.pid}-final"
    (theirs / "sub").mkdir(parents=True)
    os.utime(theirs, (old, old))
    full = tmp_path / f"app-kernel-tool-ncu-{dead.pid}-full99"
    full.mkdir()
    (full / "profile.ncu-rep").write_text("")
    os.utime(full, (old, old))
    assert remove_stale_tmpdirs(str(tmp_path)) == [str(stale_no_lock)]
    assert theirs.is_dir() and full.is_dir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom app.runtime.profiling.tools import tool_tmpdir\n"
         "with tool_tmpdir('nsys', parent=sys.argv[1]) as t:\n    print(t, flush=True); time.sleep(60)\n",
         str(tmp_path)], stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        live = Path(holder.stdout.readline().strip())
        assert remove_stale_tmpdirs(str(tmp_path)) == []               # its maker lives
        assert live.is_dir() and fresh_no_lock.is_dir() and other.is_dir()
        holder.kill()
        holder.wait()
        assert remove_stale_tmpdirs(str(tmp_path)) == [str(live)]      # its maker is gone now
    finally:
        holder.kill()
        holder.wait()
