"""The interface every profiling mode implements, and the mode registry.

A mode turns (plan, options) into a ``Profile``: the files of one profile
directory plus what the CLI prints. Adding a mode is one new module and one
line in MODE_MODULES.
"""
from __future__ import annotations

import importlib
import math
import os
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
# The modes that profile one warm iteration (ncu replays each kernel once per metric pass): bench_runs None is 1 there.
ONE_ITERATION_MODES = ("annotation", "ncu")
# The choices of the options that have them, as the CLI offers them (--device, --l2, --overhead, --backend,
# --ncu-clock-control); l2's are timing.L2_MODES and device's device.DEVICES, checked against these by the tests.
CHOICES = {"device": ("auto", "cpu", "gpu"), "l2": ("flush", "keep"), "overhead": ("precise", "quick"),
           "backend": ("nsys", "cupti"), "clock_control": ("none", "base")}
FLAGS = ("nvtx", "verify", "graph")
TIMEOUTS = ("ncu_timeout", "nsys_timeout")


class OptionError(BadParameter, ValueError):
    """An option out of its choices, type or range: one line and exit 2 for the CLI (BadParameter), a ValueError
    for a caller in Python (app.kernel.profile), which no argparse checked."""


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
        """Every option checked as the CLI's parser checks it, so a caller in Python meets the same bounds and
        choices before anything runs: a value no mode reads (l2="bogus", nvtx="no", which is true) would otherwise
        be recorded in params.json as if it had applied."""
        for name, least, most in (("bench_runs", 1, MAX_BENCH_RUNS), ("warmup", 0, MAX_WARMUP)):
            value = getattr(self, name)
            if value is None or value == "auto":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
                raise OptionError(f"{name}={value!r}: expected a whole number from {least} to {most:,}, or 'auto'")
        for name, choices in CHOICES.items():
            value = getattr(self, name)
            if not isinstance(value, str) or value not in choices:
                raise OptionError(f"{name}={value!r}: expected one of {', '.join(map(repr, choices))}")
        for name in FLAGS:
            value = getattr(self, name)
            if not isinstance(value, bool):          # "no", "False", 0: a string is true, and 0 is no choice made
                raise OptionError(f"{name}={value!r}: expected True or False")
        for name in TIMEOUTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value)
                                                                                     and value > 0):
                raise OptionError(f"{name}={value!r}: expected a finite number of seconds > 0")
        for name in ("ncu", "nsys"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise OptionError(f"{name}={value!r}: expected the path of the executable, or None to find it")
        if self.baseline is not None and not isinstance(self.baseline, dict):
            raise OptionError(f"baseline={self.baseline!r}: expected a loaded trace (dict) or None; a profile "
                              "folder, its trace.json or 'latest' is read by app.kernel.profile")
        self._mode = None          # the mode that refused event-only options (refuse_event_only): see as_dict

    def refuse_event_only(self, mode: str) -> None:
        """--l2 keep, --graph and --overhead shape event mode's runs; another mode refuses them rather than ignore
        them. Every mode but event calls this first with its name, which as_dict then uses for the run count."""
        self._mode = mode
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

    def runs_of(self, mode: str | None = None) -> int | str:
        """The timed runs ``mode`` makes with these options: the count given, "auto", or the mode's default
        (DEFAULT_BENCH_RUNS in event and nsys mode, one warm iteration in the counter modes)."""
        if self.bench_runs is not None:
            return self.bench_runs
        return 1 if (mode or self._mode) in ONE_ITERATION_MODES else DEFAULT_BENCH_RUNS

    def as_dict(self, mode: str | None = None) -> dict:
        """The options as params.json records them. ``bench_runs`` is the count that ran (``runs_of``), never null
        for the mode's default; "auto" stays "auto" (trace.json's timing.timed_runs has the count it reached).
        ``mode``: the profiling mode; by default the one that called refuse_event_only, else event."""
        d = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        d["bench_runs"] = self.runs_of(mode)
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
