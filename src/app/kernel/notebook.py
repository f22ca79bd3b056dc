"""Profile from Python -- a notebook, a script -- with the same code path as the CLI.

    from app.kernel import profile
    p = profile("join", "v2", prof_type="event", points=100_000, polygons=10_000, bench_runs=20)
    p.stages          # pandas DataFrame, one row per stage
    p.kernels         # pandas DataFrame, one row per kernel (counters in annotation/ncu mode)
    p.trace, p.report_md, p.path, p.ok

Nothing is written unless ``out`` is given; then the profile folder is written exactly as
the CLI writes it and ``path`` names it. Keyword arguments are the kernel's parameters or
profiling options; anything else is refused with the list of what is accepted. Everything
the CLI checks before it profiles (the options, ``out``, ``baseline``) is checked here
before profiling too, and a wrong answer raises, as the CLI exits 9 (see ``profile``).
"""
from __future__ import annotations

import io
import json
import math
import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from app.errors import (AppError, BadParameter, DeviceUnavailable, OutputNotWritable, VerificationCouldNotRun,
                        VerificationFailed)
from app.kernel.plan import get_plan_class
from app.runtime.profiling.base import ProfileOptions, get_mode

_NOT_OPTIONS = {"argv"}


@dataclass
class ProfileResult:
    trace: dict
    files: dict
    path: Path | None = None
    ok: bool = True          # False: the output did not match the reference, or could not be checked

    @property
    def report_md(self) -> str:
        return self.files.get("report.md", "")

    @property
    def stages(self) -> pd.DataFrame:
        """One row per stage. A figure the capture lacks (a stage time ncu could not attribute: elapsed_seconds
        null) is NaN, never a crash or a zero, and the row's ``missing`` column names it."""
        rows = []
        for s in self.trace["stages"]:
            sp = s.get("spread") or {}
            row = {"stage": s["name"], "category": s.get("category"), "device": s.get("device"),
                   "elapsed_us": _us(s.get("elapsed_seconds")),
                   "robust_spread_pct": _pct(sp.get("robust_rel_spread")), "outlier_runs": sp.get("outliers"),
                   "host_us": _us(s.get("host_seconds")), "rows_in": s.get("rows_in"), "rows_out": s.get("rows_out")}
            row |= {f"ncu_{k}": (math.nan if v is None else v) for k, v in (s.get("ncu") or {}).items()}
            missing = [name for name, value in (("elapsed_us", s.get("elapsed_seconds")),
                                                *((f"ncu_{k}", v) for k, v in (s.get("ncu") or {}).items()))
                       if value is None]
            if "host_seconds" in s and s["host_seconds"] is None:
                missing.append("host_us")
            rows.append(row | {"missing": ", ".join(missing)})
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


def _us(seconds) -> float:
    """Seconds as microseconds; a missing figure (None) as NaN."""
    return math.nan if seconds is None else seconds * 1e6


def _pct(fraction) -> float:
    return math.nan if fraction is None else 100 * fraction


def _literal(value) -> str:
    """A value as Python source: strings (and paths) in double quotes, which a shell's single quotes leave alone."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):      # a numpy scalar: its Python value
        value = value.item()
    return json.dumps(value) if isinstance(value, str) else repr(value)


def call_text(kernel, version, prof_type: str, out, force: bool, kwargs: dict) -> list[str]:
    """The call as params.json's command_line records it: a command that repeats it,
    ``python -c 'from app.kernel import profile; profile("join", "v1", prof_type="event", points=300)'``."""
    args = [_literal(kernel)] + ([_literal(version)] if version is not None else [])
    args += [f"prof_type={_literal(prof_type)}"] + ([f"out={_literal(out)}"] if out is not None else [])
    args += ["force=True"] if force else []
    # A baseline handed over as a loaded trace is named, not written out whole into the command line.
    args += [f"{k}={'<a trace dict>' if k == 'baseline' and isinstance(v, dict) else _literal(v)}"
             for k, v in kwargs.items()]
    return ["python", "-c", f"from app.kernel import profile; profile({', '.join(args)})"]


def _device_name(device: str, prof_type: str) -> str | None:
    """The device the run will use, as cli._baseline finds it: event mode profiles where --device says; the
    others, on auto, on the GPU. None where it cannot be used (the mode itself then says why)."""
    from app.runtime import device as devmod

    wanted = device if prof_type == "event" or device != "auto" else "gpu"
    try:
        return devmod.select(wanted).device_name
    except DeviceUnavailable:
        return None


def _python_words(message: str) -> str:
    """The CLI's wording of a baseline refusal, for a caller in Python."""
    return (message.replace("run once without --baseline first", "profile once with out= and no baseline first")
            .replace("--baseline latest", "baseline='latest'").replace("--baseline ", "baseline=")
            .replace("pass --force", "pass force=True").replace("under --out", "under out="))


