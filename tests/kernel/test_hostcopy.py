"""The compiled host copy of pinned staging (app.kernel.hostcopy), on the host alone: every byte written,
int64 offsets narrowed exactly, pairs it cannot copy declined, and the build and its fallbacks, with real
second processes where a promise involves one (a forked child, two processes building the library at once).
Its DMA half is checked here with a stand-in for the driver's copy function, and on the GPU in
tests/kernel/test_staging.py."""
import ctypes
import multiprocessing
import os
import shutil
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from app.kernel import hostcopy
from tests.staging_rule import expected_dmas


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process that has not loaded the library yet, with an empty cache."""
    monkeypatch.setattr(hostcopy, "_loaded", None)
    monkeypatch.setenv("APP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(hostcopy.DISABLE_ENV, raising=False)
    return tmp_path / "cache" / "hostcopy"


def _no_compiler() -> bool:
    """Whether this machine has no C compiler for hostcopy to use: none named by CC or on PATH (as hostcopy looks
    for one), or CC naming a program that does not exist. A compiler that exists but fails is not this."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    return not cc or shutil.which(cc) is None


def _skip_without_compiler(how: str) -> None:
    """The compiled copy is optional: without a C compiler the tool stages with numpy (tested in
    tests/kernel/test_staging.py). Its own tests then have nothing to test, and say why."""
    if _no_compiler():
        pytest.skip(f"no C compiler here, so no compiled host copy to test ({how}); the tool copies with numpy")


def _lib():
    lib, how = hostcopy.load()
    if lib is None:
        _skip_without_compiler(how)
    assert lib is not None, f"the compiled host copy did not build here: {how}"
    return lib


@pytest.mark.parametrize("threads", [1, 3, 16])
def test_every_byte_is_written_across_chunk_edges_and_alignments(threads):
    """Sizes around the 16/32-byte bodies and the 64/128-byte unrolled loops, sources and targets off their
    alignment, chunk edges inside rows, more threads than chunks."""
    lib = _lib()
    rng = np.random.default_rng(threads)
    for n in (0, 1, 15, 63, 64, 127, 129, 1000, 100_003):
        for src_off, dst_off in ((0, 0), (3, 0), (0, 5), (7, 9)):
            a = rng.integers(0, 256, n + src_off, dtype=np.uint8)[src_off:]
            b = np.zeros(n + dst_off, np.uint8)[dst_off:]
            for chunk in (8, 1000, 1 << 20):
                b[:] = 0
                assert hostcopy.copy(lib, [(a, b)], chunk, threads) == 0
                np.testing.assert_array_equal(b, a, err_msg=f"n={n} offsets={src_off},{dst_off} chunk={chunk}")


def test_int64_offsets_are_narrowed_to_int32_exactly():
    """The kernels' offsets: every value of int32's range, negatives and both ends included, and targets that
    start off a 16-byte boundary (the streamed body starts after a scalar head)."""
    lib = _lib()
    rng = np.random.default_rng(0)
    for n in (1, 3, 4, 5, 17, 4099, 250_001):
        for dst_off in (0, 1, 2, 3):
            src = rng.integers(-2**31, 2**31, n, dtype=np.int64)
            src[: min(n, 2)] = [-2**31, 2**31 - 1][: min(n, 2)]
            dst = np.zeros(n + dst_off, np.int32)[dst_off:]
            coords, coords_out = rng.standard_normal((n, 2)), np.zeros((n, 2))
            assert hostcopy.copy(lib, [(src, dst), (coords, coords_out)], 1024, 4) == 0
            np.testing.assert_array_equal(dst, src.astype(np.int32))
            np.testing.assert_array_equal(coords_out, coords)


