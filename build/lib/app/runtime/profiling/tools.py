"""Finding ncu/nsys and running them as a subprocess with progress, a timeout and clear failures."""
from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

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


def run_tool(cmd: list[str], *, timeout: float, label: str, progress=None, env=None) -> tuple[str, str]:
    """Run ``cmd``; stream lines through ``progress``; return (stdout, stderr).

    Raises one clear AppError on a timeout, a counter-permission refusal, or a
    non-zero exit (with the last lines the tool or the worker printed).
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                            start_new_session=True, env=env)
    out_lines, err_lines = [], []

    def pump(stream, sink):
        for line in stream:
            sink.append(line)
            if progress:
                progress(line.rstrip("\n"))

    threads = [threading.Thread(target=pump, args=(proc.stdout, out_lines), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, err_lines), daemon=True)]
    for t in threads:
        t.start()
    start = time.monotonic()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise AppError(f"{label} did not finish within {timeout:.0f} s and was stopped; "
                       f"raise the limit (--{label.split()[0]}-timeout) or profile smaller sizes") from None
    except KeyboardInterrupt:
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
    if proc.returncode != 0:
        tail = [l.strip() for l in both.splitlines() if l.strip() and not l.startswith("==PROF==")][-3:]
        raise AppError(f"{label} failed (exit {proc.returncode}) after {time.monotonic() - start:.1f} s: "
                       + " | ".join(tail or ["no output"]))
    return stdout, stderr


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def progress_printer(prefix: str):
    """Show ncu's per-kernel progress (kernel n, passes) on stderr, one line each."""
    def show(line: str) -> None:
        if line.startswith("==PROF== Profiling") or line.startswith("==WARNING==") or line.startswith("==ERROR=="):
            print(f"{prefix}{line}", file=sys.stderr, flush=True)
    return show