def _baseline(baseline, plan, prof_type: str, device: str, out, force: bool) -> dict | None:
    """``baseline`` read and checked before profiling, as the CLI's --baseline: a profile folder, its trace.json, or
    "latest" (the newest earlier profile of this kernel, version, mode, parameters and device under ``out``, or
    under out/ -- the CLI's default -- when ``out`` is None); a trace already loaded (a dict) is checked the same way."""
    from app.analysis.baseline import check_baseline, latest_profile, load_baseline
    from app.report.writer import profile_parent

    if baseline is None:
        return None
    if isinstance(baseline, dict):      # loaded already: checked as one read from a folder is
        try:
            return check_baseline(baseline, "<the trace given>", plan, _device_name(device, prof_type), force)
        except AppError as exc:
            raise type(exc)(_python_words(str(exc))) from None
    if not isinstance(baseline, (str, os.PathLike)) or not os.fspath(baseline):
        raise BadParameter(f"baseline={baseline!r}: expected a profile folder, its trace.json, 'latest', or None")
    path, device_name = os.fspath(baseline), _device_name(device, prof_type)
    try:
        if path == "latest":
            path = latest_profile(profile_parent(out if out is not None else "out", prof_type, plan.kernel,
                                                 plan.slug()), device_name)
            print(f"baseline: {path}", file=sys.stderr)
        return load_baseline(path, plan, device_name, force)
    except AppError as exc:             # BadParameter; VerificationFailed for a baseline of a wrong answer
        raise type(exc)(_python_words(str(exc))) from None


def _unwritable(out, exc: Exception) -> OutputNotWritable:
    """The writer's refusal in a Python caller's words (out=, not --out)."""
    why = str(exc).split("; pass --out")[0]
    return OutputNotWritable(f"out={_literal(out)}: {why}; pass out= a writable folder, or out=None to keep the "
                             "profile in memory only")


def _check_out(out, prof_type: str, plan) -> Path:
    """The folder the profile will be written under, checked before profiling (as the CLI checks --out), and a
    folder made and removed in its nearest existing ancestor: permissions alone pass /proc for root, where no folder
    can be made."""
    import tempfile

    from app.report.writer import check_writable, first_existing, profile_parent

    if not isinstance(out, (str, os.PathLike)) or not os.fspath(out):
        raise BadParameter(f"out={out!r}: expected a folder to write the profile under, or None to write nothing")
    parent = profile_parent(out, prof_type, plan.kernel, plan.slug())
    try:
        check_writable(parent)
        os.rmdir(tempfile.mkdtemp(prefix=".app-probe-", dir=first_existing(parent)))
    except OutputNotWritable as exc:
        raise _unwritable(out, exc) from None
    except OSError as exc:
        raise _unwritable(out, f"cannot make a folder under {parent} ({exc.strerror or exc})") from None
    return parent