def test_pairs_the_copy_cannot_make_are_left_to_numpy():
    a = np.arange(10, dtype=np.float64)
    assert hostcopy.row_of(a[::2], np.zeros(5), 0) is None                       # strided
    assert hostcopy.row_of(a, np.zeros(10, np.float32), 0) is None              # a cast it does not make
    assert hostcopy.row_of(a, np.zeros(11), 0) is None                          # another shape
    src, dst = np.arange(10, dtype=np.int64), np.zeros(10, np.int32)
    assert hostcopy.row_of(src, dst, 1000) == (src.ctypes.data, dst.ctypes.data, 1000, 40, hostcopy.NARROW_I64)
    assert hostcopy.row_of(a, np.zeros(10), 7)[3:] == (80, hostcopy.BYTES)


def test_dmas_are_counted_as_the_library_cuts_them():
    """Each DMA is a copy of its own, and the build counts them from the library: the first DMA of a call is one
    slice, each next twice the last up to the DMA size, an array's last shorter, and an empty array has none."""
    lib = _lib()

    def count(sizes, slice_bytes, dma_bytes):
        table = hostcopy._table([(0, 0, 0, n, hostcopy.BYTES) for n in sizes])    # alive through the call
        return lib.hostcopy_dmas(len(sizes), table.buffer_info()[0], slice_bytes, dma_bytes)

    assert count([40], 16, 64) == 2                          # 16, then 24 of a 32
    assert count([40], 20, 64) == 2 and count([40], 8, 8) == 5 and count([40], 3, 3) == 5
    assert count([0, 48, 1], 16, 16) == 4 and count([], 16, 64) == 0
    assert count([7 << 20], 1 << 20, 4 << 20) == 3          # 1, 2 and 4 MiB
    assert count([1 << 20, 1 << 20], 256 << 10, 1 << 20) == 4   # 256 + 512 + 256 KiB, then 1 MiB: the ramp goes on
    for sizes in ([1000, 1, 0, 70_000], [5 << 20], [3, 3, 3]):
        assert count(sizes, 4096, 65536) == len(expected_dmas(sizes, 4096, 65536))


@pytest.mark.parametrize("threads", [1, 3, 16])
def test_each_dma_sends_whole_written_slices_in_the_ramp(threads):
    """The DMA function is called once per run of slices, only once every byte of the run is in pinned memory,
    and the runs tile each array in the ramp's sizes. The test's own function stands in for the driver's: it
    checks the run's bytes at the moment its DMA is queued."""
    lib = _lib()
    rng = np.random.default_rng(threads)
    src = [rng.integers(0, 256, 1_000_003, dtype=np.uint8), rng.integers(-2**31, 2**31, 50_001, dtype=np.int64),
           rng.standard_normal(70_000)]
    pinned = [np.zeros(1_000_003, np.uint8), np.zeros(50_001, np.int32), np.zeros(70_000)]
    want = [src[0], src[1].astype(np.int32), src[2]]
    base = [1 << 40, 2 << 40, 3 << 40]            # fake device addresses: which array, and where in it
    rows = [hostcopy.row_of(s, p, b) for s, p, b in zip(src, pinned, base)]
    calls, bad = [], []

    def dma(dst, host, nbytes, stream):
        a = dst >> 40
        lo = dst - base[a - 1]
        calls.append((a - 1, lo, nbytes))
        got, expected = pinned[a - 1].view(np.uint8)[lo:lo + nbytes], want[a - 1].view(np.uint8)[lo:lo + nbytes]
        if host != pinned[a - 1].ctypes.data + lo or not np.array_equal(got, expected):
            bad.append((a - 1, lo, nbytes))
        return 0

    htod = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)(dma)
    err, dmas = hostcopy.stage(lib, rows, 4096, 65536, threads, ctypes.cast(htod, ctypes.c_void_p).value, 0)
    assert err == 0 and not bad, bad[:3]
    assert sorted(calls) == expected_dmas([p.nbytes for p in pinned], 4096, 65536) and dmas == len(calls)
    for p, w in zip(pinned, want):
        np.testing.assert_array_equal(p, w)


def _child_copies(result):
    lib = _lib()
    a = np.arange(3_000_000, dtype=np.float64)
    b = np.zeros_like(a)
    result.put(hostcopy.copy(lib, [(a, b)], 1 << 16, 4) == 0 and bool(np.array_equal(a, b)))


