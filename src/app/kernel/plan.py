"""KernelPlan: a kernel version bound to parameters, described as named stages.

Every mode runs a plan the same way: ``plan.run(inputs, recorder)`` walks
``plan.stages`` in order and calls the backend's method of the same name inside
``recorder.stage(spec)``. The recorder decides what is measured (CUDA events,
a monotonic clock, NVTX ranges); the plan decides what is computed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from app.errors import BadParameter

CATEGORIES = ("setup", "sort", "filter", "refine", "emit")


@dataclass(frozen=True)
class Param:
    name: str
    type: type
    default: Any
    help: str
    choices: tuple | None = None
    minimum: int | None = None

    def parse(self, raw: Any) -> Any:
        try:
            value = parse_count(raw) if self.type is int else self.type(raw)
        except (TypeError, ValueError):
            raise BadParameter(f"--{self.name} expects {self.type.__name__}, got {raw!r}") from None
        if self.choices is not None and value not in self.choices:
            raise BadParameter(f"--{self.name}={value!r} is not one of {', '.join(map(str, self.choices))}")
        if self.minimum is not None and value < self.minimum:
            raise BadParameter(f"--{self.name}={value} must be >= {self.minimum}")
        return value


_SUFFIX = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}


def parse_count(raw: Any) -> int:
    """A whole number as a user writes sizes: 2000, 100k, 1M, 1.5M (k, M, G by 1000)."""
    if isinstance(raw, bool):
        raise ValueError(raw)
    if isinstance(raw, int):
        return raw
    text = str(raw).strip().replace("_", "")
    scale = _SUFFIX.get(text[-1:].lower())
    if scale is None:
        return int(text)
    value = float(text[:-1]) * scale
    if not value.is_integer():
        raise ValueError(raw)
    return int(value)


@dataclass(frozen=True)
class StageSpec:
    name: str
    category: str
    summary: str
    # Tunables: name -> candidate values; the first is the default.
    tunables: dict[str, tuple] = field(default_factory=dict)

    def __post_init__(self):
        assert self.category in CATEGORIES, self.category


@dataclass(frozen=True)
class Footprint:
    host_bytes: int                 # inputs, intermediates, outputs and the shapely oracle on the host
    device_bytes: int               # owned buffers, intermediates and outputs on the GPU
    scale: str                      # the parameter that drives the size (named in a refusal)
    indices: dict                   # element counts the kernels address with 32-bit indices


@dataclass(frozen=True)
class Cost:
    """Minimum traffic and arithmetic of a stage: the roofline's numerator."""

    bytes: float
    flops: float = 0.0
    precision: str = "fp64"
    note: str = ""
    kind: str = "dram"          # "dram", or "host_link" for host<->device copies (not on the DRAM roofline)


class KernelPlan:
    kernel: ClassVar[str]
    version: ClassVar[str]
    summary: ClassVar[str]            # one line: what this version does differently
    # The version whose stages this one runs on the CPU, where its difference is in its GPU kernels only (None: its
    # own). Profiles of the two on the CPU time the same code, and say so.
    cpu_stages_of: ClassVar[str | None] = None
    params_spec: ClassVar[tuple[Param, ...]]
    stages: ClassVar[tuple[StageSpec, ...]]

    def __init__(self, params: dict | None = None, tiling: dict | None = None):
        self.params = self.resolve_params(params or {})
        names = {s.name for s in self.stages}
        tiling = tiling or {}
        unknown = set(tiling) - names
        if unknown:
            raise BadParameter(f"no stage named {sorted(unknown)[0]!r} in {self.kernel} {self.version}")
        # Chosen tiling per stage: defaults overridden by the caller (autotune cache).
        self.tiling = {s.name: {k: v[0] for k, v in s.tunables.items()} | tiling.get(s.name, {})
                       for s in self.stages}

    @classmethod
    def resolve_params(cls, given: dict) -> dict:
        spec = {p.name: p for p in cls.params_spec}
        unknown = set(given) - set(spec)
        if unknown:
            name = sorted(unknown)[0]
            raise BadParameter(f"unknown parameter --{name} for {cls.kernel}; known: "
                               + ", ".join(f"--{p}" for p in spec))
        return {name: p.parse(given[name]) if name in given else p.default for name, p in spec.items()}

    def slug(self) -> str:
        """Stable, readable folder name for these parameters."""
        parts = [self.version] + [f"{k}-{human(v)}" for k, v in self.params.items()]
        return "_".join(parts)

    # --- what a kernel package provides -------------------------------------------
    def make_inputs(self):
        raise NotImplementedError

    def footprint(self) -> Footprint | None:
        """A conservative estimate of the memory these parameters need, checked before any allocation."""
        return None

    def backend(self, device: str):
        """The object whose methods, named after the stages, run them on ``device``."""
        raise NotImplementedError

    def cost(self, stage: str, rows_in: int, rows_out: int, meta: dict, inputs) -> Cost:
        raise NotImplementedError

    def verify(self, inputs, output) -> dict:
        raise NotImplementedError

    # --- the one code path ------------------------------------------------------------
    def run(self, inputs, backend, recorder):
        return self.run_stages({"inputs": inputs}, self.stages, backend, recorder)["output"]

    def run_stages(self, state: dict, stages, backend, recorder) -> dict:
        """Run ``stages`` in order on ``state`` (a whole run starts from {"inputs": ...}); returns the state.
        A CUDA graph capture runs the stages after the host->device build this way."""
        for spec in stages:
            with recorder.stage(spec) as st:
                getattr(backend, spec.name)(state, st, self.tiling[spec.name])
        return state


