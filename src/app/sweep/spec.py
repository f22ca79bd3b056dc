"""What a sweep runs: a kernel, its versions, a grid of parameter values, and the profiling options.

A point is one (version, grid values) pair, profiled exactly as
``python -m app.kernel <kernel> <version> --<axis> <value> ...`` would profile it.
The spec is written to ``sweep.json`` first, so ``--resume`` runs the same grid.
"""
from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from app.errors import AppError, BadParameter
from app.kernel.plan import human, get_plan_class, kernels
from app.runtime.memory import available_host_bytes, check_fits

SPEC_FILE = "sweep.json"


@dataclass
class SweepSpec:
    kernel: str
    versions: list[str]
    # grid axis -> values, in the order given; an axis "left,right" sets both parameters to each value
    axes: dict[str, list]
    fixed: dict = field(default_factory=dict)   # other kernel parameters, the same at every point
    prof_type: str = "event"
    device: str = "auto"
    bench_runs: int | str | None = None
    warmup: int | str = "auto"
    l2: str = "flush"

    @property
    def name(self) -> str:
        return "-".join(a.replace(",", "+") for a in self.axes) or "point"

    def points(self) -> list[dict]:
        """Every (version, grid values) point, grid-major so early points span the versions."""
        out = []
        for values in itertools.product(*self.axes.values()):
            grid = dict(zip(self.axes, values))
            params = self.fixed | {name: v for axis, v in grid.items() for name in axis.split(",")}
            for version in self.versions:
                out.append({"id": point_id(version, grid), "version": version, "grid": grid, "params": params})
        return out

    def cli_args(self, point: dict) -> list[str]:
        """The argv (after ``python -m app.kernel``) that profiles this point."""
        args = [self.kernel, point["version"]]
        for name, value in point["params"].items():
            args += [f"--{name}", str(value)]
        args += ["--prof_type", self.prof_type, "--device", self.device, "--warmup", str(self.warmup)]
        if self.bench_runs is not None:
            args += ["--bench_runs", str(self.bench_runs)]
        if self.prof_type == "event":
            # --overhead quick: 30 pairs for the marks' cost, not up to ~1 s more of them. Those runs hold the
            # host's measurement window, which the sweep's points take one at a time across all the GPUs.
            args += ["--l2", self.l2, "--overhead", "quick"]
        return args

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "SweepSpec":
        return cls(**json.loads(text))


def point_id(version: str, grid: dict) -> str:
    return "_".join([version] + [f"{k.replace(',', '+')}-{human(v)}" for k, v in grid.items()])


def parse_versions(kernel: str, text: str | None) -> list[str]:
    """'v1,v2' (or None: every version of the kernel), each checked."""
    known = kernels().get(kernel)
    if known is None:
        get_plan_class(kernel)                       # raises the one-line "unknown kernel"
    if text is None:
        return sorted(known, key=lambda v: int(v.lstrip("v")))
    versions = [v.strip() for v in text.split(",") if v.strip()]
    if not versions:
        raise BadParameter(f"version list {text!r} names no version; write v1,v2 or leave it out for all of "
                           f"{kernel}'s versions")
    for v in versions:
        get_plan_class(kernel, v)
    if len(set(versions)) != len(versions):
        raise BadParameter(f"version list {text!r} names a version twice")
    return versions


def parse_grid(kernel: str, versions: list[str], grid_args: list[str]) -> dict[str, list]:
    """``--grid points=100k,1M`` (repeatable) -> {"points": [100000, 1000000]}, values checked by the plan.

    ``--grid left,right=1k,10k`` ties parameters: both take each value (the diagonal of their grid)."""
    if not grid_args:
        raise BadParameter("a sweep needs at least one --grid NAME=V1,V2,... (e.g. --grid points=10k,100k,1M)")
    spec = {p.name: p for p in get_plan_class(kernel, versions[0]).params_spec}
    axes: dict[str, list] = {}
    for arg in grid_args:
        name, sep, values = arg.partition("=")
        names = [n.strip().lstrip("-") for n in name.split(",")]
        name = ",".join(names)
        if not sep or not values.strip() or not all(names):
            raise BadParameter(f"--grid {arg!r}: write NAME=V1,V2,... (e.g. points=10k,100k,1M)")
        for n in names:
            if n not in spec:
                raise BadParameter(f"--grid {n}: {kernel} has no parameter {n!r}; known: {', '.join(spec)}")
            if any(n in axis.split(",") for axis in axes) or names.count(n) > 1:
                raise BadParameter(f"--grid {n} is given twice; put all its values in one --grid")
        parsed = [spec[names[0]].parse(v.strip()) for v in values.split(",") if v.strip()]
        if not parsed:                        # "points=,,": an axis of no value would be a sweep of no point
            raise BadParameter(f"--grid {arg!r} gives no value; write NAME=V1,V2,... (e.g. points=10k,100k,1M)")
        for n in names[1:]:                   # a tied parameter must accept every value too
            for v in parsed:
                spec[n].parse(v)
        if len(set(parsed)) != len(parsed):
            raise BadParameter(f"--grid {name} repeats a value")
        axes[name] = parsed
    return axes


def check_points(spec: SweepSpec, local: bool = True) -> None:
    """Every point's plan is refused here as its own profile would refuse it, before any worker starts or any
    folder is made: its parameters, the kernels' 32-bit index limit and (``local``: the points run on this
    machine) the host memory free now. A point's GPU memory is left to the profile, which checks its own GPU:
    reading it here would open a CUDA context in the sweep's process for the whole sweep."""
    # "auto" may run on the GPU, whose buffers are not in host memory: count the smaller need, so that nothing
    # that could run is refused.
    device = "cpu" if spec.device == "cpu" else "gpu"
    host = available_host_bytes() if local else None
    for p in spec.points():
        try:
            plan = get_plan_class(spec.kernel, p["version"])(p["params"])
            check_fits(plan, device, host_bytes=math.inf if host is None else host, device_free=math.inf)
        except AppError as exc:
            raise BadParameter(f"point {p['id']}: {exc}") from None


def load_spec(sweep_dir: Path) -> SweepSpec:
    path = Path(sweep_dir) / SPEC_FILE
    try:
        return SweepSpec.from_json(path.read_text())
    except FileNotFoundError:
        raise BadParameter(f"--resume {sweep_dir}: no {SPEC_FILE} there; give the folder a sweep printed "
                           "(out/sweeps/<kernel>/<name>/<time>)") from None
    except (ValueError, TypeError) as exc:
        raise BadParameter(f"--resume {sweep_dir}: {SPEC_FILE} is unreadable ({exc}); start a new sweep") from None
