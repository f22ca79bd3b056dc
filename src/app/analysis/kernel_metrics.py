"""Per-kernel and per-stage measured metrics from an ncu raw table (annotation/ncu modes).

Kernels are attributed to a stage by the NVTX range open when they were launched
(the innermost range of the kernel's domain that names a stage), never by time.
"""
from __future__ import annotations

import math

import pandas as pd

from app.analysis import advice
from app.analysis.devices import match_device


# Below this much DRAM traffic a kernel's L2 hit rate tells more about ncu's replay than about the kernel:
# on an H200 the two counter modes disagreed by 10-38 points on such kernels (scans, small copies, ~3 us)
# and by at most 7.5 points above it (join and overlay v2 at default sizes, the same warm iteration).
# Such a rate is shown, marked, and never turned into a locality class or advice.
L2_JUDGE_MIN_BYTES = 512 * 1024
# A low L2 hit rate is a locality issue only where a kernel on its own moves more DRAM bytes than its stage's cost
# model (each byte the stage reads or writes, once) by more than this factor. ncu flushes the caches before every
# kernel it profiles (--cache-control all, its default, which this tool keeps), so each kernel misses L2 on every
# first touch however its accesses are ordered (join's refine at 20k x 2k on an H200: L2 hit 66%, DRAM bytes 0.99x
# the model's), and a stage of several kernels reads the inputs they share once per kernel: join v2's
# candidate_filter moved 2.45x its model in two passes over the same data (count, then emit), each 0.8-1.1x. Only
# one kernel moving more than the whole stage's bytes has fetched data again. The quarter allows for partly used
# 32-byte sectors and small temporaries the model leaves out.
LOCALITY_MIN_EXCESS = 1.25
# L2 sector counts below zero are impossible (ncu 2025.3 exported -305 to -1 sectors for a few kernels of this
# project's captures, always in the breakdowns of reductions, *_op_red_lookup_hit/miss). ncu's L2 hit rate
# (lts__t_sector_hit_rate.pct) is lts__t_sectors_lookup_hit.sum / lts__t_sectors.sum: on every kernel of the H200
# captures it equals that ratio to its two decimals (join v5's refine: 568,448 / 755,779 = 75.21%), and the
# breakdowns are not in it. So a count below zero withholds the rate where it is one of those two, and otherwise only
# where the counts below zero come to L2_NEGATIVE_POINTS of the kernel's sectors or more (half the tenth of a point the
# report shows the rate to): a counting error that large, had it reached the two counts, could change the rate as shown.
# Nested breakdowns below zero are summed, which may count one error twice: it errs toward withholding.
L2_SECTOR_COUNTERS = "lts__t_sector"
L2_HIT_RATE_TERMS = ("lts__t_sectors_lookup_hit.sum", "lts__t_sectors.sum")
L2_NEGATIVE_POINTS = 0.05

# A grid under one wave leaves 1 - waves/SM of the GPU's block slots empty for the kernel's time. It is an issue only
# where that share is material: join v5's output_fused at 100k points runs 782 blocks in 792 slots (0.99 waves/SM),
# 1.3% of the slots empty, about 0.2 of its 17.1 us; morton_fused runs 391 (0.49 waves/SM), half the GPU idle.
UNDERFILL_MIN_SHARE = 0.10
# Warp-state samples (ncu mode's full set): a kernel whose sampled warps were mostly waiting at a barrier is bound by
# those waits whatever its SM% and DRAM% say (join v5's output_fused: 75.7% of 2,018 samples, its grid barriers).
# "Mostly" is over half; under BARRIER_MIN_SAMPLES samples the share is too coarse to tell (at 100, a 50% share has
# a 95% interval of about +-10 points).
BARRIER_DOMINANT_PCT = 50.0
BARRIER_MIN_SAMPLES = 100
SAMPLES_METRIC = "smsp__pcsamp_sample_count"
BARRIER_METRIC = "smsp__pcsamp_warps_issue_stalled_barrier"
CPI_METRIC = "smsp__average_warp_latency_per_inst_issued.ratio"
BARRIER_CPI_METRIC = "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"
_DERIVED = {"barrier_stall_pct": f"{BARRIER_METRIC} / {SAMPLES_METRIC}", "warp_samples": SAMPLES_METRIC,
            "cycles_per_issue": CPI_METRIC, "barrier_cycles_per_issue": BARRIER_CPI_METRIC}

