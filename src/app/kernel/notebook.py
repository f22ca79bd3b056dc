"""Profile from Python -- a notebook, a script -- with the same code path as the CLI.

    from app.kernel import profile
    p = profile("join", "v2", prof_type="event", points=100_000, polygons=10_000, bench_runs=20)
    p.stages          # pandas DataFrame, one row per stage
    p.kernels         # pandas DataFrame, one row per kernel (counters in annotation/ncu mode)
    p.trace, p.report_md, p.path

Nothing is written unless ``out`` is given; then the profile folder is written exactly as
the CLI writes it and ``path`` names it. Keyword arguments are the kernel's parameters or
profiling options; anything else is refused with the list of what is accepted.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from app.errors import BadParameter
from app.kernel.plan import get_plan_class
from app.runtime.profiling.base import ProfileOptions, get_mode

_NOT_OPTIONS = {"argv"}


@dataclass
class ProfileResult:
    trace: dict
    files: dict
    path: Path | None = None

    @property
    def report_md(self) -> str:
        return self.files.get("report.md", "")

    @property
    def stages(self) -> pd.DataFrame:
        rows = []
        for s in self.trace["stages"]:
            sp = s.get("spread", {})
            rows.append({"stage": s["name"], "category": s["category"], "device": s["device"],
                         "elapsed_us": s["elapsed_seconds"] * 1e6,
                         "robust_spread_pct": 100 * sp["robust_rel_spread"] if "robust_rel_spread" in sp else None,
                         "outlier_runs": sp.get("outliers"), "host_us": s.get("host_seconds", float("nan")) * 1e6,
                         "rows_in": s["rows_in"], "rows_out": s["rows_out"]}
                        | {f"ncu_{k}": v for k, v in (s.get("ncu") or {}).items()})
        return pd.DataFrame(rows)

    @property
    def kernels(self) -> pd.DataFrame:
        """Counter modes: the measured per-kernel table. Event and nsys mode: each stage kernel's build
        facts (registers, shared/local bytes, theoretical occupancy) from compiled/ (empty on the CPU)."""
        if "kernels.csv" in self.files:
            return pd.read_csv(io.StringIO(self.files["kernels.csv"]))
        rows = []
        for name, content in self.files.items():
            if name.startswith("compiled/") and name.endswith("/resources.json"):
                stage = name.split("/")[1]
                doc = json.loads(content) if isinstance(content, str) else content
                rows += [{"stage": stage, "kernel": k} | v for k, v in doc.get("kernels", {}).items()]
        return pd.DataFrame(rows, columns=None if rows else ["stage", "kernel"])


def profile(kernel: str, version: str | None = None, prof_type: str = "event", out: str | None = None,
            **kwargs) -> ProfileResult:
    plan_cls = get_plan_class(kernel, version)
    param_names = {p.name for p in plan_cls.params_spec}
    option_names = {f.name for f in fields(ProfileOptions)} - _NOT_OPTIONS
    unknown = sorted(set(kwargs) - param_names - option_names)
    if unknown:
        raise BadParameter(f"profile() got {unknown[0]!r}: neither a parameter of {kernel} "
                           f"({', '.join(sorted(param_names))}) nor an option ({', '.join(sorted(option_names))})")
    plan = plan_cls({k: v for k, v in kwargs.items() if k in param_names})
    options = ProfileOptions(**{k: v for k, v in kwargs.items() if k in option_names},
                             argv=["app.kernel.profile", kernel, plan.version, f"--prof_type={prof_type}"])
    result = get_mode(prof_type).profile(plan, options)
    path = None
    if out is not None:
        from app.report.writer import profile_parent, write_profile

        path = Path(write_profile(profile_parent(out, prof_type, plan.kernel, plan.slug()), result.files))
    return ProfileResult(result.trace, result.files, path)
