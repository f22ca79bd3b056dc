"""Pinned staging puts every byte of the host arrays on the device, across chunk edges, dtype changes and
runs that reuse (and outgrow) the pinned buffers, and counts each copy in the stage context."""
import re

import numpy as np
import pytest

from app.kernel import hostcopy, staging
from app.runtime.recorder import StageContext
from tests.staging_rule import expected_dmas

pytestmark = pytest.mark.gpu


def _context(cp):
    return StageContext("owned_buffer_build", "setup", "gpu", cp)


@pytest.mark.parametrize("copy", ["numpy", "compiled"])
@pytest.mark.parametrize("threads", [1, 3])
def test_arrays_arrive_exactly_across_chunks_and_runs(monkeypatch, threads, copy):
    """Both host copies: numpy's on Python threads and the compiled one (app.kernel.hostcopy), which takes the
    contiguous arrays and the int64 offsets and leaves a strided array to numpy, in the same build."""
    import cupy as cp

    monkeypatch.setenv(hostcopy.DISABLE_ENV, "numpy" if copy == "numpy" else "")
    monkeypatch.setattr(staging, "CHUNK_BYTES", 4096 + 8)      # chunk edges inside rows and odd counts
    monkeypatch.setattr(staging, "COMPILED_SLICE_BYTES", 4096 + 8)
    monkeypatch.setattr(staging, "COMPILED_DMA_BYTES", 4 * (4096 + 8))
    monkeypatch.setattr(staging, "MIN_STAGED_BYTES", 0)
    monkeypatch.setattr(staging, "COMPILED_MIN_STAGED_BYTES", 0)
    stager = staging.PinnedStaging(cp, threads=threads)
    rng = np.random.default_rng(threads)
    for n in (1000, 0, 5000, 3):                              # grow, empty, outgrow, shrink: buffers reused
        st = _context(cp)
        coords = rng.standard_normal((n, 2))
        offsets = np.arange(n + 1, dtype=np.int64) * 3 - 2**31 + 7
        strided = rng.standard_normal((n, 3))[:, ::2]
        got = stager.to_device(st, {"coords": (coords, np.float64), "offsets": (offsets, np.int32),
                                    "strided": (strided, np.float64)})
        np.testing.assert_array_equal(cp.asnumpy(got["coords"]), coords)
        assert got["offsets"].dtype == cp.int32
        np.testing.assert_array_equal(cp.asnumpy(got["offsets"]), offsets.astype(np.int32))
        np.testing.assert_array_equal(cp.asnumpy(got["strided"]), strided)
        # Every DMA is a copy of its own (as a trace of the run shows them): counted one by one. numpy sends a
        # chunk a DMA; the compiled copy sends the contiguous arrays in DMAs of one slice, then twice the last.
        chunk = 4096 + 8                                     # both chunk sizes, and a multiple of 8
        by_numpy = (coords.nbytes, (n + 1) * 4, strided.nbytes) if copy == "numpy" else (strided.nbytes,)
        pieces = sum(-(-nbytes // chunk) for nbytes in by_numpy)
        if copy == "compiled":
            pieces += len(expected_dmas([coords.nbytes, (n + 1) * 4], chunk, 4 * chunk))
        assert st.h2d_copies == pieces and st.h2d_bytes == coords.nbytes + (n + 1) * 4 + strided.nbytes
        how = st.meta["staging"]
        assert how.startswith("pinned, "), how
        for counted in re.finditer(r"(\d+) (chunks?|DMAs?) of ", how):
            assert (counted[2] in ("chunk", "DMA")) == (counted[1] == "1"), how
        if copy == "compiled":
            sent = [d[2] for d in expected_dmas([coords.nbytes, (n + 1) * 4], chunk, 4 * chunk)]
            span = f"{min(sent):,} bytes" if min(sent) == max(sent) else f"{min(sent):,} to {max(sent):,} bytes"
            # The DMAs as sent, then the rule that cut them: the rule's sizes are no bounds on an array's last DMA.
            assert (f"{len(sent)} DMA{'s' if len(sent) != 1 else ''} of {span} (cut in sizes from one slice of 4,104 "
                    "bytes doubling up to 16,416 bytes, an array's last what is left of it; each issued as its slices "
                    "are written), written in slices of 4,104 bytes by") in how, how
            assert "compiled copy with streaming stores" in how, how
            assert ("numpy copies (a strided array" in how) == (strided.size > 0), how
        else:
            assert "compiled" not in how.split("(")[0] and "APP_HOST_COPY=numpy is set" in how, how
    stager.close()


def test_a_stage_read_of_the_copies_waits_for_them():
    """The copies are queued on the current stream: a kernel queued after them reads the new bytes."""
    import cupy as cp

    stager = staging.PinnedStaging(cp)
    for value in (1.0, 2.0):
        host = np.full(3_000_000, value)                        # 24 MB: over the staging threshold
        st = _context(cp)
        dev = stager.to_device(st, {"x": (host, np.float64)})["x"]
        assert float(dev.sum()) == value * host.size and st.meta["staging"].startswith("pinned")
    stager.close()


def test_the_dma_alone_sends_the_staged_bytes_again_and_only_after_a_staged_run():
    """The link's share of a build: the last staged run's bytes sent again from their pinned buffers. A run that
    staged nothing (small inputs: the pageable copy) leaves nothing to time, and says so with None, not 0."""
    import cupy as cp

    stager = staging.PinnedStaging(cp)
    assert stager.dma_alone() is None                           # nothing staged yet
    host, offsets = np.full(3_000_000, 1.0), np.arange(11, dtype=np.int64)     # 24 MB: staged
    stager.to_device(_context(cp), {"x": (host, np.float64), "o": (offsets, np.int32)})
    dma = stager.dma_alone(repeats=3)
    assert dma["bytes"] == host.nbytes + 11 * 4 and dma["runs"] == 3 and dma["seconds"] > 0
    assert dma["gbps"] == pytest.approx(dma["bytes"] / dma["seconds"] / 1e9)
    assert 1.0 < dma["gbps"] < 1000.0                           # a host link: PCIe to NVLink-C2C rates
    stager.to_device(_context(cp), {"o": (offsets, np.int32)})
    assert stager.dma_alone() is None
    stager.close()


def test_small_inputs_take_the_pageable_copy_and_say_so():
    import cupy as cp

    stager = staging.PinnedStaging(cp)
    st = _context(cp)
    offsets = np.arange(11, dtype=np.int64)
    got = stager.to_device(st, {"offsets": (offsets, np.int32)})["offsets"]
    assert got.dtype == cp.int32 and cp.asnumpy(got).tolist() == list(range(11))
    assert st.meta["staging"].startswith("pageable") and st.h2d_copies == 1 and st.h2d_bytes == 44
    stager.close()


def test_inputs_in_pinned_memory_go_straight_to_the_device_and_say_so():
    """A plan's inputs copied into pinned memory (pin_inputs, nested dataclasses too) skip the host copy: their
    DMA reads the caller's arrays. An array that needs a dtype change is still staged."""
    import cupy as cp

    from app.kernel.plan import get_plan_class

    inputs = get_plan_class("join", "v3")({"points": 2000, "polygons": 50}).make_inputs()
    pinned = staging.pin_inputs(inputs)
    assert staging.is_pinned(cp, pinned.points) and staging.is_pinned(cp, pinned.polygons.coords)
    assert not staging.is_pinned(cp, inputs.points)
    np.testing.assert_array_equal(pinned.points, inputs.points)
    assert pinned.predicate == inputs.predicate
    stager = staging.PinnedStaging(cp)
    st = _context(cp)
    got = stager.to_device(st, {"points": (pinned.points, np.float64), "coords": (pinned.polygons.coords, np.float64),
                                "offsets": (pinned.polygons.ring_offsets, np.int32)})
    np.testing.assert_array_equal(cp.asnumpy(got["points"]), inputs.points)
    np.testing.assert_array_equal(cp.asnumpy(got["coords"]), inputs.polygons.coords)
    np.testing.assert_array_equal(cp.asnumpy(got["offsets"]), inputs.polygons.ring_offsets.astype(np.int32))
    assert st.meta["staging"].startswith("2 of 3 arrays straight from the caller's pinned memory; pageable")
    assert st.h2d_copies == 3
    stager.close()


def test_results_come_back_in_pinned_memory_all_at_once():
    import cupy as cp

    from app.kernel.join.gpu import JoinGPU
    from app.kernel.plan import get_plan_class

    backend = JoinGPU(get_plan_class("join", "v3")({}).tiling, "v3")
    big = cp.arange(300_000, dtype=cp.int64)
    small = cp.arange(10, dtype=cp.float64)
    strided = cp.arange(20, dtype=cp.int32)[::2]       # not contiguous: copied contiguous first
    empty = cp.empty(0, dtype=cp.int64)
    host = backend.outputs_to_host((big, small, strided, empty))
    assert all(staging.is_pinned(cp, h) for h in host[:3])
    np.testing.assert_array_equal(host[0], np.arange(300_000))
    assert host[1].tolist() == list(range(10)) and host[1].dtype == np.float64
    assert host[2].tolist() == list(range(0, 20, 2))
    assert host[3].shape == (0,) and host[3].dtype == np.int64


def test_the_compile_step_builds_the_host_copy(monkeypatch, tmp_path):
    """The staging's C library is built in the compile step, which is timed apart from every run, so the
    compiler's time is not in the cold run's build."""
    from app.kernel.plan import get_plan_class

    monkeypatch.setenv("APP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(hostcopy.DISABLE_ENV, raising=False)
    monkeypatch.setattr(hostcopy, "_loaded", None)
    backend = get_plan_class("join", "v4")({"points": 1000, "polygons": 100}).backend("gpu")
    assert not (tmp_path / "hostcopy").exists()
    info = backend.compile()
    built = list((tmp_path / "hostcopy").glob("hostcopy-*.so"))
    assert len(built) == 1 and info["host_copy"]["loaded"] and info["host_copy"]["how"].startswith("compiled with")
    assert 0 < info["host_copy"]["seconds"] < info["total_seconds"]