def stages_tile_run(plan: KernelPlan) -> bool:
    """Whether the plan's run is exactly its stages in order (KernelPlan.run): each stage starts where the one
    before it ended, and the run ends as its last stage does. A plan with a run of its own may work between or
    after its stages."""
    return type(plan).run is KernelPlan.run


REGISTRY: dict[str, dict[str, type[KernelPlan]]] = {}
# kernel -> (version, why): the version a run that names none gets, where it is not the latest.
DEFAULTS: dict[str, tuple[str, str]] = {}


def set_default(kernel: str, version: str, why: str) -> None:
    """Make ``version`` the kernel's default: the fastest one measured at the default sizes, and say so."""
    DEFAULTS[kernel] = (version, why)


def default_version(kernel: str, versions) -> str:
    chosen = DEFAULTS.get(kernel)
    return chosen[0] if chosen and chosen[0] in versions else latest_version(versions)


def register(cls: type[KernelPlan]) -> type[KernelPlan]:
    REGISTRY.setdefault(cls.kernel, {})[cls.version] = cls
    return cls


def _load_kernels() -> None:
    # Importing a kernel package registers its versions.
    import app.kernel.join  # noqa: F401
    import app.kernel.overlay  # noqa: F401


def get_plan_class(kernel: str, version: str | None = None) -> type[KernelPlan]:
    _load_kernels()
    if kernel not in REGISTRY:
        raise BadParameter(f"unknown kernel {kernel!r}; available: {', '.join(sorted(REGISTRY))}")
    versions = REGISTRY[kernel]
    if version is None:
        return versions[default_version(kernel, versions)]
    if version not in versions:
        raise BadParameter(f"unknown version {version!r} of {kernel}; available: {', '.join(sorted(versions))}")
    return versions[version]


def same_cpu_code(kernel: str, versions) -> dict[str, list[str]]:
    """Of ``versions``, those whose CPU runs time one version's stages, by that version (only groups of two or more):
    on the CPU their difference from each other is the runs' noise, not the versions' (see cpu_stages_of)."""
    groups: dict[str, list[str]] = {}
    for v in versions:
        groups.setdefault(get_plan_class(kernel, v).cpu_stages_of or v, []).append(v)
    return {ran: vs for ran, vs in groups.items() if len(vs) > 1}


def latest_version(versions) -> str:
    return max(versions, key=lambda v: int(v.lstrip("v")))


def kernels() -> dict[str, dict[str, type[KernelPlan]]]:
    _load_kernels()
    return REGISTRY


def human(v) -> str:
    """A parameter value as folder names show it: 100000 -> 100k, 2000000 -> 2M."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int) and not isinstance(v, bool):
        for unit, size in (("M", 1_000_000), ("k", 1_000)):
            if v >= size and v % size == 0:
                return f"{v // size}{unit}"
        return str(v)
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def columns_problem(output, columns: dict[str, str]) -> tuple[str | None, list]:
    """Whether ``output`` has the form a plan's output contract gives: one 1-D array per column of ``columns``
    (name -> the numpy dtype kinds it may hold: "iu" integers, "iuf" numbers). Returns (the first problem or None,
    the columns as arrays); a verify() reads a malformed answer as a mismatch, not a check that could not run."""
    import numpy as np

    cols = [np.asarray(x) for x in output]
    if len(cols) != len(columns):
        return f"{len(cols)} columns, not {len(columns)} ({', '.join(columns)})", cols
    for (name, kinds), col in zip(columns.items(), cols):
        if col.ndim != 1:
            return f"the {name} column has shape {col.shape}, not one dimension", cols
        if col.dtype.kind not in kinds:
            return f"the {name} column holds {col.dtype}, not {'numbers' if 'f' in kinds else 'integers'}", cols
    return None, cols