PERCENT = ("sm_pct", "dram_pct", "achieved_occupancy_pct", "l2_hit_pct", "barrier_stall_pct")
COUNTS = ("duration_us", "dram_bytes", "dram_write_bytes", "fp64_flops", "fp32_flops", "local_load_bytes",
          "local_store_bytes", "waves_per_sm", "registers", "warp_samples", "cycles_per_issue",
          "barrier_cycles_per_issue")
# The raw columns every kernel row should carry (annotation mode's metric set); one that is absent or
# unreadable is listed by ncu's name in the report and left out of every sum, weight and conclusion.
READINGS = ("duration_ns", "dram_read_bytes", "dram_write_bytes", "dfma", "dadd", "dmul", "ffma", "fadd", "fmul",
            "sm_pct", "dram_pct", "achieved_occupancy_pct", "l2_hit_pct", "waves_per_sm", "registers",
            "local_load_bytes", "local_store_bytes")
DURATION = "gpu__time_duration.sum"


def reading(v) -> float:
    """A metric value, NaN when it is missing or unreadable: never a zero that was not measured."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    return df[name].map(reading) if name in df else pd.Series(float("nan"), index=df.index)


def _metric_name(col: str) -> str:
    from app.runtime.profiling.parsers.columns import NCU_2025_3

    names = [k for k, v in NCU_2025_3.items() if v == col]
    return names[0] if names else _DERIVED.get(col, col)


def flag_out_of_range(out: pd.DataFrame) -> pd.DataFrame:
    """Percentages outside 0-100 and negative counts are physically impossible: keep the raw value and
    ncu's metric name in ``flags`` and blank the value, so no rate, class or advice is derived from it."""
    flags = [[] for _ in range(len(out))]
    for col, ok in [(c, lambda v: 0 <= v <= 100) for c in PERCENT] + [(c, lambda v: v >= 0) for c in COUNTS]:
        if col not in out:
            continue
        for i, v in enumerate(out[col].tolist()):
            if v == v and not ok(v):
                flags[i].append(f"{col}={v:g} ({_metric_name(col)}) outside its physical range")
        bad = out[col].map(lambda v, ok=ok: v == v and not ok(v))
        out.loc[bad, col] = float("nan")
    # A kernel takes time: a duration of zero would make every rate infinite.
    if "duration_us" in out:
        for i, v in enumerate(out["duration_us"].tolist()):
            if v == 0:
                flags[i].append(f"duration_us=0 ({DURATION}) outside its physical range")
        out.loc[out["duration_us"] == 0, "duration_us"] = float("nan")
    out["flags"] = ["; ".join(f) for f in flags]
    return out