def _verification_failure(result: ProfileResult) -> VerificationFailed | None:
    """The CLI's exit 9 (a wrong answer) or 10 (the check could not run) as an exception, or None."""
    from app.analysis.baseline import verification_of, verification_state, what_differs

    v = verification_of(result.trace)
    state = verification_state(v)
    if state in ("ok", "skipped") and result.ok:
        return None
    kept = (f"the profile is kept at {result.path} for inspection" if result.path is not None
            else "nothing was written (pass out= to keep it)")
    if state == "error":
        message = (f"verification could not run ({v['error']}); {kept} with its output unverified: install or fix "
                   "the oracle and profile again, or pass verify=False to time without a check")
    elif state == "mismatch":
        message = f"output does not match {v.get('oracle')}: {what_differs(v)}; {kept}"
    else:       # a mode that judged the output wrong by itself
        message = f"output does not match the reference; {kept}"
    kind = VerificationCouldNotRun if state == "error" else VerificationFailed     # the CLI's exit 10 or 9
    exc = kind(f"{message}. The timings are of a wrong answer; the result is this error's .result")
    exc.result = result
    return exc


def profile(kernel: str, version: str | None = None, prof_type: str = "event", out: str | None = None, *,
            force: bool = False, **kwargs) -> ProfileResult:
    """Profile one plan of ``kernel`` (at ``version``, else its default) in mode ``prof_type``, as
    ``python -m app.kernel KERNEL [VERSION] --prof_type MODE ...`` does, and return a ``ProfileResult``.

    Keyword arguments are the kernel's parameters (``points=100_000``, ``predicate="within"``...) and the profiling
    options (``device``, ``bench_runs``, ``warmup``, ``nvtx``, ``verify``, ``l2``, ``graph``, ``overhead``, ``ncu``,
    ``ncu_timeout``, ``clock_control``, ``nsys``, ``nsys_timeout``, ``backend``; see ProfileOptions), each checked
    for its choices, type and range before anything runs (a ValueError naming the option and what it takes).

    ``out``: a folder to write the profile under, exactly as the CLI's ``--out`` (``result.path`` names the
    profile's folder); checked writable before profiling. None (the default) writes nothing.

    ``baseline``: a previous profile folder (or its trace.json), or ``"latest"`` -- the newest earlier profile of
    this kernel, version, mode, parameters and device under ``out`` (under ``out/``, the CLI's default, when
    ``out`` is None). Read and checked before profiling; the report then holds a vs Baseline section. It must be of
    the same kernel, version, parameters and device unless ``force=True``.

    A wrong answer is never returned as a measurement: where the output does not match the reference (the CLI's
    exit 9), or the check could not run (exit 10), ``VerificationFailed`` is raised after the profile is written
    (when ``out`` is given; the message names its folder). Its ``.result`` is the ProfileResult, with ``ok``
    False, for inspection. ``verify=False`` skips the check (``ok`` stays True; the report says it was skipped).

    The call is recorded in params.json's ``command_line`` as a ``python -c`` command that repeats it.
    """
    get_mode(prof_type)            # an unknown mode is refused first, with the list of modes
    plan_cls = get_plan_class(kernel, version)
    param_names = {p.name for p in plan_cls.params_spec}
    option_names = {f.name for f in fields(ProfileOptions)} - _NOT_OPTIONS
    unknown = sorted(set(kwargs) - param_names - option_names)
    if unknown:
        raise BadParameter(f"profile() got {unknown[0]!r}: neither a parameter of {kernel} "
                           f"({', '.join(sorted(param_names))}) nor an option ({', '.join(sorted(option_names))}; "
                           "and force)")
    plan = plan_cls({k: v for k, v in kwargs.items() if k in param_names})
    given = {k: v for k, v in kwargs.items() if k in option_names}
    baseline = given.pop("baseline", None)
    options = ProfileOptions(**given, argv=call_text(kernel, version, prof_type, out, force, kwargs))
    parent = _check_out(out, prof_type, plan) if out is not None else None
    options.baseline = _baseline(baseline, plan, prof_type, options.device, out, force)
    result = get_mode(prof_type).profile(plan, options)
    path = None
    if parent is not None:
        from app.report.writer import write_profile

        try:
            path = Path(write_profile(parent, result.files))
        except OutputNotWritable as exc:      # the disk filled meanwhile: the profile is not lost to the caller
            failure = _unwritable(out, exc)
            failure.result = ProfileResult(result.trace, result.files, None, ok=result.ok)
            raise failure from None
    found = ProfileResult(result.trace, result.files, path, ok=result.ok)
    failure = _verification_failure(found)
    if failure is not None:
        found.ok = False
        raise failure
    return found
