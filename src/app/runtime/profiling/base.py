"""The interface every profiling mode implements, and the mode registry.

A mode turns (plan, options) into a ``Profile``: the files of one profile
directory plus what the CLI prints. Adding a mode is one new module and one
line in MODE_MODULES.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from app.errors import BadParameter

DEFAULT_BENCH_RUNS = 10
# Upper bounds of the run counts: a count no one means (1000000000, a stray digit) would run for days while each
# timed run's record grows memory (about 7 kB a run on the CPU) until the host runs out. Ten times what "auto"
# ever runs (timing.AUTO_MAX_RUNS; WARMUP_MAX_RUNS = 20,000 for warm-up): 100,000 timed runs keep about 0.7 GB of
# records and write a trace.json of about 35 MB. The CLI refuses them as it parses; ProfileOptions for a caller
# in Python (app.kernel.profile).
MAX_BENCH_RUNS = 100_000
MAX_WARMUP = 100_000


@dataclass
class ProfileOptions:
    device: str = "auto"
    # None: the mode's default -- DEFAULT_BENCH_RUNS timed runs in event and nsys mode; the counter
    # modes profile one warm iteration and refuse any other explicit count.
    bench_runs: int | str | None = None      # an int, "auto" (event mode), or None
    warmup: int | str = "auto"    # a count, or "auto": until the plan's time is steady (timing.warm_up)
    nvtx: bool = False
    verify: bool = True
    baseline: dict | None = None
    argv: list[str] | None = None
    ncu: str | None = None            # --ncu PATH
    ncu_timeout: float = 600.0        # --ncu-timeout seconds
    clock_control: str = "none"       # --ncu-clock-control none|base
    nsys: str | None = None           # --nsys PATH
    nsys_timeout: float = 600.0       # --nsys-timeout seconds
    backend: str = "nsys"             # --backend nsys|cupti (nsys mode's trace source)
    l2: str = "flush"                 # --l2 flush|keep: event mode's L2 policy between timed runs
    graph: bool = False               # --graph: event mode says whether the plan is CUDA-graph capturable
    overhead: str = "precise"         # --overhead precise|quick: event mode's pairs for the marks' cost

    def __post_init__(self):
        for name, least, most in (("bench_runs", 1, MAX_BENCH_RUNS), ("warmup", 0, MAX_WARMUP)):
            value = getattr(self, name)
            if value is None or value == "auto":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
                raise BadParameter(f"{name}={value!r}: expected a whole number from {least} to {most:,}, or 'auto'")

    def refuse_event_only(self, mode: str) -> None:
        """--l2 keep, --graph and --overhead shape event mode's runs; another mode refuses them rather than ignore
        them."""
        if self.l2 != "flush":
            raise BadParameter(f"--l2 {self.l2}: only event mode has an L2 policy between runs ({mode} mode runs "
                               "the plan under a profiler, which sets its own)")
        if self.graph:
            raise BadParameter(f"--graph: event mode's; {mode} mode does not time graph replay")
        if self.overhead != "precise":
            raise BadParameter(f"--overhead {self.overhead}: event mode's; {mode} mode does not time its marks "
                               "in pairs")

    def timed_runs(self) -> int:
        return self.bench_runs or DEFAULT_BENCH_RUNS

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["baseline"] = bool(self.baseline)
        d.pop("argv")
        return d


@dataclass
class Profile:
    trace: dict
    files: dict = field(default_factory=dict)   # relative path -> str | bytes | dict
    summary: str = ""                           # one-screen summary for the terminal
    ok: bool = True                              # False: verification failed


class Mode:
    name: str = ""

    def profile(self, plan, options: ProfileOptions) -> Profile:
        raise NotImplementedError


MODES: dict[str, type[Mode]] = {}


def register_mode(cls: type[Mode]) -> type[Mode]:
    MODES[cls.name] = cls
    return cls


# Where each mode lives. Only the mode asked for is imported (it registers itself): an event profile
# then starts without the counter modes' pandas and ncu readers, about 0.35 s of imports.
MODE_MODULES = {"annotation": "app.runtime.profiling.annotation", "event": "app.runtime.profiling.event",
                "ncu": "app.runtime.profiling.ncu", "nsys": "app.runtime.profiling.nsys"}


def get_mode(name: str) -> Mode:
    if name not in MODE_MODULES:
        raise BadParameter(f"unknown --prof_type {name!r}; available: {', '.join(sorted(MODE_MODULES))}")
    importlib.import_module(MODE_MODULES[name])
    return MODES[name]()
