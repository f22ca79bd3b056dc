"""The compiled host copy's DMA rule, written out for the tests that check the library and the build against it."""


def expected_dmas(sizes, slice_bytes, dma_bytes):
    """The DMAs the library is to cut from arrays of ``sizes`` bytes, as (array, offset, bytes): the k-th of the
    call min(dma, slice << k) bytes, an array's last one shorter; both sizes round down to a multiple of 8."""
    step = lambda b: 8 if b < 16 else b - b % 8
    size, most, out = step(slice_bytes), step(max(dma_bytes, slice_bytes)), []
    for a, n in enumerate(sizes):
        lo = 0
        while lo < n:
            out.append((a, lo, min(size, n - lo)))
            lo += out[-1][2]
            size = min(2 * size, most)
    return out
