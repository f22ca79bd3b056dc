"""scan.cu's inclusive prefix sum equals numpy's cumsum for every size class and dtype pair."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def module():
    from app.kernel.gpu_build import CudaModule
    from app.kernel.join.gpu import LIBRARY_CALLS, SOURCE, STAGE_KERNELS

    mod = CudaModule(SOURCE, STAGE_KERNELS, LIBRARY_CALLS, scan_stages=("morton_sort",))
    mod.compile({})
    return mod


@pytest.mark.parametrize("n", [0, 1, 2047, 2048, 2049, 1024 * 2048 + 5, 4096 * 2048, 4096 * 2048 + 1, 20_000_000])
@pytest.mark.parametrize("in_dtype,out_dtype", [("int32", "int32"), ("int32", "int64"), ("int64", "int64")])
def test_inclusive_scan_matches_numpy(module, n, in_dtype, out_dtype):
    import cupy as cp

    rng = np.random.default_rng(n)
    x = rng.integers(0, 7, n).astype(in_dtype)
    got = cp.asnumpy(module.inclusive_scan(cp.asarray(x), out_dtype, "test"))
    np.testing.assert_array_equal(got, np.cumsum(x, dtype=out_dtype))
    assert got.dtype == np.dtype(out_dtype)