def flag_negative_l2_counters(df: pd.DataFrame, out: pd.DataFrame) -> None:
    """An L2 sector count below zero is impossible: it is flagged with its value and name. The kernel's L2 hit
    rate is withheld (blanked, its value kept in the flag) where a term of its ratio (L2_HIT_RATE_TERMS) is below zero
    or unreadable, or where the counts below zero come to L2_NEGATIVE_POINTS of its L2 sectors or more; otherwise the
    flag says it is kept and why. Each withheld rate names the counter and the reason."""
    cols = [c for c in df.columns if str(c).startswith(L2_SECTOR_COUNTERS) and str(c).endswith(".sum")]
    hit_name, total_name = L2_HIT_RATE_TERMS
    for i in range(len(out)):
        bad = [(c, reading(df[c].iat[i])) for c in cols if reading(df[c].iat[i]) < 0]
        if not bad:
            continue
        notes = [f"{c}={v:g} outside its physical range (a count below zero)" for c, v in bad]
        rate = out["l2_hit_pct"].iat[i]
        hits, sectors = (reading(df[c].iat[i]) if c in df else float("nan") for c in L2_HIT_RATE_TERMS)
        below = -sum(v for _, v in bad)
        in_ratio = [c for c, _ in bad if c in L2_HIT_RATE_TERMS]
        points = 100 * below / sectors if sectors > 0 else float("nan")
        name = f"l2_hit_pct={rate:g} ({_metric_name('l2_hit_pct')})"
        why = None                      # why the rate is withheld; None: kept
        if in_ratio:
            why = (f"it is {hit_name} / {total_name}, and {' and '.join(in_ratio)} "
                   f"{'is' if len(in_ratio) == 1 else 'are'} below zero")
        elif not (hits >= 0 and sectors > 0):
            why = (f"its terms {hit_name} and {total_name} are not both readable, so whether the counts below zero "
                   "are among them is unknown")
        elif not points < L2_NEGATIVE_POINTS:
            why = (f"the counts below zero ({below:g} of its {sectors:,.0f} L2 sectors) are breakdowns outside its "
                   f"ratio {hit_name} / {total_name}, but were its terms off by as much it would move by "
                   f"{points:.2g} points")
        if rate == rate:
            notes.append(f"{name} not used: {why}" if why else
                         f"l2_hit_pct={rate:g} kept: the counts below zero are {below:g} of its {sectors:,.0f} L2 "
                         f"sectors, breakdowns outside its ratio {hit_name} / {total_name} ({hits:,.0f} / "
                         f"{sectors:,.0f}, both readable); were its terms off by as much it would move by "
                         f"{points:.2g} points")
        out.iat[i, out.columns.get_loc("flags")] = "; ".join(x for x in [out["flags"].iat[i], *notes] if x)
        if why:
            out.iat[i, out.columns.get_loc("l2_hit_pct")] = float("nan")


def flag_above_peak(out: pd.DataFrame, device_name: str) -> None:
    """A rate above the device's datasheet peak cannot have been achieved: the kernel's time or its bytes
    (or FLOPs) were misread, and which one is unknown. Flag it with both readings and blank both, so
    neither feeds a rate, a stage total, a weight or a class."""
    _, sheet = match_device(device_name)
    if sheet is None:
        return
    secs = out["duration_us"] / 1e6
    checks = [("dram_bytes", 1e9, sheet["memory_gbps"], "GB/s", "dram__bytes_read/write.sum"),
              ("fp64_flops", 1e12, sheet["peak_tflops"]["fp64"], "TFLOP/s fp64", "fp64 instruction counts"),
              ("fp32_flops", 1e12, sheet["peak_tflops"]["fp32"], "TFLOP/s fp32", "fp32 instruction counts")]
    for col, scale, peak, unit, metric in checks:
        rate = out[col] / secs / scale
        bad = rate > peak
        for i in [i for i, b in enumerate(bad.tolist()) if b]:
            note = (f"{DURATION}={out['duration_us'].iat[i] * 1e3:g} ns with {col}={out[col].iat[i]:g} ({metric}) is "
                    f"{rate.iat[i]:,.1f} {unit}, above the {device_name}'s peak {peak:,.1f}: one of the two is wrong, "
                    "neither is used")
            out.iat[i, out.columns.get_loc("flags")] = "; ".join(x for x in (out["flags"].iat[i], note) if x)
        out.loc[bad, ["duration_us", col]] = float("nan")


def attribute_stages(df: pd.DataFrame, domain: str, stages: list[str]) -> pd.Series:
    names = set(stages)

    def stage_of(stack):
        inner = [r for d, r in stack if d == domain and r in names]
        return inner[-1] if inner else None

    # object dtype keeps None for a kernel outside every stage (a string dtype would turn it into NaN).
    return pd.Series([stage_of(s) for s in df["nvtx_stack"]], index=df.index, dtype=object)


