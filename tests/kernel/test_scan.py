"""scan.cu's single-pass inclusive prefix sum equals numpy's cumsum for every size class and dtype pair, run
after run on the same state buffer (the kernel zeroes its own state at the end), and over a length it reads
from the device. Long int32 scans take the wide block shape (gpu_build.SCAN_WIDE_FROM): the sizes and the
repeated runs cross that line."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

SIZES = [0, 1, 2047, 2048, 2049, 1024 * 2048 + 5, 4096 * 2048, 4096 * 2048 + 1, 20_000_000]
DTYPES = [("int32", "int32"), ("int32", "int64"), ("int64", "int64")]


@pytest.fixture(scope="module")
def module():
    from app.kernel.gpu_build import CudaModule
    from app.kernel.join.gpu import LIBRARY_CALLS, SOURCE, STAGE_KERNELS

    mod = CudaModule(SOURCE, STAGE_KERNELS, LIBRARY_CALLS, scan_stages=("morton_sort",))
    mod.compile({})
    return mod


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("in_dtype,out_dtype", DTYPES)
def test_inclusive_scan_matches_numpy(module, n, in_dtype, out_dtype):
    import cupy as cp

    rng = np.random.default_rng(n)
    x = rng.integers(0, 7, n).astype(in_dtype)
    got = cp.asnumpy(module.inclusive_scan(cp.asarray(x), out_dtype, "test"))
    np.testing.assert_array_equal(got, np.cumsum(x, dtype=out_dtype))
    assert got.dtype == np.dtype(out_dtype)


@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_state_is_left_zeroed_run_after_run(module, dtype):
    """Every run leaves the tile counter, the done count and the status words at zero for the next: 50 runs
    of varied lengths (the largest first, so later runs use part of the buffer) on one tag, each checked.
    For int32 the lengths fall on both sides of the wide shape's threshold, so both shapes share the state."""
    import cupy as cp
    from app.kernel.gpu_build import SCAN_WIDE_FROM

    rng = np.random.default_rng(7)
    lengths = [3_000_000, *rng.integers(1, 3_000_000, 49)]
    assert min(lengths) < SCAN_WIDE_FROM <= max(lengths)
    for i, n in enumerate(lengths):
        x = rng.integers(-5, 9, int(n)).astype(dtype)          # negative items too: totals may dip below zero
        got = cp.asnumpy(module.inclusive_scan(cp.asarray(x), dtype, "repeat" + dtype))
        np.testing.assert_array_equal(got, np.cumsum(x, dtype=dtype), err_msg=f"run {i}, n={n}")
        state = cp.asnumpy(module.ws.self_zeroing("repeat" + dtype + ".state", 1, np.uint64))
        assert not state.any(), f"run {i} left its state non-zero"


def test_length_read_from_the_device(module):
    """With n_dev the scan covers its first n_dev[0] entries and leaves the rest of the output untouched."""
    import cupy as cp

    x = cp.arange(1, 100_001, dtype=cp.int32)
    out = module.ws.empty("devlen", len(x), cp.int64)
    out.fill(-1)
    for real in (0, 1, 70_001, 100_000):
        out.fill(-1)
        got = cp.asnumpy(module.inclusive_scan(x, cp.int64, "devlen", n_dev=cp.array([real], dtype=cp.int64)))
        np.testing.assert_array_equal(got[:real], np.cumsum(np.arange(1, real + 1, dtype=np.int64)))
        assert (got[real:] == -1).all()


def test_length_read_from_the_device_over_a_long_int32_buffer(module):
    """The same over an int32 buffer as long as the overlay's event-slot tables (this scan keeps the narrow
    shape: only scans of a whole long buffer take the wide one)."""
    import cupy as cp
    from app.kernel.gpu_build import SCAN_WIDE_FROM

    n = 3 * SCAN_WIDE_FROM + 17
    x = cp.asarray(np.random.default_rng(3).integers(0, 4, n).astype(np.int32))
    out = module.ws.empty("devlen32", n, cp.int32)
    for real in (0, 2049, SCAN_WIDE_FROM + 1, n):
        out.fill(-1)
        got = cp.asnumpy(module.inclusive_scan(x, cp.int32, "devlen32", n_dev=cp.array([real], dtype=cp.int64)))
        np.testing.assert_array_equal(got[:real], np.cumsum(cp.asnumpy(x[:real]), dtype=np.int32))
        assert (got[real:] == -1).all()
