"""run_tool, the one place ncu and nsys run as child processes: how a child is stopped (a signal the moment
it has started, a timeout: SIGINT to its group first, which ncu answers by restoring the clocks it locked,
SIGKILL after a grace period) and what a failure line quotes. The children here are small real programs; the
signals are real, sent by a second process (tests/signals.py)."""
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from app.errors import AppError
from app.runtime.profiling import tools
from app.runtime.profiling.tools import run_tool
from tests.signals import sigint_default

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _script(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!" + sys.executable + "\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


def _alive(pid: int) -> bool:
    """Running (a zombie -- dead, not yet reaped -- is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def _wait_for(path: Path, seconds: float = 20) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.02)
    raise AssertionError(f"{path} was never written")


def _tool(tmp_path) -> str:
    """A stand-in tool: writes its pid, then sleeps; on SIGINT it notes it and exits (as ncu restores the
    clocks it locked and exits)."""
    return _script(tmp_path, "tool", f"""
        import os, signal, sys, time
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        def interrupted(*_):
            open({str(tmp_path / 'got')!r}, 'w').write('SIGINT')
            sys.exit(130)
        signal.signal(signal.SIGINT, interrupted)
        open({str(tmp_path / 'tool.pid')!r}, 'w').write(str(os.getpid()))
        time.sleep(60)
    """)


def test_a_signal_the_moment_the_child_starts_stops_it(tmp_path):
    """Ctrl-C between Popen and the wait (here: while the output readers start) used to leave the tool running,
    orphaned in its own session: the clean-up began only at the wait."""
    tool = _tool(tmp_path)
    marker = tmp_path / "in-window"
    parent = _script(tmp_path, "parent", f"""
        import sys, threading, time
        sys.path.insert(0, {SRC!r})
        from app.runtime.profiling.tools import run_tool
        start = threading.Thread.start
        def slow_start(self):     # hold the parent just after Popen returned, until it is interrupted
            if getattr(self, "_target", None) is not None and self._target.__name__.endswith("pump"):
                while not __import__("os").path.exists({str(tmp_path / 'tool.pid')!r}):
                    time.sleep(0.01)
                open({str(marker)!r}, "w").write("1")
                time.sleep(30)
            return start(self)
        threading.Thread.start = slow_start
        run_tool([{tool!r}], timeout=60, label="ncu test")
    """)
    proc = subprocess.Popen([sys.executable, parent], preexec_fn=sigint_default, stderr=subprocess.PIPE, text=True)
    pid = None
    try:
        _wait_for(marker)
        pid = int(_wait_for(tmp_path / "tool.pid"))
        proc.send_signal(__import__("signal").SIGINT)
        _, err = proc.communicate(timeout=30)
        assert "KeyboardInterrupt" in err                      # the interruption still propagates
        assert not _alive(pid), "the tool outlived the interrupted parent"
        assert (tmp_path / "got").read_text() == "SIGINT"       # and was interrupted, not killed outright
    finally:
        proc.kill()
        proc.wait()
        if pid is not None and _alive(pid):
            os.kill(pid, 9)


def test_a_timeout_interrupts_the_group_before_killing_it(tmp_path):
    tool = _tool(tmp_path)
    with pytest.raises(AppError, match="did not finish within 1 s"):
        run_tool([tool], timeout=1, label="ncu test")
    assert (tmp_path / "got").read_text() == "SIGINT"           # SIGINT first: ncu restores the clocks on it
    assert not _alive(int((tmp_path / "tool.pid").read_text()))


def test_a_child_ignoring_sigint_is_killed_after_the_grace_period(tmp_path, monkeypatch):
    monkeypatch.setattr(tools, "KILL_GRACE_S", 0.5)
    pids = tmp_path / "pids"
    tool = _script(tmp_path, "stubborn", f"""
        import os, signal, subprocess, sys, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                  "signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)"])
        open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(60)
    """)
    t0 = time.monotonic()
    with pytest.raises(AppError, match="did not finish within 1 s"):
        run_tool([tool], timeout=1, label="ncu test")
    assert time.monotonic() - t0 < 10
    for pid in map(int, pids.read_text().split()):              # the tool and what it started, its whole group
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid)


def test_an_error_line_with_exit_0_is_a_failure_quoting_it(tmp_path):
    tool = _script(tmp_path, "tool", """
        print('==PROF== Connected to process 1')
        print('==ERROR== Failed to profile "refine" in process 1')
        print('"ID","Kernel Name"')
    """)
    with pytest.raises(AppError) as exc:
        run_tool([tool], timeout=30, label="ncu test")
    msg = str(exc.value)
    assert msg.startswith("ncu test reported an error (exit 0) after ")
    assert msg.endswith(' s: ==ERROR== Failed to profile "refine" in process 1')        # the line, not the CSV


def test_a_failure_quotes_the_error_lines_first(tmp_path):
    tool = _script(tmp_path, "tool", """
        import sys
        print('==ERROR== LaunchFailed: an illegal memory access was encountered', flush=True)
        for i in range(5):
            print(f'warning {i}: NumbaPerformanceWarning: grid size 44', file=sys.stderr)
        sys.exit(1)
    """)
    with pytest.raises(AppError) as exc:
        run_tool([tool], timeout=30, label="ncu test")
    quoted = str(exc.value).split(" s: ", 1)[1].split(" | ")
    assert quoted[0] == "==ERROR== LaunchFailed: an illegal memory access was encountered"
    assert quoted[-1] == "warning 4: NumbaPerformanceWarning: grid size 44"      # then the last lines
    assert "failed (exit 1)" in str(exc.value)


def test_a_clean_run_returns_its_output(tmp_path):
    tool = _script(tmp_path, "tool", """
        import sys
        print('==WARNING== Note: Running with unmodified GPU clocks.')
        print('out'); print('err', file=sys.stderr)
    """)
    out, err = run_tool([tool], timeout=30, label="ncu test")
    assert out.splitlines()[-1] == "out" and err == "err\n"