def kernel_table(df: pd.DataFrame, domain: str, stages: list[str], device_name: str,
                 spec: dict | None = None, units: dict | None = None,
                 model_bytes: dict | None = None) -> pd.DataFrame:
    """One row per profiled kernel with derived rates, roofline share and bottleneck class. ``spec``: the peaks
    to use (calibrated ones, say); the devices table's entry for ``device_name`` otherwise. ``units``: the
    {column: unit} parse_raw returns with ``df``; a reading it left out for an unknown unit is named with it.
    ``model_bytes``: {stage: the cost model's DRAM bytes}; a kernel's ``dram_vs_model`` is its stage's measured
    bytes over them and its ``kernel_dram_vs_model`` its own bytes over them (NaN where either is unknown): the
    latter decides whether a low L2 hit rate is a locality issue (poor_locality)."""
    from app.runtime.profiling.parsers.columns import unit_problem

    if spec is None:
        _, spec = match_device(device_name)
    raw_duration = _col(df, "duration_ns")
    raw = {c: _col(df, c) for c in READINGS}
    source = {c: c for c in READINGS}
    if "dram_pct" not in df and "dram_pct_sol" in df:      # a full-set capture
        raw["dram_pct"] = _col(df, "dram_pct_sol")
        source["dram_pct"] = "dram_pct_sol"

    def why(c: str) -> str:
        col = source[c]
        problem = unit_problem(col, units.get(col, "")) if units is not None and col in df else None
        return f"{_metric_name(col)} ({problem})" if problem else _metric_name(col)

    missing = [[why(c) for c in READINGS if math.isnan(raw[c].iat[i])] for i in range(len(df))]
    out = pd.DataFrame({
        "stage": attribute_stages(df, domain, stages),
        "kernel": df["kernel"],
        "duration_us": raw_duration / 1e3,
        # A sum with a missing part is missing (NaN), not the part that was there.
        "dram_bytes": _col(df, "dram_read_bytes") + _col(df, "dram_write_bytes"),
        "fp64_flops": 2 * _col(df, "dfma") + _col(df, "dadd") + _col(df, "dmul"),
        "fp32_flops": 2 * _col(df, "ffma") + _col(df, "fadd") + _col(df, "fmul"),
    })
    for col in ("sm_pct", "dram_pct", "achieved_occupancy_pct", "l2_hit_pct", "waves_per_sm", "registers",
                "block_threads", "grid_blocks", "local_load_bytes", "local_store_bytes"):
        out[col] = _col(df, col)
    if "dram_pct" not in df and "dram_pct_sol" in df:      # a full-set capture
        out["dram_pct"] = _col(df, "dram_pct_sol")
    # ncu mode's warp-state samples (the full set; annotation mode's list has none: NaN, and no conclusion).
    samples, barrier = _col(df, SAMPLES_METRIC), _col(df, BARRIER_METRIC)
    out["warp_samples"] = samples
    out["barrier_stall_pct"] = 100 * barrier / samples.where(samples > 0)
    out["cycles_per_issue"], out["barrier_cycles_per_issue"] = _col(df, CPI_METRIC), _col(df, BARRIER_CPI_METRIC)
    # Kept apart too: ncu counts almost no writes during a kernel (they stay in L2 until the next flush), which the
    # report says with this column's sum.
    out["dram_write_bytes"] = _col(df, "dram_write_bytes")
    out["missing"] = ["; ".join(m) for m in missing]
    out = flag_out_of_range(out)
    flag_negative_l2_counters(df, out)
    flag_above_peak(out, device_name)
    out["l2_judged"] = out["l2_hit_pct"].notna() & (out["dram_bytes"] >= L2_JUDGE_MIN_BYTES)
    out["dram_vs_model"] = _stage_dram_vs_model(out, model_bytes or {})
    model = pd.Series([(model_bytes or {}).get(st) or float("nan") for st in out["stage"]], index=out.index,
                      dtype=float)
    out["kernel_dram_vs_model"] = out["dram_bytes"] / model.where(model > 0)
    # Missing if either part is: a spill whose loads were not read is not a spill of its stores alone.
    out["local_spill_bytes"] = out["local_load_bytes"] + out["local_store_bytes"]
    secs = out["duration_us"] / 1e6
    out["achieved_gbps"] = out["dram_bytes"] / secs / 1e9
    out["achieved_tflops_fp64"] = out["fp64_flops"] / secs / 1e12
    out["arithmetic_intensity"] = out["fp64_flops"] / out["dram_bytes"].where(out["dram_bytes"] > 0)
    if spec is not None:
        peaks = spec["peak_tflops"]
        # The fp64 and fp32 pipes and DRAM work concurrently: the least time is the largest of the three.
        t_min = pd.concat([out["dram_bytes"] / (spec["memory_gbps"] * 1e9), out["fp64_flops"] / (peaks["fp64"] * 1e12),
                           out["fp32_flops"] / (peaks["fp32"] * 1e12)], axis=1).max(axis=1, skipna=False)
        out["pct_of_roofline"] = 100 * t_min / secs
    else:
        out["pct_of_roofline"] = float("nan")
    out["bottleneck"] = [classify(r) for r in out.itertuples()]
    return out


