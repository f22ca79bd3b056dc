"""Which kernels each stage launched (event mode's Occ%): the bookkeeping of one untimed run, on a plan whose
"kernels" are plain functions (the GPU runs of tests/cli/test_event_profile.py check it on the real ones)."""
from types import SimpleNamespace

from app.kernel.gpu_build import CudaModule, GpuBackend


class Module(CudaModule):
    def __init__(self):         # CudaModule's own needs CuPy; its census and occupancy need only these
        self.stage_kernels = {"sort": ("count", "scan_i32_i32", "scatter"), "filter": ("fill_1", "fill_2",
                                                                                    "scan_i32_i32")}
        self.fn = {n: (lambda *a, **k: None) for names in self.stage_kernels.values() for n in names}
        self.kernels = {n: SimpleNamespace(name=n) for n in self.fn}

    def occupancy(self, fn, block, name=""):
        return {"count": 100.0, "scan_i32_i32": 50.0, "scatter": 75.0, "fill_1": 62.5, "fill_2": 25.0}[name]


class Backend(GpuBackend):
    def __init__(self):
        self.mod, self.tiling = Module(), {"sort": {"block": 256}, "filter": {"block": 128}}

    def sort(self):
        for k in ("count", "scan_i32_i32", "scatter"):
            self.mod.fn[k]((1,), (32,), ())

    def filter(self):
        self.mod.fn["fill_1"]((1,), (32,), ())


def test_each_stage_gets_the_kernels_it_launched_and_their_lowest_occupancy():
    b = Backend()
    fns = dict(b.mod.fn)
    occ = b.launched_occupancy(lambda: (b.sort(), b.filter()))
    # The filter registers fill_2 (25%) and the scan (50%), which it did not launch: its figure is fill_1's.
    assert occ == {"sort": (50.0, ["count", "scan_i32_i32", "scatter"]), "filter": (62.5, ["fill_1"])}
    assert b.mod.fn == fns and "sort" not in vars(b) and "filter" not in vars(b)     # all put back
