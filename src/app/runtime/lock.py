"""One profiling at a time per device (truth rule 7): a non-blocking file lock."""
from __future__ import annotations

import fcntl
import os
import tempfile
from contextlib import contextmanager

from app.errors import ProfileBusy


def lock_dir() -> str:
    return os.environ.get("APP_LOCK_DIR") or tempfile.gettempdir()


@contextmanager
def device_lock(device_key: str):
    path = os.path.join(lock_dir(), f"app-kernel-profile-{device_key}.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
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