def _stage_dram_vs_model(out: pd.DataFrame, model_bytes: dict) -> pd.Series:
    """Per kernel, its stage's measured DRAM bytes over the stage's cost-model bytes: NaN where a kernel of the
    stage has no reading, the stage has no model, or the kernel is outside every stage."""
    measured = {stage: float(k["dram_bytes"].sum()) if k["dram_bytes"].notna().all() else float("nan")
                for stage, k in out.groupby("stage")}
    return pd.Series([measured.get(st, float("nan")) / model_bytes[st] if (model_bytes.get(st) or 0) > 0
                      else float("nan") for st in out["stage"]], index=out.index, dtype=float)


def poor_locality(r) -> bool:
    """A judged L2 hit rate under 80% with evidence of data fetched again: for a kernel, its own DRAM bytes above
    LOCALITY_MIN_EXCESS times its stage's cost-model bytes; for a stage, such a kernel among its own
    (``locality_excess``). Where the comparison is unknown (no model, a missing reading) there is no evidence:
    after ncu's cache flush every first touch misses, so a low hit rate alone proves nothing."""
    if not (bool(getattr(r, "l2_judged", True)) and not math.isnan(r.l2_hit_pct) and r.l2_hit_pct < 80):
        return False
    excess = getattr(r, "locality_excess", None)          # a stage row
    if excess is None:
        excess = getattr(r, "kernel_dram_vs_model", float("nan"))
    return excess > LOCALITY_MIN_EXCESS


def classify(r) -> str:
    """Seed 004: DRAM% high + SM% low memory-bound; SM% high compute-bound; both low latency-bound;
    a poor L2 hit rate (poor_locality) adds a locality issue. SM% stands in for TC% (no tensor cores here).
    With DRAM% or SM% missing or flagged there is no class: "both low" must never be inferred from absent
    values."""
    missing = [c for c in ("dram_pct", "sm_pct") if math.isnan(getattr(r, c))]
    if missing:
        return f"n/a ({', '.join(_metric_name(c) for c in missing)} missing or flagged)"
    base = advice.classify(r.dram_pct, r.sm_pct)
    if poor_locality(r) and base != "n/a":
        return base + " + locality"
    return base


def stages_with_gpu_work(worker: dict) -> set[str]:
    """The stages the worker ran on the GPU (the run's device: the recorder runs every stage on it) with input
    rows and kernels of their own (the backend's compile record lists them: a stage of copies alone, as
    owned_buffer_build is, or of library calls, launches none of ours): each launches kernels, so a capture
    holding none of them lost them (a kernel ncu failed to profile, a cut-off export); it did not measure zero.
    A worker with no such record (a CPU backend's) leaves every stage with rows expected."""
    on_gpu = (worker.get("selection") or {}).get("selected") == "gpu"
    own = ((worker.get("compile") or {}).get("occupancy")
           if isinstance(worker.get("compile"), dict) else None)      # stage -> occupancy, for stages with kernels
    return {s["name"] for s in worker.get("stages", [])
            if (on_gpu or s.get("device") == "gpu") and (s.get("rows_in") or 0) > 0
            and (own is None or s["name"] in own)}


