"""Finding ncu/nsys and running them as a subprocess with progress, a timeout and clear failures.

A tool's process dies with the profile that started it (``die_with_parent``): a profile killed
outright (SIGKILL, the OOM killer) releases its device lock at once, and a tool left running
would keep using the GPU under the next profile's lock. ``tool_tmpdir`` makes a temporary
folder that names its maker's pid and removes the folders of makers that have died.
"""
from __future__ import annotations

import fcntl
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager

from app.errors import AppError, CounterPermission, ToolNotFound

SEARCH_DIRS = ("/usr/local/cuda/bin", "/opt/nvidia/nsight-compute/*", "/opt/nvidia/nsight-systems/*/bin",
               "/usr/local/cuda/nsight-compute*", "/opt/nvidia/nsight-compute/*/host/target-linux-x64")


def find_tool(name: str, explicit: str | None = None) -> str:
    """--ncu/--nsys PATH, then $NCU/$NSYS, then PATH, then the usual CUDA install folders."""
    candidates = [explicit, os.environ.get(name.upper())]
    for c in candidates:
        if c:
            if os.path.isfile(c) and os.access(c, os.X_OK):
                return c
            raise ToolNotFound(f"{name} not found at {c!r}; pass --{name} PATH to an executable {name}")
    on_path = shutil.which(name)
    if on_path:
        return on_path
    for pattern in SEARCH_DIRS:
        for d in sorted(glob.glob(pattern), reverse=True):
            p = os.path.join(d, name)
            if os.path.isfile(p) and os.access(p, os.X_OK):
                return p
    raise ToolNotFound(f"{name} not found on PATH or in the CUDA folders; install Nsight "
                       f"{'Compute' if name == 'ncu' else 'Systems'}, or pass --{name} PATH or set {name.upper()}")


def tool_version(path: str) -> str | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for token in out.replace("(", " ").split():
        if token[:4].isdigit() and "." in token:
            return token
    return out.strip().splitlines()[-1] if out.strip() else None


PR_SET_PDEATHSIG = 1


def set_parent_death_signal(signum: int, parent: int | None = None) -> None:
    """Have this process get ``signum`` when its parent dies (Linux prctl PR_SET_PDEATHSIG; elsewhere nothing).

    Meant for a preexec_fn, between fork and exec. ``parent``: the pid of the process that forked (taken
    before the fork); where it died before the prctl, the signal is sent at once, as its death would have."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signum))
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signum)


def die_with_parent(parent: int | None = None):
    """A preexec_fn for a tool's process: SIGKILL when ``parent`` (default: this process) dies."""
    parent = os.getpid() if parent is None else parent
    return lambda: set_parent_death_signal(signal.SIGKILL, parent)


def run_tool(cmd: list[str], *, timeout: float, label: str, progress=None, env=None) -> tuple[str, str]:
    """Run ``cmd``; stream lines through ``progress``; return (stdout, stderr).

    Raises one clear AppError on a timeout, a counter-permission refusal, or a
    non-zero exit (with the last lines the tool or the worker printed). The tool runs
    in a process group of its own (a timeout or Ctrl-C stops the whole group) and is
    killed if this process dies (``die_with_parent``).
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                            start_new_session=True, env=env,
                            preexec_fn=die_with_parent() if sys.platform.startswith("linux") else None)
    # From here on the child exists: whatever interrupts this process (Ctrl-C, SIGTERM, an error starting
    # the readers) stops the child's group before it propagates, so no ncu outlives us.
    try:
        out_lines, err_lines = [], []
        start = time.monotonic()
        threads = [threading.Thread(target=_pump, args=(proc.stdout, out_lines, progress), daemon=True),
                   threading.Thread(target=_pump, args=(proc.stderr, err_lines, progress), daemon=True)]
        for t in threads:
            t.start()
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise AppError(f"{label} did not finish within {timeout:.0f} s and was stopped; "
                       f"raise the limit (--{label.split()[0]}-timeout) or profile smaller sizes") from None
    except BaseException:
        _kill(proc)
        raise
    for t in threads:
        t.join(timeout=5)
    stdout, stderr = "".join(out_lines), "".join(err_lines)
    both = stdout + stderr
    if "ERR_NVGPUCTRPERM" in both:
        raise CounterPermission(
            f"{label} may not read GPU performance counters (ERR_NVGPUCTRPERM): run as root, or load the "
            "driver with NVreg_RestrictProfilingToAdminUsers=0 (https://developer.nvidia.com/ERR_NVGPUCTRPERM)")
    lines = [l.strip() for l in both.splitlines() if l.strip() and not l.startswith("==PROF==")]
    errors = [l for l in lines if ERROR_LINE.match(l)]
    # ncu may exit 0 after "==ERROR== Failed to profile ..." with the kernel left out of its output: a
    # capture short of kernels is a failure, not a profile.
    reported = [l for l in errors if l.startswith("==ERROR==")]
    if proc.returncode != 0 or reported:
        # The cause first (an error line may sit on stdout above stderr's warnings), then the last lines
        # (none after an exit 0: those are the CSV), each cut to a readable length.
        quoted = errors[:3] + ([l for l in lines[-3:] if l not in errors[:3]] if proc.returncode != 0 else [])
        quoted = [l if len(l) <= 240 else l[:237] + "..." for l in quoted]
        what = f"failed (exit {proc.returncode})" if proc.returncode != 0 else "reported an error (exit 0)"
        raise AppError(f"{label} {what} after {time.monotonic() - start:.1f} s: "
                       + " | ".join(quoted or ["no output"]))
    return stdout, stderr


# A line that states a failure: ncu's ==ERROR==, nsys's "ERROR: ...", a Python exception's last line.
ERROR_LINE = re.compile(r"^(==ERROR==|ERROR\b|Error:|error:|\w+(Error|Exception): )")
# How long the child's group has after SIGINT before SIGKILL: ncu restores the clocks it locked
# (--clock-control base) when interrupted, not when killed.
KILL_GRACE_S = 5.0


def _pump(stream, sink, progress) -> None:
    for line in stream:
        sink.append(line)
        if progress:
            progress(line.rstrip("\n"))


def _signal_group(proc, sig) -> bool:
    """``sig`` to the child's process group; False when the group is gone."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        proc.send_signal(sig)
    return True


