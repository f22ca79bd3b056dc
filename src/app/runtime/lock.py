"""One profiling at a time per device (truth rule 7): a non-blocking file lock keyed by the physical GPU.

The lock lives in a folder of the user's own: ``$APP_LOCK_DIR`` if set (point it
at a shared folder to serialise several users on one GPU), else
``$XDG_RUNTIME_DIR/app-kernel`` (private, per login), else
``~/.cache/app-kernel/locks``. The file is opened without following symbolic
links and must be a regular file owned by the user: a lock planted by someone
else is refused, never written through. The key is the GPU's UUID, so profiles on
two different GPUs (``CUDA_VISIBLE_DEVICES`` per worker) never refuse each other.

One more lock spans the host: ``measurement_window`` lets one profile at a time run its
measured runs, whatever GPU it uses (see there why); it is waited for. It covers every
profile that shares the lock folder: all of yours, or every user's with a shared
``APP_LOCK_DIR``.

A busy device lock is refused at once, unless ``$APP_LOCK_WAIT`` gives seconds to wait for
it: a sweep's points set it, so two points routed to one device take turns.
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import sys
import time
from contextlib import contextmanager

from app.errors import LockUnusable, ProfileBusy


def device_key(selection) -> str:
    """'cpu', or 'gpu-<UUID>' of the GPU that runs (its PCI bus id where no UUID is known)."""
    if selection.selected != "gpu":
        return "cpu"
    info = selection.info or {}
    ident = info.get("uuid") or info.get("pci_bus_id") or f"index{info.get('index', 0)}"
    return "gpu-" + re.sub(r"[^A-Za-z0-9_.-]", "_", str(ident))


def _private(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def lock_dir() -> str:
    explicit = os.environ.get("APP_LOCK_DIR")
    if explicit:
        if not os.path.isdir(explicit) or not os.access(explicit, os.W_OK | os.X_OK):
            raise LockUnusable(f"APP_LOCK_DIR={explicit} is not a writable folder; create it, or unset "
                               "APP_LOCK_DIR to use a private folder")
        return explicit
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = os.path.join(runtime, "app-kernel") if runtime and _private(runtime) else \
        os.path.join(os.path.expanduser("~"), ".cache", "app-kernel", "locks")
    try:
        os.makedirs(base, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise LockUnusable(f"cannot create the lock folder {base} ({exc.strerror}); set APP_LOCK_DIR to a writable "
                           "folder") from None
    return base


def _open_lock(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LockUnusable(f"the lock {path} is a symbolic link, which is refused; remove it") from None
        raise LockUnusable(f"cannot open the lock {path} ({exc.strerror}); it may belong to another user: remove "
                           "it, or set APP_LOCK_DIR to a folder of your own") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise LockUnusable(f"the lock {path} is not a regular file owned by you (owner uid {st.st_uid}); remove it, "
                           "or set APP_LOCK_DIR to a folder of your own")
    return fd


def lock_wait() -> float:
    """Seconds to wait for a busy lock ($APP_LOCK_WAIT; 0, the default, refuses at once)."""
    raw = os.environ.get("APP_LOCK_WAIT", "").strip()
    if not raw:
        return 0.0
    try:
        wait = float(raw)
    except ValueError:
        wait = -1.0
    if not wait >= 0 or wait == float("inf"):
        raise LockUnusable(f"APP_LOCK_WAIT={raw!r} is not a number of seconds >= 0; fix or unset it")
    return wait


def _acquire(fd: int, path: str, device_key: str, wait: float) -> None:
    deadline = time.monotonic() + wait
    said = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        if time.monotonic() >= deadline:
            waited = f" after waiting {wait:g} s" if wait else ""
            raise ProfileBusy(f"another profile is running on {device_key} (pid {holder}, lock {path}){waited}; "
                              "wait for it to finish -- one profiling at a time per device") from None
        if not said:
            print(f"waiting for {device_key}: pid {holder} is profiling on it", file=sys.stderr, flush=True)
            said = True
        time.sleep(0.1)  # pragma: no mutate  (a poll interval: a longer one passes every test, only slower)


@contextmanager
def device_lock(device_key: str, wait: float | None = None):
    """Hold the device's lock; a busy one is waited for ``wait`` seconds (default: $APP_LOCK_WAIT, else 0)."""
    path = os.path.join(lock_dir(), f"app-kernel-profile-{device_key}.lock")
    wait = lock_wait() if wait is None else wait
    fd = _open_lock(path)
    try:
        _acquire(fd, path, device_key, wait)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield path
    finally:
        os.close(fd)  # closing releases the lock


# Long enough for any one profile's measured runs (--bench_runs auto stops at 10 s of runs).
WINDOW_WAIT_SECONDS = 900.0


@contextmanager
def measurement_window(wait: float | None = None):
    """Hold the host's measurement window: the measured runs of one profile at a time on this host.

    Profiles on different GPUs still share the host's cores, memory bandwidth and PCIe root, and
    these plans are host-bound end to end: four sweep points timed side by side on four H200s
    measured up to 2.3x their lone end-to-end times. Everything else a profile does (inputs,
    compiling, verification, the report) runs concurrently; only the measured runs take turns.
    Yields a dict whose ``waited_seconds`` says how long this profile waited for its turn."""
    wait = max(lock_wait(), WINDOW_WAIT_SECONDS) if wait is None else wait
    t0 = time.monotonic()
    with device_lock("host-measurement-window", wait=wait):
        yield {"waited_seconds": round(time.monotonic() - t0, 3)}
