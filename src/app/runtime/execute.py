"""Run a plan once outside any profiler: the public APIs' path."""
from __future__ import annotations

from app.runtime import device as devmod
from app.runtime.nvtx import Nvtx
from app.runtime.recorder import Recorder


def backend_for(plan, selection):
    """The backend for the selected device; a GPU that fails to build under --device auto
    falls back to the CPU *visibly* (selection records why), never silently."""
    try:
        backend = plan.backend(selection.selected)
        compile_info = backend.compile()
    except Exception as exc:
        if selection.selected != "gpu" or selection.requested == "gpu":
            raise
        selection.fall_back_to_cpu(f"GPU backend failed to build: {str(exc).splitlines()[0]}")
        backend = plan.backend("cpu")
        compile_info = backend.compile()
    return backend, compile_info


def xp_for(selected: str):
    if selected == "gpu":
        import cupy

        return cupy
    import numpy

    return numpy


def run_once(plan, inputs, device: str = "auto"):
    """Plan output as host arrays."""
    selection = devmod.select(device)
    backend, _ = backend_for(plan, selection)
    rec = Recorder(selection.selected, xp_for(selection.selected), Nvtx(False, plan.kernel))
    output, _ = rec.run(plan, inputs, backend)
    return backend.outputs_to_host(output)