def stage_table(kernels: pd.DataFrame, stages: list[str], expected: set[str] | frozenset = frozenset()) -> pd.DataFrame:
    """Per stage: summed time, bytes and flops; time-weighted SM%, DRAM%, occupancy, L2 hit. Any kernel
    without a value leaves its stage without it (NaN): a partial sum or average would mislead. A stage in
    ``expected`` (it ran GPU work: stages_with_gpu_work) with no kernel in the capture has every figure
    missing, with ``unprofiled`` set, never 0.0 us. A stage that launched no kernel of its own (the build's copies,
    which ncu cannot time) has every figure missing too, not a time or a byte count of zero."""
    rows = []
    for name in stages:
        k = kernels[kernels["stage"] == name]
        if not len(k):
            # In the columns' order of a stage with kernels: stages.csv's columns do not depend on the first stage.
            rows.append({"stage": name, "kernels": 0} | {
                c: float("nan") for c in ("duration_us", "dram_bytes", "fp64_flops", "sm_pct", "dram_pct",
                                          "achieved_occupancy_pct", "l2_hit_pct", "local_spill_bytes",
                                          "dram_vs_model", "waves_per_sm", "underfill_us", "kernel_dram_vs_model",
                                          "locality_excess")} | {"untimed_kernels": 0, "unprofiled": name in expected})
            continue

        def total(col):
            return float(k[col].sum()) if k[col].notna().all() else float("nan")

        t = total("duration_us")

        def weighted(col):
            return float((k[col] * k["duration_us"]).sum() / t) if t > 0 and k[col].notna().all() else float("nan")

        def judged_l2():
            # Over the kernels with enough traffic for the rate to mean something (L2_JUDGE_MIN_BYTES); one
            # whose traffic or rate is missing may be such a kernel, so the stage's rate is missing too.
            j = k[~(k["dram_bytes"] < L2_JUDGE_MIN_BYTES)]
            tj = j["duration_us"].sum()
            if not (tj > 0) or j["l2_hit_pct"].isna().any() or j["duration_us"].isna().any():
                return float("nan")
            return float((j["l2_hit_pct"] * j["duration_us"]).sum() / tj)

        own = k["kernel_dram_vs_model"] if "kernel_dram_vs_model" in k else pd.Series(float("nan"), index=k.index)
        # The largest excess among the kernels with evidence of their own (poor_locality): the stage's locality class
        # rests on them. Numbers only: trace.json takes every column of this table as one.
        culprits = [x.kernel_dram_vs_model for x in k.itertuples() if "kernel_dram_vs_model" in k and poor_locality(x)]
        rows.append({"stage": name, "kernels": len(k), "duration_us": t, "dram_bytes": total("dram_bytes"),
                     "fp64_flops": total("fp64_flops"), "sm_pct": weighted("sm_pct"),
                     "dram_pct": weighted("dram_pct"), "achieved_occupancy_pct": weighted("achieved_occupancy_pct"),
                     "l2_hit_pct": judged_l2(), "local_spill_bytes": total("local_spill_bytes"),
                     "dram_vs_model": float(k["dram_vs_model"].iloc[0]) if len(k) and "dram_vs_model" in k
                     else float("nan"),
                     "waves_per_sm": float(k["waves_per_sm"].max()) if len(k) and k["waves_per_sm"].notna().all()
                     else float("nan"),
                     # Its kernels' time weighted by the block slots they leave unfilled: a kernel of w < 1 waves
                     # fills w of the GPU's block slots for its duration. The stage's waves/SM (its largest
                     # kernel's) would hide a long kernel of few blocks beside a full one.
                     "underfill_us": float((k["duration_us"] * (1 - k["waves_per_sm"]).clip(lower=0)).sum())
                     if len(k) and k[["duration_us", "waves_per_sm"]].notna().all().all() else float("nan"),
                     "kernel_dram_vs_model": float(own.max()) if len(k) and own.notna().all() else float("nan"),
                     "locality_excess": max(culprits) if culprits else float("nan"),
                     "untimed_kernels": int(k["duration_us"].isna().sum()), "unprofiled": False})
    st = pd.DataFrame(rows)
    secs = st["duration_us"] / 1e6
    st["achieved_gbps"] = st["dram_bytes"] / secs.where(secs > 0) / 1e9
    st["achieved_tflops_fp64"] = st["fp64_flops"] / secs.where(secs > 0) / 1e12
    st["bottleneck"] = [(f"n/a (no kernel profiled, though the stage ran on the GPU: {DURATION} missing)"
                         if r.unprofiled else "no kernels" if not r.kernels else
                         f"n/a ({DURATION} missing or flagged for {r.untimed_kernels} of {r.kernels} kernels)"
                         if r.untimed_kernels else classify(r)) for r in st.itertuples()]
    return st


