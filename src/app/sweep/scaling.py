"""What a sweep's table says: how time grows with each axis, which version wins where, where they cross.

Scaling exponent: log t = b log n + c_k, one common slope b along the axis and one
intercept per combination k of the other axes' values (ordinary least squares), with a
95% interval from the residuals (Student t). "Time grows as n^1.02 in points" is b. The
slope between the two largest values of the axis says how it grows at the top of the range,
where launch and host overheads no longer hide the work. The same fit of the cost model's
bytes gives the growth the model expects; a stage whose interval lies above it by
more than ``FASTER_THAN_MODEL`` is flagged.

Only points with status ``ok`` and a positive time enter a fit, and only along an axis whose values are
numbers (``numeric_axes``): a layout or a predicate has no n to grow with, and no value between two of
its values where versions could cross. Such an axis still splits the fits along the other axes.

Whether one version beats another is decided by their 95% intervals of the median, which a point
has only with ``app.runtime.stats.MIN_CI_SAMPLES`` timed runs or more. Without one on either side the order is the
medians' alone and is called unresolved (``tie`` None, a crossing not ``clear``), never clear.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

FASTER_THAN_MODEL = 0.1
# Two-sided 95% Student t quantiles for 1..30 degrees of freedom.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    if df < 1:
        return math.inf
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964                                   # Cornish-Fisher expansion beyond the table
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def usable(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "ok"] if "status" in frame else frame


def numeric_axes(frame: pd.DataFrame, axes: list[str]) -> list[str]:
    """The axes whose values are numbers: the only ones a growth can be fitted along or a crossing placed on."""
    return [a for a in axes if a in frame and pd.api.types.is_numeric_dtype(frame[a])
            and not pd.api.types.is_bool_dtype(frame[a])]


def fit_exponent(frame: pd.DataFrame, axis: str, column: str, others: list[str]) -> dict | None:
    """Slope of log(column) against log(axis), one intercept per combination of ``others``.

    None when fewer than two distinct axis values carry a positive value."""
    if column not in frame:
        return None
    data = frame[[axis, column, *others]].dropna()
    data = data[(data[column] > 0) & (data[axis] > 0)]
    if data[axis].nunique() < 2:
        return None
    x = np.log(data[axis].to_numpy(float))
    y = np.log(data[column].to_numpy(float))
    groups = data[others].astype(str).agg("|".join, axis=1) if others else pd.Series(["all"] * len(data))
    codes, _ = pd.factorize(groups)
    design = np.column_stack([x, np.eye(codes.max() + 1)[codes]])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ coef
    df = len(y) - np.linalg.matrix_rank(design)
    out = {"slope": float(coef[0]), "points": len(y), "df": int(df), "lo": None, "hi": None,
           "top_slope": _top_slope(data, axis, column, others)}
    if df > 0:
        centred = x - np.array([x[codes == c].mean() for c in codes])
        sxx = float(centred @ centred)
        if sxx > 0:
            se = math.sqrt(float(residual @ residual) / df / sxx)
            out["lo"], out["hi"] = out["slope"] - t975(df) * se, out["slope"] + t975(df) * se
    return out


def _top_slope(data: pd.DataFrame, axis: str, column: str, others: list[str]) -> float | None:
    """Mean log-log slope between the two largest axis values, over the other axes' combinations."""
    top = sorted(data[axis].unique())[-2:]
    slopes = []
    for _, g in (data.groupby(others) if others else [(None, data)]):
        a, b = g[g[axis] == top[0]][column], g[g[axis] == top[1]][column]
        if len(a) and len(b):
            slopes.append(math.log(b.median() / a.median()) / math.log(top[1] / top[0]))
    return float(np.mean(slopes)) if slopes else None


def exponents(frame: pd.DataFrame, axes: list[str], versions: list[str], stages: list[str],
              not_sizes=()) -> list[dict]:
    """One row per version, axis and measured quantity (the total, then each stage). ``not_sizes``: numeric axes
    the work does not grow with (a seed): none is fitted along them, though each fit takes one intercept per
    value of them, as of any other axis."""
    frame = usable(frame)
    rows = []
    for version in versions:
        sub = frame[frame["version"] == version]
        for axis in (a for a in numeric_axes(frame, axes) if a not in not_sizes):
            others = [a for a in axes if a != axis and sub[a].nunique() > 1]
            for what, col, model_col in [("total", "e2e_us", None), ("after build", "after_build_us", None)] + \
                    [(s, f"{s}_us", f"{s}_bytes") for s in stages]:
                fit = fit_exponent(sub, axis, col, others)
                if fit is None:
                    continue
                model = fit_exponent(sub, axis, model_col, others) if model_col else None
                fit |= {"version": version, "axis": axis, "what": what,
                        "model_slope": model["slope"] if model else None,
                        "faster_than_model": bool(model and fit["lo"] is not None
                                                  and fit["lo"] > model["slope"] + FASTER_THAN_MODEL)}
                rows.append(fit)
    return rows


