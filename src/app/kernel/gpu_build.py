"""Compile a stage's .cu with NVRTC through CuPy, and describe what was built.

``compile`` is timed apart from every run (truth rule 3). ``artifacts`` gives,
per stage, the CUDA source, the PTX NVRTC makes from it with the same options,
and each kernel's resource usage (registers, shared/local/const bytes) with the
theoretical occupancy at the chosen block size.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

OPTIONS = ("--std=c++17", "--fmad=false")


class CudaModule:
    def __init__(self, source: Path, stage_kernels: dict, library_calls: dict):
        import cupy

        self.cp = cupy
        self.source_path = source
        self.source = source.read_text()
        self.stage_kernels = stage_kernels
        self.library_calls = library_calls
        self.module = cupy.RawModule(code=self.source, options=OPTIONS)
        self.fn: dict = {}
        self._ptx: str | None = None

    def compile(self, blocks: dict) -> dict:
        t0 = time.perf_counter()
        for names in self.stage_kernels.values():
            for name in names:
                self.fn[name] = self.module.get_function(name)   # NVRTC + module load on first call
        seconds = time.perf_counter() - t0
        occupancy = {stage: min(self.occupancy(self.fn[n], blocks.get(stage, 256)) or 0 for n in names) or None
                     for stage, names in self.stage_kernels.items()}
        return {"total_seconds": seconds, "compiler": "NVRTC via cupy.RawModule", "options": list(OPTIONS),
                "kernels": sorted(self.fn), "occupancy": occupancy,
                "note": "includes CuPy's on-disk kernel cache: a warm cache makes this a module load"}

    def resources(self, fn) -> dict:
        out = {}
        for attr in ("num_regs", "shared_size_bytes", "local_size_bytes", "const_size_bytes",
                     "max_threads_per_block", "ptx_version", "binary_version"):
            try:
                out[attr] = int(getattr(fn, attr))
            except Exception:  # attribute missing in this CuPy: leave it out, don't guess
                pass
        return out

    def occupancy(self, fn, block: int) -> float | None:
        """Theoretical occupancy (%) at ``block`` threads: resident warps / max warps per SM."""
        try:
            from cupy.cuda import driver, runtime

            blocks = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.ptr, block, 0)
            max_threads = runtime.getDeviceProperties(runtime.getDevice())["maxThreadsPerMultiProcessor"]
            return 100.0 * blocks * block / max_threads
        except Exception:
            return None

    def ptx(self) -> str:
        if self._ptx is None:
            try:
                from cupy.cuda import compiler, device

                arch = f"compute_{device.Device().compute_capability}"
                self._ptx = compiler.compile_using_nvrtc(self.source, OPTIONS, arch)
                if isinstance(self._ptx, bytes):
                    self._ptx = self._ptx.decode()
            except Exception as exc:
                self._ptx = f"// PTX unavailable: {type(exc).__name__}: {exc}\n"
        return self._ptx

    def artifacts(self, blocks: dict) -> dict:
        out = {}
        for stage, names in self.stage_kernels.items():
            res = {n: self.resources(self.fn[n]) | {"block": blocks.get(stage, 256),
                                                    "theoretical_occupancy_pct": self.occupancy(self.fn[n],
                                                                                                blocks.get(stage, 256))}
                   for n in names}
            out[stage] = {
                self.source_path.name: self.source,
                self.source_path.stem + ".ptx": self.ptx(),
                "resources.json": json.dumps({"kernels": res, "compile_options": list(OPTIONS),
                                              "library_calls": self.library_calls.get(stage, "")}, indent=2),
            }
        for stage, calls in self.library_calls.items():
            if stage not in out:
                out[stage] = {"resources.json": json.dumps({"kernels": {}, "library_calls": calls}, indent=2)}
        return out