def _a_forked_child_copies(timeout: float) -> None:
    """Fork a child that copies with the library; it must finish, and copy exactly, within ``timeout``."""
    ctx = multiprocessing.get_context("fork")
    result = ctx.Queue()
    child = ctx.Process(target=_child_copies, args=(result,))
    child.start()
    child.join(timeout)
    if child.exitcode is None:
        child.kill()
    assert child.exitcode == 0, "the forked child hung or failed"
    assert result.get(timeout=5) is True


def test_a_forked_child_starts_its_own_copy_threads():
    """The parent's worker threads do not exist in a forked child: the child must start its own, not wait on
    threads that will never run."""
    lib = _lib()
    a = np.ones(100_000)
    assert hostcopy.copy(lib, [(a, np.zeros_like(a))], 4096, 4) == 0        # the parent's workers are up
    _a_forked_child_copies(timeout=60)


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded")
def test_a_fork_during_another_threads_copy_leaves_the_child_a_working_copy():
    """A thread of the parent copies without pause while the parent forks: most forks land inside one of its
    calls, with the library's locks held. Each child must still copy (its first call would otherwise wait
    for ever on a lock held by a thread it does not have)."""
    lib = _lib()
    big = np.arange(4_000_000, dtype=np.float64)          # 32 MB: each call takes milliseconds
    out = np.zeros_like(big)
    stop, calls = threading.Event(), []

    def copy_until_stopped():
        while not stop.is_set():
            calls.append(hostcopy.copy(lib, [(big, out)], 1 << 20, 4))

    busy = threading.Thread(target=copy_until_stopped)
    busy.start()
    try:
        for _ in range(6):
            _a_forked_child_copies(timeout=30)
    finally:
        stop.set()
        busy.join(60)
    assert calls and set(calls) == {0} and np.array_equal(out, big)      # the parent's copies went on


def test_two_processes_building_it_at_once_both_load_one_library(fresh):
    """Each build is written to a temporary name and renamed: neither process loads half a file, and no
    temporary file is left behind."""
    if _no_compiler():
        _skip_without_compiler("two processes would both find no compiler")
    script = textwrap.dedent("""
        import numpy as np
        from app.kernel import hostcopy
        lib, how = hostcopy.load()
        assert lib is not None, how
        a = np.arange(1000, dtype=np.int64); b = np.zeros(1000, np.int32)
        assert hostcopy.copy(lib, [(a, b)], 256, 2) == 0 and (b == np.arange(1000)).all()
        print(how)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], env=os.environ.copy(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all(out.startswith("compiled with") for out, _ in outs)
    files = sorted(p.name for p in fresh.iterdir())
    assert len(files) == 1 and files[0].startswith("hostcopy-") and files[0].endswith(".so"), files


def test_without_a_compiler_it_says_why_and_leaves_nothing(fresh, monkeypatch):
    monkeypatch.setenv("CC", str(fresh.parent / "no-such-cc"))
    lib, why = hostcopy.load()
    assert lib is None and "no-such-cc" in why and "did not run" in why


def test_a_failed_build_says_what_the_compiler_said_and_leaves_no_file(fresh, monkeypatch, tmp_path):
    cc = tmp_path / "broken-cc"
    cc.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo broken-cc 1.0; exit 0; }\n"
                  "echo 'hostcopy.c:1: error: the compiler refused' >&2; exit 1\n")
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    lib, why = hostcopy.load()
    assert lib is None and "failed" in why and "the compiler refused" in why
    assert not fresh.exists() or list(fresh.iterdir()) == []


def test_the_environment_can_turn_it_off(fresh, monkeypatch):
    monkeypatch.setenv(hostcopy.DISABLE_ENV, "numpy")
    lib, why = hostcopy.load()
    assert lib is None and why == "APP_HOST_COPY=numpy is set"
    monkeypatch.delenv(hostcopy.DISABLE_ENV)
    lib, how = hostcopy.load()
    if lib is None:
        _skip_without_compiler(how)
    assert lib is not None, how