def best_per_size(frame: pd.DataFrame, axes: list[str], column: str = "e2e_us", versions: list[str] | None = None
                  ) -> list[dict]:
    """The fastest version at each grid combination; a tie where its 95% interval meets the runner-up's, unresolved
    (``tie`` None) where either has none.

    ``host_slower_pct``: where the runner-up's host CPU was measurably slower (its fixed loop's 95% interval lies
    above the best's), by how much; ``launch_slower_pct`` the same for an empty kernel's launch (GPU points). Each
    point runs in its own process, and a process on a slow host can lose by that much with the same code: the
    lead may be the host's, not the version's. ``others``: version -> why it has no time there ("failed",
    "wrong", "no time", or, of ``versions``, "not run"), so a best without a runner-up is not read as unopposed."""
    timed = usable(frame).dropna(subset=[column])
    rows = []
    for key, g in timed.groupby(axes, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        g = g.sort_values(column)
        best = g.iloc[0]
        row = {"grid": dict(zip(axes, key)), "best": best["version"], "time_us": best[column],
               "others": _without_time(frame, dict(zip(axes, key)), set(g["version"]), versions)}
        if len(g) > 1:
            second = g.iloc[1]
            row |= {"runner_up": second["version"], "ratio": second[column] / best[column],
                    "tie": _overlap(best, second), "host_slower_pct": _host_slower(best, second),
                    "launch_slower_pct": _host_slower(best, second, "launch_pace")}
        rows.append(row)
    return rows


def _without_time(frame: pd.DataFrame, grid: dict, timed: set, versions: list[str] | None) -> dict:
    here = frame
    for name, value in grid.items():
        here = here[here[name] == value]
    out = {}
    for r in here.itertuples():
        if r.version not in timed:
            out[r.version] = r.status if r.status != "ok" else "no time"
    for v in versions or []:
        if v not in timed and v not in out:
            out[v] = "not run"
    return out


def _host_slower(best, second, key: str = "host_pace") -> float | None:
    """How much slower the runner-up's host loop (``key`` host_pace) or launch (launch_pace) ran, where its interval
    lies wholly above the best's; else None."""
    med, lo, hi = f"{key}_us", f"{key}_ci95_lo_us", f"{key}_ci95_hi_us"
    if any(pd.isna(r.get(c)) for r in (best, second) for c in (med, lo, hi)):
        return None
    if second[lo] <= best[hi]:
        return None
    return 100 * (second[med] / best[med] - 1)


def _overlap(a, b) -> bool | None:
    """Whether the two points' 95% intervals of the total's median meet; None where either has none (under
    MIN_CI_SAMPLES timed runs): the medians' order is then unresolved, not clear."""
    lo, hi = "e2e_ci95_lo_us", "e2e_ci95_hi_us"
    if any(pd.isna(r.get(c)) for r in (a, b) for c in (lo, hi)):
        return None
    return bool(a[hi] >= b[lo] and b[hi] >= a[lo])


def crossovers(frame: pd.DataFrame, axes: list[str], versions: list[str], column: str = "e2e_us") -> list[dict]:
    """Where, along each axis, two versions swap places (log-linear interpolation of their time ratio).

    ``clear`` is False where, at either end, the two versions' 95% intervals overlap, or either has none
    (``why``: "overlap" or "no interval"): the order there is within the run spread, or not known to be
    outside it, so the crossing may be noise. Only numeric axes are searched. A crossing next to a value of
    0 or less is placed by linear interpolation (a log has none there)."""
    frame = usable(frame).dropna(subset=[column])
    out = []
    for i, va in enumerate(versions):
        for vb in versions[i + 1:]:
            a = frame[frame["version"] == va].set_index(axes)
            b = frame[frame["version"] == vb].set_index(axes)
            ratio = np.log((b[column] / a[column]).dropna())          # > 0: va is faster
            if ratio.empty:
                continue
            table = ratio.reset_index()
            for axis in numeric_axes(frame, axes):
                others = [x for x in axes if x != axis]
                for key, g in (table.groupby(others) if others else [((), table)]):
                    key = key if isinstance(key, tuple) else (key,)
                    g = g.sort_values(axis)
                    xs, rs = g[axis].to_numpy(float), g[column].to_numpy(float)
                    for j in range(len(xs) - 1):
                        if rs[j] == 0 or np.sign(rs[j]) == np.sign(rs[j + 1]):
                            continue
                        f = rs[j] / (rs[j] - rs[j + 1])
                        if xs[j] > 0:
                            at = math.exp(math.log(xs[j]) + f * (math.log(xs[j + 1]) - math.log(xs[j])))
                        else:
                            at = xs[j] + f * (xs[j + 1] - xs[j])
                        ends = [tuple(g.iloc[k][axes]) for k in (j, j + 1)]
                        ends = [e if len(e) > 1 else e[0] for e in ends]     # a one-axis index takes a scalar
                        overlaps = [_overlap(a.loc[e], b.loc[e]) for e in ends]
                        why = "no interval" if None in overlaps else "overlap" if any(overlaps) else None
                        out.append({"versions": (va, vb), "axis": axis, "between": (xs[j], xs[j + 1]), "at": at,
                                    "fixed": dict(zip(others, key)), "clear": why is None, "why": why,
                                    "faster_below": va if rs[j] > 0 else vb, "faster_above": vb if rs[j] > 0 else va,
                                    "ratio_below": math.exp(abs(rs[j])), "ratio_above": math.exp(abs(rs[j + 1]))})
    return out
