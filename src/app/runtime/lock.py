"""One profiling at a time per device (truth rule 7): a non-blocking file lock keyed by the physical GPU.

The lock lives in ``$APP_LOCK_DIR`` if set, else in a folder of the user's own:
``$XDG_RUNTIME_DIR/app-kernel`` (private, per login), else ``~/.cache/app-kernel/locks``.
The file is opened without following symbolic links and must be a regular file with one
link. In the user's own folder it must also be owned by the user: a lock planted by
someone else is refused, never written through. ``APP_LOCK_DIR`` is the way to serialise
several users on one GPU: there a lock is created readable and writable by all (mode 0666,
whatever the umask) and one made by another user is used as it is (a lock needs only read
access; the holder's pid is written where the file is writable). The key is the GPU's
UUID, so profiles on two different GPUs (``CUDA_VISIBLE_DEVICES`` per worker) never refuse
each other. scripts/lock-gpu-clock.sh and reset-gpu-clock.sh take the same lock (the
folder rule is mirrored in scripts/smi-common.sh): no clock change lands in a profile.

A lock file is never to be removed while someone may hold it: in a folder others can write,
a profile that opened the old file and one that made a new file would both hold "the" lock.
Messages therefore name the holder (pid and uid) and never say "remove it".

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

# The host-wide measurement window's key (its lock file's name); never shown to the user.
WINDOW_KEY = "host-measurement-window"
# A lock file holds a pid: anything larger is not one of ours, and is never truncated.
_MAX_LOCK_BYTES = 64


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


def lock_path(key: str) -> str:
    """The lock file of ``key`` ('cpu', 'gpu-<UUID>', ...) in this user's lock folder."""
    return os.path.join(lock_dir(), f"app-kernel-profile-{key}.lock")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:          # another user's process: alive
        return True
    return True


def _flock_pids(st: os.stat_result) -> list[int]:
    """Pids /proc/locks names as holding a flock on the file ``st`` describes (the kernel's own word)."""
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    exact = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids, by_inode = [], []
    for line in lines:
        parts = line.split()         # 1: FLOCK  ADVISORY  WRITE 1234 fe:00:2146618 0 EOF  (a waiter has '->')
        if len(parts) < 6 or parts[1] != "FLOCK" or not parts[4].isdigit() or int(parts[4]) <= 0:
            continue
        if parts[5] == exact:
            pids.append(int(parts[4]))
        elif parts[5].rsplit(":", 1)[-1] == str(st.st_ino):     # an overlay may show another device
            by_inode.append(int(parts[4]))
    return pids or by_inode


def _uid_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def holder(fd: int) -> tuple[int | None, int | None]:
    """(pid, uid) of the process that holds the lock on ``fd``'s file, as far as can be told.

    The pid written in the file and the pids /proc/locks names are tried, a live one first: the
    file may hold an earlier holder's pid (a user who could only read the file cannot write
    theirs), and /proc/locks names the process that took the lock (for the clock scripts, a
    flock(1) that has exited)."""
    try:
        raw = os.pread(fd, _MAX_LOCK_BYTES, 0).decode(errors="replace").strip()
    except OSError:
        raw = ""
    written = [int(raw)] if raw.isdigit() and 0 < int(raw) < 1 << 22 else []
    candidates = _flock_pids(os.fstat(fd)) + written
    for pid in candidates:
        if _alive(pid):
            return pid, _uid_of(pid)
    return (candidates[0], None) if candidates else (None, None)


def _held(st: os.stat_result) -> bool | None:
    """Does any process hold a flock on this file now (/proc/locks; None where it cannot be read)?"""
    try:
        with open("/proc/locks") as f:
            text = f.read()
    except OSError:
        return None
    return any(len(p) >= 6 and p[1] == "FLOCK" and p[5].rsplit(":", 1)[-1] == str(st.st_ino)
               for p in (line.split() for line in text.splitlines()))


def _holder_text(fd: int) -> str:
    held = _held(os.fstat(fd))
    if held is False:
        return "no process holds it now"
    pid, uid = holder(fd)
    if pid is None or held is None and not _alive(pid):
        return "whether a process holds it cannot be told"
    return f"it is held by pid {pid}" + (f" (uid {uid})" if uid is not None else "")


def _refuse_unusable(path: str, st: os.stat_result, what: str) -> LockUnusable:
    return LockUnusable(f"the lock {path} {what} (owner uid {st.st_uid}); it is not used: set APP_LOCK_DIR to a "
                        "folder of your own, or ask its owner to look at it")


