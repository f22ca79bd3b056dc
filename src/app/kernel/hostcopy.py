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

import array
import ctypes
import functools
import hashlib
import itertools
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
    lib.hostcopy_stage.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int,
                                   ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    lib.hostcopy_stage.restype = ctypes.c_int
    lib.hostcopy_copy.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int]
    lib.hostcopy_copy.restype = ctypes.c_int
    lib.hostcopy_dmas.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64]
    lib.hostcopy_dmas.restype = ctypes.c_int
    return lib, f"compiled with {Path(cc).name}"


@functools.lru_cache(maxsize=1)
def driver_htod() -> int | None:
    """The address of the CUDA driver's cuMemcpyHtoDAsync_v2, which the library calls for each DMA."""
    try:
        return ctypes.cast(ctypes.CDLL("libcuda.so.1").cuMemcpyHtoDAsync_v2, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


BYTES, NARROW_I64 = 0, 1     # an array's kinds (hostcopy.c): copy its bytes, or int64 values to int32


def row_of(src: np.ndarray, pinned: np.ndarray, dev_ptr: int) -> tuple | None:
    """The library's row for one array, ``(source address, pinned address, device address, bytes written,
    kind)``, for a C-contiguous source with the pinned array's dtype, or int64 into int32; None for any other
    pair (numpy copies it). The library cuts the rows into slices and DMAs."""
    if not src.flags.c_contiguous or src.shape != pinned.shape:
        return None
    if src.dtype == pinned.dtype:
        kind = BYTES
    elif src.dtype == np.int64 and pinned.dtype == np.int32:
        kind = NARROW_I64
    else:
        return None
    return (src.ctypes.data, pinned.ctypes.data, dev_ptr, pinned.nbytes, kind)


NOT_STARTED = -1        # hostcopy_stage's answer when it could start no thread (or had no memory): nothing ran


def _table(rows: list[tuple]) -> array.array:
    """The rows as one buffer of uint64 words, the library's argument (one pointer for all of them)."""
    return array.array("Q", itertools.chain.from_iterable(rows))


def stage(lib, rows: list[tuple], slice_bytes: int, dma_bytes: int, threads: int, htod: int,
          stream_ptr: int) -> tuple[int, int]:
    """Write the arrays (``row_of``) into pinned memory on ``threads`` threads, in slices of ``slice_bytes`` taken
    in order, and send them to the device in DMAs of whole slices, from one slice for the first up to
    ``dma_bytes``, each queued on the stream as soon as its slices are in. Returns 0, NOT_STARTED, or the
    driver's error code (every copy has finished by then), and the number of DMAs. The interpreter's lock is
    released throughout."""
    table, dmas = _table(rows), ctypes.c_int(0)
    err = lib.hostcopy_stage(len(rows), table.buffer_info()[0], slice_bytes, dma_bytes, threads, htod, stream_ptr,
                             ctypes.byref(dmas))
    return err, dmas.value


def copy(lib, pairs: list[tuple[np.ndarray, np.ndarray]], slice_bytes: int, threads: int,
         dma_bytes: int | None = None) -> int:
    """The same sliced writes without a DMA, host array into host array (for tests)."""
    rows = []
    for src, dst in pairs:
        row = row_of(src, dst, 0)
        assert row is not None, "a pair row_of cannot copy"
        rows.append(row)
    # No device address: the copy stops at the pinned side.
    table = _table(rows)
    return lib.hostcopy_copy(len(rows), table.buffer_info()[0], slice_bytes, dma_bytes or 4 * slice_bytes, threads)
