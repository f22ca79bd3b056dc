"""One sweep point, run where a Dask worker (or the sweep itself) calls ``run_point``.

The point is an ordinary profile: ``python -m app.kernel <kernel> <version> ...`` in a
child process, so it takes the same code path, the same device lock (keyed by the GPU
the worker sees, which under ``local-cuda`` is the worker's own) and writes the same
folder. The folder's files travel back to the sweep in the result, so workers on other
machines need no shared filesystem. The child dies with the worker (PR_SET_PDEATHSIG):
a killed worker never leaves a profile running on a GPU.

The profile's own device lock covers its timed runs, but not its start-up, input
generation or report drawing, which burn host CPU. Two points that would share a device
therefore also share a whole-point lock (``point_lock_key``), so no point's timed runs
ever overlap another point's work on the same device; on a CPU sweep that means one point
at a time, whatever the number of workers.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.runtime.profiling.tools import set_parent_death_signal

# A point waits this long for its device's lock: points routed to one device take turns.
LOCK_WAIT_SECONDS = 3600
_TAIL = 2000
# Set in a worker the sweep started, which ignores SIGINT (app.sweep.workers): its profile children get it back.
_SIGINT_TO_CHILDREN = False


def restore_sigint_in_children() -> None:
    global _SIGINT_TO_CHILDREN
    _SIGINT_TO_CHILDREN = True


def _die_with_parent() -> None:           # runs in the child between fork and exec (Linux)
    if _SIGINT_TO_CHILDREN:               # an ignored signal stays ignored across exec: a Ctrl-C stops the profile
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    set_parent_death_signal(signal.SIGTERM)                          # PR_SET_PDEATHSIG


def _scratch() -> str | None:
    """Where a point's profile is written before its files are read back: the Dask worker's own directory. Dask
    removes it as the worker closes, and a worker starting on the node removes those of workers that died (their
    locks are free), so a worker killed mid-point leaves no folder behind for good. None outside a worker: the
    system's temporary directory, whose folder the point removes itself."""
    try:
        from distributed import get_worker

        return get_worker().local_directory
    except (ImportError, ValueError):
        return None


def _where() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return "local"


def point_lock_key(device: str) -> str:
    """The device a point will run on, as far as the worker knows before the profile picks it:
    the CPU, or the first GPU this worker sees (its own one under local-cuda)."""
    if device == "cpu":
        return "sweep-point-cpu"
    visible = (os.environ.get("CUDA_VISIBLE_DEVICES") or "default").split(",")[0].strip() or "default"
    return "sweep-point-gpu-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in visible)


def sweep_environment() -> dict:
    """What the sweep's own shell has for the variables a Dask nanny sets in its workers.

    A nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536 and OMP/MKL/OPENBLAS_NUM_THREADS=1.
    The first alone made a 2k-point CPU join 17x slower (glibc then maps and unmaps every array
    over 128 KiB): a point must be profiled as the CLI run from the user's shell would be, so the
    child gets the sweep's values back (None: unset)."""
    names = {"MALLOC_TRIM_THRESHOLD_", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"}
    try:
        import importlib

        import dask

        importlib.import_module("distributed")          # registers the distributed.* config

        for key in ("pre-spawn-environ", "environ"):
            names |= set(dask.config.get(f"distributed.nanny.{key}", default={}) or {})
    except ImportError:
        pass
    return {name: os.environ.get(name) for name in sorted(names)}


def run_point(args: list[str], timeout: float, device: str = "auto", environment: dict | None = None) -> dict:
    """Profile one point; return its exit status, stderr's tail and its profile folder's files.

    ``environment``: variables to set (or, with None, unset) in the profile's process."""
    from app.runtime.lock import device_lock

    t0 = time.perf_counter()
    with device_lock(point_lock_key(device), wait=LOCK_WAIT_SECONDS):
        waited = time.perf_counter() - t0
        result = _run(args, timeout, environment or {}, device)
    # Waits for a device another point held: expected where points share a device (CPU sweeps,
    # --cluster local on one GPU), never under local-cuda, where each worker has its own GPU.
    result["queued_seconds"] = round(waited, 3)
    result["profile_waited_for_lock"] = any(f"waiting for {d}" in result.get("stderr", "") for d in ("gpu-", "cpu:"))
    return result


def child_environment(device: str, environment: dict) -> dict:
    """The profile's environment: this worker's, with ``environment`` applied (None: unset).

    A GPU profile uses one GPU, the first its worker sees (under local-cuda the worker's own: dask-cuda
    lists it first, then the node's other GPUs). The profile is shown that one only: it cannot pick
    another, and its CUDA start-up does not initialise the rest of the node's GPUs."""
    env = dict(os.environ, APP_LOCK_WAIT=str(LOCK_WAIT_SECONDS))
    for name, value in environment.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    if device != "cpu" and "," in visible:
        env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[0].strip()
    return env


def _run(args: list[str], timeout: float, environment: dict, device: str) -> dict:
    out = tempfile.mkdtemp(prefix="app-kernel-sweep-", dir=_scratch())
    env = child_environment(device, environment)
    result = {"worker": _where(), "host": socket.gethostname(), "files": {}, "profile_name": None,
              "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "app.kernel", *args, "--out", out], capture_output=True,
                              text=True, timeout=timeout, env=env,
                              preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        result |= {"rc": proc.returncode, "stderr": proc.stderr[-_TAIL:], "stdout": proc.stdout[-_TAIL:]}
        folder = _profile_folder(proc.stdout)
        if folder is not None:
            result["profile_name"] = folder.name
            result["files"] = {str(f.relative_to(folder)): f.read_bytes() for f in folder.rglob("*") if f.is_file()}
    except subprocess.TimeoutExpired as exc:
        tail = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        result |= {"rc": None, "stderr": f"{tail[-_TAIL:]}\nstopped after the point timeout of {timeout:g} s"}
    finally:
        shutil.rmtree(out, ignore_errors=True)
    result["seconds"] = time.perf_counter() - t0
    return result


def _profile_folder(stdout: str) -> Path | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith("profile: "):
            path = Path(line[len("profile: "):].strip())
            return path if path.is_dir() else None
    return None


def failure_line(result: dict) -> str:
    """The one line that says why a point failed (its last error line, else its exit status)."""
    if result.get("rc") is None and "timeout" in result.get("stderr", ""):
        return result["stderr"].strip().splitlines()[-1]
    for line in reversed(result.get("stderr", "").strip().splitlines()):
        if line.startswith("error:") or "Error" in line:
            return line.strip()
    return f"exit status {result.get('rc')}"