def kernel_time(stages: pd.DataFrame) -> float:
    """The stages' summed kernel time (us), NaN when any stage kernel's time is missing or a stage that ran GPU work
    has no kernel in the capture. A stage that launched no kernel has no kernel time, and adds none."""
    timed = stages[_with_kernel_time(stages)]
    return float(timed["duration_us"].sum()) if timed["duration_us"].notna().all() else float("nan")


def _with_kernel_time(stages: pd.DataFrame) -> pd.Series:
    """The stages whose time is kernel time: those with kernels, and those whose kernels the capture lost."""
    lost = stages["unprofiled"].astype(bool) if "unprofiled" in stages else False
    return (stages["kernels"] > 0) | lost


def kernel_time_text(stages: pd.DataFrame) -> str:
    """The summed kernel time for a headline, or what is missing from it."""
    t = kernel_time(stages)
    if t == t:
        return f"{t:,.1f} us of kernel time"
    why = []
    if stages["untimed_kernels"].sum():
        why.append(f"{DURATION} missing or flagged for {int(stages['untimed_kernels'].sum())} of "
                   f"{int(stages['kernels'].sum())} stage kernels")
    lost = stages.loc[stages["unprofiled"], "stage"].tolist() if "unprofiled" in stages else []
    if lost:
        why.append(f"no kernel profiled in {', '.join(lost)}, which ran on the GPU")
    return f"kernel time n/a ({'; '.join(why) or DURATION + ' missing'})"


def opportunities(stages: pd.DataFrame, total_us: float) -> list[dict]:
    """Seed 004's Metric Interpretation table as rules; gain = share of time the stage could save. Where the
    kernel time is missing (a stage's, or so the total's) the gain is None: the finding stands, its size is
    unknown, and it ranks after every sized one."""
    ops = []
    for r in stages.itertuples():
        if not r.kernels or total_us <= 0:
            continue
        share = 100 * r.duration_us / total_us
        if r.local_spill_bytes > 0:
            ops.append((share * 0.3, f"Cut local-memory traffic in {r.stage} (register spills or local arrays: smaller "
                                     "tiles, fewer live values)",
                        f"local_spill_bytes={r.local_spill_bytes:,.0f}"))
        if not math.isnan(r.achieved_occupancy_pct) and r.achieved_occupancy_pct < 25:
            ops.append((share * 0.5, f"Raise occupancy in {r.stage} (fewer registers, larger grids)",
                        f"achieved_occupancy={r.achieved_occupancy_pct:.1f}%"))
        if underfilled(r):
            underfill = getattr(r, "underfill_us", float("nan"))
            if underfill == underfill:
                ops.append((100 * underfill / total_us, f"Fill the GPU in {r.stage} (more blocks per launch)",
                            f"{100 * underfill_share(r):.0f}% of block slots empty (largest grid "
                            f"{r.waves_per_sm:.2f} waves/SM): {underfill:,.1f} of its {r.duration_us:,.1f} us "
                            "weighted by unfilled block slots"))
            else:
                ops.append((share * (1 - r.waves_per_sm), f"Fill the GPU in {r.stage} (more blocks per launch)",
                            f"waves_per_sm={r.waves_per_sm:.2f}"))
        if poor_locality(r):
            ops.append((share * 0.3, f"Improve locality in {r.stage} (Morton order, tile by cell)",
                        f"l2_hit={r.l2_hit_pct:.1f}%, one kernel's dram_bytes={r.locality_excess:.2f}x the "
                        "stage's cost model's"))
        if r.bottleneck.startswith("latency-bound"):
            ops.append((share * (1 - max(r.dram_pct, r.sm_pct) / 100),
                        f"Hide latency in {r.stage} (more independent work per thread, fewer dependent loads)",
                        f"sm_pct={r.sm_pct:.1f}, dram_pct={r.dram_pct:.1f}"))
    return rank([{"name": n, "gain_pct": g if g == g else None, "trigger": t} for g, n, t in ops])