def _kill(proc) -> None:
    """Stop the child's process group: SIGINT, then SIGKILL after KILL_GRACE_S (or at once if this
    process is interrupted again meanwhile), and reap the child."""
    if not _signal_group(proc, signal.SIGINT):
        proc.wait()
        return
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    finally:
        _signal_group(proc, signal.SIGKILL)      # also what of the group outlived its leader
        proc.wait()


def progress_printer(prefix: str):
    """Show ncu's per-kernel progress (kernel n, passes) on stderr, one line each."""
    def show(line: str) -> None:
        if line.startswith("==PROF== Profiling") or line.startswith("==WARNING==") or line.startswith("==ERROR=="):
            print(f"{prefix}{line}", file=sys.stderr, flush=True)
    return show


# tool_tmpdir's folders: app-kernel-tool-<label>-<maker pid>-<random>, with a lock file the maker holds while it
# lives. The prefix is this tool's own: a sweeper must never match another program's app-* folder.
_TMP_PREFIX = "app-kernel-tool-"
_TMP_NAME = re.compile(r"^" + re.escape(_TMP_PREFIX) + r"[A-Za-z0-9_.]+-(\d+)-[A-Za-z0-9_]+$")
_TMP_LOCK = ".app-owner.lock"


def _stale(path: str, pid: int) -> bool:
    """True when ``path`` is one of our own folders whose maker is gone: its lock is free, or (no lock file
    yet: its maker died at once) its pid is dead."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.geteuid():
        return False
    try:
        fd = os.open(os.path.join(path, _TMP_LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            # A maker that is only now writing its lock file is alive; one that died before it left at most the
            # lock file's temporary name: anything more is not a folder of ours to judge by its name alone.
            try:
                return time.time() - st.st_mtime > 60 and set(os.listdir(path)) <= {_TMP_LOCK + ".new"}
            except OSError:           # gone meanwhile, or unreadable: nothing to judge
                return False
        except PermissionError:
            return False
        return False
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)     # free: its maker is gone (the kernel dropped its lock)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def remove_stale_tmpdirs(parent: str | None = None) -> list[str]:
    """Remove this user's tool_tmpdir folders (in ``parent``, default the temp folder) whose maker has died
    (killed outright, so its own clean-up never ran); return the folders removed."""
    parent = parent or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        m = _TMP_NAME.match(name)
        if m and int(m.group(1)) != os.getpid() and _stale(os.path.join(parent, name), int(m.group(1))):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
            removed.append(os.path.join(parent, name))
    return removed


@contextmanager
def tool_tmpdir(label: str, parent: str | None = None):
    """A temporary folder for one tool run (``app-kernel-tool-<label>-<pid>-<random>``), removed however the block
    ends; the stale folders of makers that died first are removed before it is made."""
    remove_stale_tmpdirs(parent)
    tmpdir = tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{re.sub(r'[^A-Za-z0-9_.]', '_', label)}-{os.getpid()}-",
                              dir=parent)
    fd = None
    try:
        # Locked under a temporary name, then renamed: a sweeper never finds the lock file free while we live.
        fd = os.open(os.path.join(tmpdir, _TMP_LOCK + ".new"), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                     0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(os.path.join(tmpdir, _TMP_LOCK + ".new"), os.path.join(tmpdir, _TMP_LOCK))
        yield tmpdir
    finally:
        if fd is not None:
            os.close(fd)
        shutil.rmtree(tmpdir, ignore_errors=True)