def _open_lock(path: str, shared: bool) -> int:
    """Open (or make) the lock file ``path``. ``shared``: it lives in an explicit $APP_LOCK_DIR."""
    flags = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY   # O_NONBLOCK: a planted FIFO never hangs
    fd = None
    created = False
    for _ in range(10):
        try:
            # First without O_CREAT: fs.protected_regular refuses O_CREAT on another user's file in a sticky folder.
            fd = os.open(path, os.O_RDWR | flags)
            break
        except FileNotFoundError:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | flags, 0o600)
                created = True
                break
            except FileExistsError:
                continue                      # made meanwhile by another profile: open that one
            except OSError as exc:
                raise LockUnusable(f"cannot create the lock {path} ({exc.strerror}); set APP_LOCK_DIR to a writable "
                                   "folder") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise LockUnusable(f"the lock {path} is a symbolic link, which is refused (no lock is ever held "
                                   "through one); remove the link") from None
            if exc.errno not in (errno.EACCES, errno.EPERM):
                raise LockUnusable(f"cannot open the lock {path} ({exc.strerror})") from None
            try:                              # flock needs read access only
                fd = os.open(path, os.O_RDONLY | flags)
                break
            except OSError:
                try:
                    st = os.stat(path, follow_symlinks=False)
                    owner = f"uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}"
                except OSError:
                    owner = "owner unknown"
                raise LockUnusable(f"cannot open the lock {path} ({exc.strerror}; {owner}): it belongs to another "
                                   "user who made it private; they can share it with chmod a+rw on it, or set "
                                   "APP_LOCK_DIR to a folder of your own") from None
    else:
        raise LockUnusable(f"cannot open the lock {path}: it keeps appearing and disappearing; something else is "
                           "removing lock files in that folder")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse_unusable(path, st, "is not a regular file")
        if st.st_nlink != 1:
            raise _refuse_unusable(path, st, f"has {st.st_nlink} hard links, so it may be another file")
        if st.st_size > _MAX_LOCK_BYTES:
            raise _refuse_unusable(path, st, f"holds {st.st_size} bytes, so it is not a lock file")
        if st.st_uid != os.geteuid() and not shared:
            raise LockUnusable(f"the lock {path} is not a regular file owned by you (owner uid {st.st_uid}), in "
                               f"your own lock folder, so it is not used; {_holder_text(fd)}: once no profile of "
                               f"uid {st.st_uid} runs it can go, or set APP_LOCK_DIR to a folder shared with that "
                               "user to take turns")
        if created:
            os.fchmod(fd, 0o666 if shared else 0o600)     # explicit: a umask must not make a shared lock private
    except BaseException:
        os.close(fd)
        raise
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
    window = device_key == WINDOW_KEY
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pid, uid = holder(fd)
        pid_text = f"pid {pid if pid is not None else '?'}"
        who = pid_text + (f", uid {uid}" if uid is not None else "")
        if time.monotonic() >= deadline:
            waited = f" after waiting {wait:g} s" if wait else ""
            if window:
                raise ProfileBusy(
                    f"another profile on this host ({who}) was still in its measured runs{waited}; measured runs "
                    "take turns host-wide, so that no profile is timed beside another: try again when it is done, "
                    f"or set APP_LOCK_WAIT to wait longer (lock {path})") from None
            raise ProfileBusy(f"another profile is running on {device_key} ({who}, lock {path}){waited}; "
                              "wait for it to finish -- one profiling at a time per device") from None
        if not said:
            if window:
                print(f"waiting for another profile on this host ({who}) to finish its measured runs: measured "
                      f"runs take turns host-wide; waiting up to {wait:g} s (set APP_LOCK_WAIT to wait longer)",
                      file=sys.stderr, flush=True)
            else:
                print(f"waiting for {device_key}: {pid_text} is profiling on it"
                      + (f" (uid {uid})" if uid is not None else "") + f"; waiting up to {wait:g} s (APP_LOCK_WAIT)",
                      file=sys.stderr, flush=True)
            said = True
        time.sleep(0.1)  # pragma: no mutate  (a poll interval: a longer one passes every test, only slower)


@contextmanager
def device_lock(device_key: str, wait: float | None = None):
    """Hold the device's lock; a busy one is waited for ``wait`` seconds (default: $APP_LOCK_WAIT, else 0)."""
    path = lock_path(device_key)
    wait = lock_wait() if wait is None else wait
    fd = _open_lock(path, shared=bool(os.environ.get("APP_LOCK_DIR")))
    try:
        _acquire(fd, path, device_key, wait)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError:           # opened read-only (another user's lock in a shared folder): /proc/locks still names us
            pass
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
    It is waited for WINDOW_WAIT_SECONDS, or $APP_LOCK_WAIT where that is longer.
    Yields a dict whose ``waited_seconds`` says how long this profile waited for its turn."""
    wait = max(lock_wait(), WINDOW_WAIT_SECONDS) if wait is None else wait
    t0 = time.monotonic()
    with device_lock(WINDOW_KEY, wait=wait):
        yield {"waited_seconds": round(time.monotonic() - t0, 3)}


def _main(argv: list[str]) -> int:
    """``python -m app.runtime.lock path KEY``: print the lock file this user's profiles use for KEY."""
    if len(argv) != 2 or argv[0] != "path":
        print("usage: python -m app.runtime.lock path KEY   (KEY: cpu, or gpu-<UUID> as the GPU's UUID)",
              file=sys.stderr)
        return 64
    try:
        print(lock_path(argv[1]))
    except LockUnusable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
