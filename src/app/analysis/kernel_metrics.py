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
# The L2 sector counters the hit rate (lts__t_sector_hit_rate.pct) is a ratio of: a count below zero among them is
# impossible (ncu 2025.3 exported -56 to -1 sectors for a few kernels of this project's captures). It is flagged;
# the rate is blanked with it unless the counts below zero are too few to move it: under this share of the kernel's
# L2 sectors (join v2's refine: 8 of 1.2 million) they change the rate in its fifth digit at most.
L2_SECTOR_COUNTERS = "lts__t_sector"
L2_NEGATIVE_NEGLIGIBLE = 1e-4

PERCENT = ("sm_pct", "dram_pct", "achieved_occupancy_pct", "l2_hit_pct")
COUNTS = ("duration_us", "dram_bytes", "dram_write_bytes", "fp64_flops", "fp32_flops", "local_load_bytes",
          "local_store_bytes", "waves_per_sm", "registers")
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
    return names[0] if names else col


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
    rate, a ratio of those counters, is blanked with it, unless the counts below zero come to less than
    L2_NEGATIVE_NEGLIGIBLE of the kernel's L2 sectors (lts__t_sectors.sum): the flag then says the rate is kept."""
    cols = [c for c in df.columns if str(c).startswith(L2_SECTOR_COUNTERS) and str(c).endswith(".sum")]
    total = df["lts__t_sectors.sum"] if "lts__t_sectors.sum" in df else None
    for i in range(len(out)):
        bad = [(c, reading(df[c].iat[i])) for c in cols if reading(df[c].iat[i]) < 0]
        if not bad:
            continue
        notes = [f"{c}={v:g} outside its physical range (a count below zero)" for c, v in bad]
        rate, sectors = out["l2_hit_pct"].iat[i], reading(total.iat[i]) if total is not None else float("nan")
        below = -sum(v for _, v in bad)
        keep = rate == rate and sectors > 0 and below < L2_NEGATIVE_NEGLIGIBLE * sectors
        if keep:
            notes.append(f"l2_hit_pct={rate:g} kept: the counts below zero are {below:g} of its {sectors:,.0f} L2 "
                         "sectors, too few to move it")
        elif rate == rate:
            notes.append(f"l2_hit_pct={rate:g} ({_metric_name('l2_hit_pct')}) not used: a ratio of L2 sector "
                         f"counts, {'this one' if len(bad) == 1 else 'these'} among them")
        out.iat[i, out.columns.get_loc("flags")] = "; ".join(x for x in [out["flags"].iat[i], *notes] if x)
        if not keep:
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
    missing, with ``unprofiled`` set, never 0.0 us."""
    rows = []
    for name in stages:
        k = kernels[kernels["stage"] == name]
        if not len(k) and name in expected:
            rows.append({"stage": name, "kernels": 0, "unprofiled": True, "untimed_kernels": 0} | {
                c: float("nan") for c in ("duration_us", "dram_bytes", "fp64_flops", "sm_pct", "dram_pct",
                                          "achieved_occupancy_pct", "l2_hit_pct", "local_spill_bytes",
                                          "waves_per_sm", "dram_vs_model", "kernel_dram_vs_model",
                                          "locality_excess", "underfill_us")})
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
    """The stages' summed kernel time (us), NaN when any stage kernel's time is missing."""
    return float(stages["duration_us"].sum()) if stages["duration_us"].notna().all() else float("nan")


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
            ops.append((share * 0.3, f"Stop register spills in {r.stage} (smaller tiles, fewer live values)",
                        f"local_spill_bytes={r.local_spill_bytes:,.0f}"))
        if not math.isnan(r.achieved_occupancy_pct) and r.achieved_occupancy_pct < 25:
            ops.append((share * 0.5, f"Raise occupancy in {r.stage} (fewer registers, larger grids)",
                        f"achieved_occupancy={r.achieved_occupancy_pct:.1f}%"))
        underfill = getattr(r, "underfill_us", float("nan"))
        if underfill == underfill and underfill > 0:
            ops.append((100 * underfill / total_us, f"Fill the GPU in {r.stage} (more blocks per launch)",
                        f"waves_per_sm under 1 (largest kernel {r.waves_per_sm:.2f}): {underfill:,.1f} of its "
                        f"{r.duration_us:,.1f} us weighted by unfilled block slots"))
        elif underfill != underfill and not math.isnan(r.waves_per_sm) and r.waves_per_sm < 1:
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


def rank(ops: list[dict]) -> list[dict]:
    """Largest estimated gain first; those whose gain is unknown (None) last, in their order."""
    return sorted(ops, key=lambda o: (o["gain_pct"] is None, -(o["gain_pct"] or 0)))
