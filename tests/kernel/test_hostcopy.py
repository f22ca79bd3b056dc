"""The compiled host copy of pinned staging (app.kernel.hostcopy), on the host alone: every byte written,
int64 offsets narrowed exactly, pairs it cannot copy declined, and the build and its fallbacks, with real
second processes where a promise involves one (a forked child, two processes building the library at once).
Its DMA half runs on the GPU: tests/kernel/test_staging.py."""
import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from app.kernel import hostcopy


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process that has not loaded the library yet, with an empty cache."""
    monkeypatch.setattr(hostcopy, "_loaded", None)
    monkeypatch.setenv("APP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(hostcopy.DISABLE_ENV, raising=False)
    return tmp_path / "cache" / "hostcopy"


def _lib():
    lib, how = hostcopy.load()
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


def test_chunks_are_counted_as_the_library_cuts_them():
    """Each chunk is a DMA of its own, and the build counts them from the library: 40 bytes in chunks of 16
    are three (16, 16 and 8), a chunk size rounds down to a multiple of 8, and an empty array has none."""
    lib = _lib()

    def count(sizes, chunk):
        table = hostcopy._table([(0, 0, 0, n, hostcopy.BYTES) for n in sizes])    # alive through the call
        return lib.hostcopy_chunks(len(sizes), table.buffer_info()[0], chunk)

    assert count([40], 16) == 3 and count([40], 20) == 3 and count([40], 8) == 5 and count([40], 3) == 5
    assert count([0, 48, 1], 16) == 4 and count([], 16) == 0 and count([1 << 22], 1 << 20) == 4


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
    assert hostcopy.load()[0] is not None
