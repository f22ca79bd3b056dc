"""One profiling at a time per device (truth rule 7): a non-blocking file lock keyed by the physical GPU.

The lock lives in a folder of the user's own: ``$APP_LOCK_DIR`` if set (point it
at a shared folder to serialise several users on one GPU), else
``$XDG_RUNTIME_DIR/app-kernel`` (private, per login), else
``~/.cache/app-kernel/locks``. The file is opened without following symbolic
links and must be a regular file owned by the user: a lock planted by someone
else is refused, never written through. The key is the GPU's UUID, so profiles on
two different GPUs (``CUDA_VISIBLE_DEVICES`` per worker) never refuse each other.
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
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


@contextmanager
def device_lock(device_key: str):
    path = os.path.join(lock_dir(), f"app-kernel-profile-{device_key}.lock")
    fd = _open_lock(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            raise ProfileBusy(f"another profile is running on {device_key} (pid {holder}, lock {path}); "
                              "wait for it to finish -- one profiling at a time per device") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield path
    finally:
        os.close(fd)  # closing releases the lock