def underfill_share(r) -> float:
    """The share of the GPU's block slots a stage leaves empty over its time: its underfill_us over its duration
    where both are known, else 1 - waves/SM (its largest kernel's); NaN where neither is."""
    under, dur = getattr(r, "underfill_us", float("nan")), getattr(r, "duration_us", float("nan"))
    if under == under and dur > 0:
        return under / dur
    waves = getattr(r, "waves_per_sm", float("nan"))
    return max(0.0, 1 - waves) if waves == waves else float("nan")


def underfilled(r) -> bool:
    """A stage whose grids leave UNDERFILL_MIN_SHARE of the block slots empty or more: a grid of 0.99 waves fills
    the GPU as well as a wave does, and is no issue."""
    return bool(getattr(r, "kernels", 1)) and underfill_share(r) >= UNDERFILL_MIN_SHARE


def barrier_bound(kernels: pd.DataFrame, stage: str):
    """The kernel of ``stage`` whose sampled warps were mostly waiting at a barrier (BARRIER_DOMINANT_PCT of at least
    BARRIER_MIN_SAMPLES warp samples), the longest if several; None where none was (or none was sampled)."""
    if "barrier_stall_pct" not in kernels:
        return None
    k = kernels[(kernels["stage"] == stage) & (kernels["barrier_stall_pct"] >= BARRIER_DOMINANT_PCT)
                & (kernels["warp_samples"] >= BARRIER_MIN_SAMPLES)]
    return k.sort_values("duration_us", ascending=False, na_position="last").iloc[0] if len(k) else None


def flop_rates(summary: dict, kernels: pd.DataFrame) -> dict:
    """trace.json's summary with its FLOP rate named: ``achieved_tflops`` counts every floating-point operation ncu
    counted in the stage kernels, fp64 and fp32 together (an FMA as two); ``achieved_tflops_fp64`` and
    ``achieved_tflops_fp32`` are each precision alone, over the same summed time, and missing (None, named) where
    the rate or a kernel's count for that precision is."""
    staged = kernels[kernels["stage"].notna()]
    dur = summary.get("duration_us")
    out = dict(summary, missing=dict(summary.get("missing") or {}))
    for prec in ("fp64", "fp32"):
        key, col = f"achieved_tflops_{prec}", f"{prec}_flops"
        if col in staged and staged[col].notna().all() and dur:
            out[key] = float(staged[col].sum()) / (dur * 1e-6) / 1e12
        else:
            out[key] = None
            out["missing"][key] = out["missing"].get("achieved_tflops") or (
                f"{col} missing for some kernels of this capture" if dur else "no kernel time to divide by")
    out["rates_from"] = ("ncu-measured DRAM bytes and floating-point operations of the stage kernels over their summed "
                         "time; achieved_tflops counts fp64 and fp32 operations together (an FMA as two), "
                         "achieved_tflops_fp64 and achieved_tflops_fp32 each precision alone")
    return out


def rank(ops: list[dict]) -> list[dict]:
    """Largest estimated gain first; those whose gain is unknown (None) last, in their order."""
    return sorted(ops, key=lambda o: (o["gain_pct"] is None, -(o["gain_pct"] or 0)))
