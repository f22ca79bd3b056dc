"""-lineinfo, which the counter modes add so ncu can name source lines, leaves the machine code of
every kernel unchanged: only line-table sections are added to the cubin. Compiled with NVRTC for
this GPU, exactly as the kernels are built (needs a GPU for CuPy's NVRTC and the architecture)."""
import struct

import pytest

from app.kernel import gpu_build

pytestmark = pytest.mark.gpu


def elf_sections(blob: bytes) -> dict[str, bytes]:
    shoff, = struct.unpack_from("<Q", blob, 0x28)
    entsize, count, names_at = struct.unpack_from("<HHH", blob, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", blob, shoff + i * entsize) for i in range(count)]
    names = headers[names_at][4]

    def name(offset):
        return blob[names + offset: blob.index(b"\0", names + offset)].decode()

    return {name(h[0]): blob[h[4]: h[4] + h[5]] for h in headers}


def cubin(source: str, options) -> bytes:
    from cupy.cuda import device
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(source, "module.cu", [], [])
    try:
        nvrtc.compileProgram(prog, [*options, f"--gpu-architecture=sm_{device.Device().compute_capability}"])
        return nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


OVERLAY_SOURCES = "overlay/overlay.cu+overlay/overlay_exact.cu+overlay/overlay_area.cu+overlay/overlay_v3.cu"


@pytest.mark.parametrize("kernel", ["join/join.cu", OVERLAY_SOURCES])
def test_lineinfo_changes_no_instruction(kernel):
    paths = (gpu_build.SCAN_SOURCE, gpu_build.COMMON_SOURCE,
             *(gpu_build.SCAN_SOURCE.parent / k for k in kernel.split("+")))
    source = gpu_build.module_source([p.resolve() for p in paths])
    plain = elf_sections(cubin(source, gpu_build.OPTIONS))
    lined = elf_sections(cubin(source, gpu_build.OPTIONS + ("-lineinfo",)))
    text = [k for k in plain if k.startswith(".text.")]
    assert len(text) > 15
    assert all(plain[k] == lined[k] for k in text), [k for k in text if plain[k] != lined[k]]
    assert ".nv_debug_line_sass" in lined and ".nv_debug_line_sass" not in plain
