"""Autotuning: search the stages' tunables on the GPU, cache the best, reuse it in every mode.

Search: coordinate descent, stage by stage in plan order and tunable by tunable, each
candidate scored by the median *plan* total of event-timed runs (L2 flushed before each):
a tunable such as the grid level of the Morton sort changes the work of later stages too,
so a stage's own time would mislead. One pass; the defaults are measured first, so the
result is never slower than them by more than the noise of the runs.

Cache: one JSON file per (kernel, version, GPU UUID, driver, parameters) under
``$APP_CACHE_DIR/autotune/`` (default ``~/.cache/app-kernel``), holding the best tiling
per stage and every configuration tried with its time. Later runs in every mode reuse it;
``--retune`` searches again; ``--tiling stage.key=value`` overrides by hand.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import sys
from pathlib import Path

from app.errors import BadParameter
from app.runtime import cache

TIMED_RUNS = 10
WARMUP = 2


def cache_root() -> Path:
    return cache.cache_dir("autotune")


def cache_key(plan, selection) -> dict:
    info = selection.info or {}
    return {"kernel": plan.kernel, "version": plan.version, "gpu": info.get("uuid") or selection.device_name,
            "model": selection.device_name, "driver": info.get("driver_version"), "params": plan.params}


def sources_hash(plan_cls, kernel_dir: Path | None = None) -> str:
    """Of the code the plan's GPU kernels are built and launched from -- the CUDA sources and headers, shared and
    the kernel's own, and the kernel's gpu.py, which chooses grids and launches them: a cached tiling found for
    other code may no longer build or be best, so it is dropped (with a warning) rather than trusted."""
    kernel_dir = kernel_dir or Path(__file__).resolve().parents[1] / "kernel"
    own = kernel_dir / plan_cls.kernel
    files = [f for d in (kernel_dir, own) for pattern in ("*.cu", "*.cuh") for f in sorted(d.glob(pattern))]
    files += [own / "gpu.py"] if (own / "gpu.py").is_file() else []
    h = hashlib.sha1()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def cache_path(key: dict) -> Path:
    digest = hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return cache_root() / f"{key['kernel']}-{key['version']}-{digest}.json"


def parse_overrides(items: list[str], plan_cls) -> dict:
    """--tiling stage.key=value (repeatable) -> {stage: {key: value}}, each checked against the plan."""
    stages = {s.name: s for s in plan_cls.stages}
    out: dict = {}
    for item in items or []:
        name, eq, raw = item.partition("=")
        stage, dot, key = name.partition(".")
        if not (eq and dot):
            example = next((f"{s.name}.{k}={v[0]}" for s in plan_cls.stages for k, v in s.tunables.items() if v), None)
            raise BadParameter(f"--tiling {item!r}: expected STAGE.KEY=VALUE"
                               + (f", e.g. {example}" if example else ""))
        if stage not in stages:
            raise BadParameter(f"--tiling {item!r}: no stage {stage!r}; stages: {', '.join(stages)}")
        choices = stages[stage].tunables.get(key)
        if choices is None:
            raise BadParameter(f"--tiling {item!r}: {stage} has no tunable {key!r}; tunables: "
                               f"{', '.join(stages[stage].tunables) or 'none'}")
        try:
            value = type(choices[0])(raw)
        except ValueError:
            raise BadParameter(f"--tiling {item!r}: {key} expects {type(choices[0]).__name__}") from None
        if value not in choices:
            raise BadParameter(f"--tiling {item!r}: {key} must be one of {', '.join(map(str, choices))}")
        out.setdefault(stage, {})[key] = value
    return out


def load(key: dict, plan_cls) -> tuple[dict | None, str | None]:
    """(the cached entry, None); (None, None) when there is none; (None, why) when one is there but is not
    to be trusted: unreadable, made for other kernel sources, or naming values the plan no longer offers."""
    path = cache_path(key)
    doc, why = cache.read_json(path)
    if doc is None:
        return None, why
    stages = {s.name: s.tunables for s in plan_cls.stages}
    best = doc.get("best") if isinstance(doc, dict) else None
    if not isinstance(best, dict) or doc.get("key") != json.loads(json.dumps(key, default=str)):
        return None, f"{path} is not an autotune entry of this run's kernel, GPU and parameters"
    if doc.get("sources") != sources_hash(plan_cls):
        return None, f"{path} was searched with other kernel sources"
    for stage, tiling in best.items():
        if stage not in stages or not isinstance(tiling, dict) or any(
                k not in stages[stage] or not _offered(v, stages[stage][k]) for k, v in tiling.items()):
            return None, f"{path} names a stage or value {plan_cls.kernel} {plan_cls.version} no longer has"
    for field, kinds in REQUIRED.items():
        if field not in doc:
            return None, f"{path} has no {field!r}"
        if not isinstance(doc[field], kinds) or isinstance(doc[field], bool):
            return None, f"{path}: {field!r} has the wrong type"
    return doc, None


# What resolve() and tiling_files() read from an entry besides "best": one missing is a dropped entry, not a crash.
REQUIRED = {"measured_at": str, "method": str, "default_total_seconds": (int, float),
            "best_total_seconds": (int, float), "history": dict}


def _offered(value, choices) -> bool:
    """Exactly one of the values the stage offers: 128.0 or True is not the int 128 or 1."""
    return any(type(value) is type(c) and value == c for c in choices)


def save(key: dict, doc: dict) -> Path:
    return cache.write_json(cache_path(key), doc)


def _trial(measure, tiling) -> tuple[float | None, dict, str | None]:
    """(total, stage times, None), or (None, {}, why) for a configuration that fails to build or run, or
    whose output the oracle rejects: such a configuration is recorded, never chosen, never a crash."""
    try:
        res = measure(tiling)
    except Exception as exc:              # a launch shape the kernel cannot take: skip it, say why
        return None, {}, f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if len(res) > 2 and not res[2]:
        return None, {}, "rejected: the output differs from the oracle's"
    return res[0], res[1], None


def search(plan_cls, params: dict, measure, progress=None) -> dict:
    """Coordinate descent over every stage's tunables. ``measure(tiling)`` -> (plan total seconds,
    {stage: seconds}[, output verified]); the defaults are measured first. Returns best, history and
    both totals."""
    defaults = {s.name: {k: v[0] for k, v in s.tunables.items()} for s in plan_cls.stages if s.tunables}
    best = json.loads(json.dumps(defaults))
    base_total, base_stages, why = _trial(measure, best)
    if why:
        raise BadParameter(f"autotune: the default configuration itself {why}; nothing to tune against")
    best_total = base_total
    history = {stage: [{"tiling": dict(t), "total_seconds": base_total, "stage_seconds": base_stages.get(stage),
                        "note": "defaults"}] for stage, t in defaults.items()}
    candidates = [(s.name, k, v) for s in plan_cls.stages for k, vs in s.tunables.items() for v in vs[1:]]
    for i, (stage, key, value) in enumerate(candidates, 1):
        trial = json.loads(json.dumps(best))
        trial[stage][key] = value
        if progress:
            progress(i, len(candidates), f"{stage}.{key}={value}")
        total, stages, why = _trial(measure, trial)
        history[stage].append({"tiling": dict(trial[stage]), "total_seconds": total,
                               "stage_seconds": stages.get(stage)} | ({"note": why} if why else {}))
        if total is not None and total < best_total:
            best, best_total = trial, total
    return {"best": best, "history": history, "default_total_seconds": base_total,
            "best_total_seconds": best_total, "method": "coordinate descent, one pass, stage by stage in plan "
            "order; score = median plan total of event-timed runs, L2 flushed before each"}


def gpu_measure(plan_cls, params: dict, selection):
    """measure(tiling) for search(): event timing of the real plan on the GPU (inputs made once)."""
    from app.runtime.execute import backend_for, xp_for
    from app.runtime.nvtx import Nvtx
    from app.runtime.recorder import Recorder
    from app.runtime.stats import spread
    from app.runtime.timing import L2Flush

    inputs = plan_cls(params).make_inputs()
    flush = L2Flush(selection.selected, "flush", selection.info.get("l2_bytes"))

    def measure(tiling):
        plan = plan_cls(params, tiling)
        backend, _ = backend_for(plan, selection)
        rec = Recorder(selection.selected, xp_for(selection.selected), Nvtx(False, plan.kernel))
        for _ in range(1 + WARMUP):
            flush()
            rec.run(plan, inputs, backend)
        runs = []
        for _ in range(TIMED_RUNS):
            flush()
            runs.append(rec.run(plan, inputs, backend)[1])
        stages = {s["name"]: spread([r.stages[i]["seconds"] for r in runs])["median"]
                  for i, s in enumerate(runs[0].stages)}
        output, _ = rec.run(plan, inputs, backend)
        verified = plan.verify(inputs, backend.outputs_to_host(output))["matches"]
        return spread([r.total_seconds for r in runs])["median"], stages, verified

    return measure


def resolve(plan, selection, *, autotune: bool, retune: bool, overrides: list[str], progress=None):
    """The plan to profile: its tiling from --tiling, the cache, a search or the defaults, with
    ``tiling_source`` and ``tuning_history`` per stage for the profile's tiling/ artifacts."""
    plan_cls = type(plan)
    hand = parse_overrides(overrides, plan_cls)
    key = cache_key(plan, selection) if selection.selected == "gpu" else None
    doc, why = load(key, plan_cls) if key and not retune else (None, None)
    if why:
        print(f"warning: autotune cache entry dropped: {why}; using the defaults"
              + ("" if autotune else " (--autotune searches again)"), file=sys.stderr)
    searched = False
    if (autotune or retune) and doc is None:
        if selection.selected != "gpu":
            raise BadParameter("--autotune/--retune search GPU launch shapes and need a GPU run (--device gpu)")
        from app.runtime.lock import device_key, device_lock, measurement_window

        with device_lock(device_key(selection)), measurement_window():     # candidates timed alone on the host
            result = search(plan_cls, plan.params, gpu_measure(plan_cls, plan.params, selection), progress)
        doc = {"key": json.loads(json.dumps(key, default=str)), "sources": sources_hash(plan_cls),
               "measured_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")} | result
        doc["path"] = str(save(key, doc))
        searched = True
    tiling = {s: dict(t) for s, t in (doc or {}).get("best", {}).items()}
    for stage, kv in hand.items():
        tiling.setdefault(stage, {}).update(kv)
    tuned = plan_cls(plan.params, tiling)
    tuned.tiling_source = {}
    for s in plan_cls.stages:
        if s.name in hand:
            tuned.tiling_source[s.name] = "caller (--tiling)"
        elif doc and s.name in doc["best"]:
            tuned.tiling_source[s.name] = ("search (this run)" if searched else "autotune cache") \
                + f", {doc['measured_at']}"
        else:
            tuned.tiling_source[s.name] = "defaults" + ("" if s.tunables else " (no tunables)")
    tuned.tuning_history = (doc or {}).get("history", {})
    tuned.tuning_summary = {k: doc[k] for k in ("default_total_seconds", "best_total_seconds", "method",
                                                "measured_at")} if doc else None
    return tuned


def tiling_files(plan) -> dict:
    """tiling/<stage>.json (what ran and where it came from) and, for tuned stages,
    tiling/<stage>/autotuning.json (every configuration tried, from the cache)."""
    files = {}
    sources = getattr(plan, "tiling_source", {})
    history = getattr(plan, "tuning_history", {})
    summary = getattr(plan, "tuning_summary", None)
    for spec in plan.stages:
        files[f"tiling/{spec.name}.json"] = {
            "stage": spec.name, "tiling": plan.tiling[spec.name],
            "source": sources.get(spec.name, "defaults" + ("" if spec.tunables else " (no tunables)")),
            "tunables": {k: list(v) for k, v in spec.tunables.items()}}
        if spec.name in history:
            files[f"tiling/{spec.name}/autotuning.json"] = {"stage": spec.name, "tried": history[spec.name]} \
                | (summary or {})
    return files
