"""The compiled half of pinned staging (``hostcopy.c``): built on first use with the system's C compiler,
cached, loaded with ctypes.

``load()`` answers the library, or None and the reason it could not be had (no compiler, a failed build,
``APP_HOST_COPY=numpy`` in the environment): staging then copies with numpy on Python threads, and says
which way it ran in its metadata. The library is cached under the tool's cache directory by a hash of its
source, the compiler's version and the machine's architecture, so a changed source or compiler builds it
again; a build is written to a temporary name and renamed, so processes that build at once never load half
a file.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from app.runtime import cache

SOURCE = Path(__file__).with_name("hostcopy.c")
DISABLE_ENV = "APP_HOST_COPY"       # "numpy": stage with numpy copies on Python threads instead
_u64p = ctypes.POINTER(ctypes.c_uint64)
_loaded: tuple | None = None        # (library or None, why), once per process


def load() -> tuple[ctypes.CDLL | None, str]:
    """(library, how it was had) or (None, why not)."""
    global _loaded
    if os.environ.get(DISABLE_ENV, "").lower() == "numpy":
        return None, f"{DISABLE_ENV}=numpy is set"
    if _loaded is None:
        _loaded = _build_and_load()
    return _loaded


def _build_and_load() -> tuple[ctypes.CDLL | None, str]:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None, "no C compiler found (set CC, or install gcc) to build the compiled host copy"
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"the C compiler {cc} did not run ({exc})"
    source = SOURCE.read_bytes()
    # The machine's architecture too: a home directory shared between x86-64 and Arm hosts holds one of each.
    key = hashlib.sha256(source + version.encode() + platform.machine().encode()).hexdigest()[:16]
    lib_path = cache.cache_dir("hostcopy") / f"hostcopy-{key}.so"
    if not lib_path.exists():
        lib_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=lib_path.parent, prefix=".hostcopy-", suffix=".so")
        os.close(fd)
        cmd = [cc, "-O2", "-shared", "-fPIC", "-pthread", "-o", tmp, str(SOURCE)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as exc:
            os.unlink(tmp)
            return None, f"building the compiled host copy failed ({exc})"
        if done.returncode:
            os.unlink(tmp)
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            return None, f"building the compiled host copy with {cc} failed: {last}"
        os.replace(tmp, lib_path)
    try:
        lib = ctypes.CDLL(str(lib_path))
    except OSError as exc:
        return None, f"the compiled host copy {lib_path} did not load ({exc})"
    lib.hostcopy_stage.argtypes = [ctypes.c_int, _u64p, _u64p, _u64p, _u64p, _u64p, ctypes.c_int,
                                   ctypes.c_void_p, ctypes.c_void_p]
    lib.hostcopy_stage.restype = ctypes.c_int
    lib.hostcopy_copy.argtypes = [ctypes.c_int, _u64p, _u64p, _u64p, _u64p, ctypes.c_int]
    lib.hostcopy_copy.restype = ctypes.c_int
    return lib, f"compiled with {Path(cc).name}"


@functools.lru_cache(maxsize=1)
def driver_htod() -> int | None:
    """The address of the CUDA driver's cuMemcpyHtoDAsync_v2, which the library calls for each chunk."""
    try:
        return ctypes.cast(ctypes.CDLL("libcuda.so.1").cuMemcpyHtoDAsync_v2, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


BYTES, NARROW_I64 = 0, 1     # a chunk's kinds (hostcopy.c): copy its bytes, or int64 values to int32


def _columns(chunks: list[tuple], fields: tuple[int, ...]) -> list:
    """A pointer to each of the chunks' ``fields`` as a uint64 array, the library's arguments (each pointer
    keeps its array alive)."""
    table = np.ascontiguousarray(np.array(chunks, dtype=np.uint64).reshape(-1, 5)[:, fields].T)
    return [row.ctypes.data_as(_u64p) for row in table]


def chunks_of(src: np.ndarray, pinned: np.ndarray, dev_ptr: int, chunk_bytes: int) -> list[tuple] | None:
    """``src``'s chunks, ``(source address, pinned address, device address, bytes written, kind)``, for a
    C-contiguous source with the pinned array's dtype, or int64 into int32; None for any other pair (numpy
    copies it)."""
    if not src.flags.c_contiguous or src.shape != pinned.shape:
        return None
    if src.dtype == pinned.dtype:
        kind, ratio = BYTES, 1
    elif src.dtype == np.int64 and pinned.dtype == np.int32:
        kind, ratio = NARROW_I64, 2
    else:
        return None
    step = chunk_bytes - chunk_bytes % 8
    return [(src.ctypes.data + lo * ratio, pinned.ctypes.data + lo, dev_ptr + lo, min(step, pinned.nbytes - lo), kind)
            for lo in range(0, pinned.nbytes, step)]


NOT_STARTED = -1        # hostcopy_stage's answer when it could start no thread (or had no memory): nothing ran


def stage(lib, chunks: list[tuple], threads: int, htod: int, stream_ptr: int) -> int:
    """Write each chunk (``chunks_of``) into pinned memory on ``threads`` threads and queue its DMA on the
    stream as soon as it is in. Returns 0, NOT_STARTED, or the driver's error code (every copy has finished
    by then). The interpreter's lock is released throughout."""
    return lib.hostcopy_stage(len(chunks), *_columns(chunks, (0, 1, 2, 3, 4)), threads, htod, stream_ptr)


def copy(lib, pairs: list[tuple[np.ndarray, np.ndarray]], chunk_bytes: int, threads: int) -> int:
    """The same chunked writes without a DMA, host array into host array (for tests)."""
    chunks = []
    for src, dst in pairs:
        got = chunks_of(src, dst, 0, chunk_bytes)
        assert got is not None, "a pair chunks_of cannot copy"
        chunks += got
    # No device address: the copy stops at the pinned side.
    return lib.hostcopy_copy(len(chunks), *_columns(chunks, (0, 1, 3, 4)), threads)
