"""A sweep's pictures (matplotlib, Agg).

scaling.png  time against the main axis, log-log: one panel per version (columns) and per value
             of the other axes (rows, at most ``MAX_ROWS``); the total, each stage, and the cost
             model's memory-roof floor (its bytes at the peak GB/s) where the GPU has one.
speedup.png  the first version's time over each later version's (above 1: the later one is faster)
             against the main axis, one line per value of the other axes.

Only ``ok`` points are drawn; a missing time is a gap in its line, never a zero. An axis is logarithmic
only where every value on it is a positive number: a grid with a 0 (``points=0``, ``seed=0``) gets a
linear x axis, and one over names (``layout=uniform,clustered``) a categorical one.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

from app.kernel.plan import human  # noqa: E402
from app.report.plots import png_bytes  # noqa: E402
from app.sweep.scaling import numeric_axes  # noqa: E402

MAX_ROWS = 4


def main_axis(frame: pd.DataFrame, axes: list[str]) -> str:
    """The numeric axis with the most values (the first given on a tie), else the axis with the most values: the
    pictures' x axis. A size, not a layout, is what time is drawn against."""
    numeric = numeric_axes(frame, axes)
    return max(axes, key=lambda a: (a in numeric, frame[a].nunique(), -axes.index(a)))


def _combos(frame: pd.DataFrame, others: list[str]) -> list[tuple]:
    if not others:
        return [()]
    combos = sorted(frame[others].drop_duplicates().itertuples(index=False, name=None))
    if len(combos) <= MAX_ROWS:
        return combos
    step = (len(combos) - 1) / (MAX_ROWS - 1)             # smallest, largest and evenly between
    return [combos[round(i * step)] for i in range(MAX_ROWS)]


def _select(frame, others, combo):
    for name, value in zip(others, combo):
        frame = frame[frame[name] == value]
    return frame


def _label(others, combo) -> str:
    return ", ".join(f"{n}={human(v)}" for n, v in zip(others, combo)) or "all points"


def scaling_png(frame: pd.DataFrame, axes: list[str], versions: list[str], stages: list[str],
                title: str) -> bytes | None:
    ok = frame[frame["status"] == "ok"]
    if ok.empty:
        return None
    x = main_axis(ok, axes)
    others = [a for a in axes if a != x]
    combos = _combos(ok, others)
    fig, grid = plt.subplots(len(combos), len(versions), figsize=(4.2 * len(versions) + 1.5, 3.4 * len(combos)),
                             squeeze=False, sharex=True, sharey=True)
    colors = plt.get_cmap("tab10")
    for r, combo in enumerate(combos):
        for c, version in enumerate(versions):
            ax = grid[r][c]
            sub = _select(ok[ok["version"] == version], others, combo).sort_values(x)
            if "e2e_us" in sub:
                ax.plot(sub[x], sub["e2e_us"], "k-o", lw=2, ms=4, label="total")
            for i, stage in enumerate(stages):
                if f"{stage}_us" in sub:
                    ax.plot(sub[x], sub[f"{stage}_us"], "-", marker=".", color=colors(i % 10), lw=1, label=stage)
            if "floor_us" in sub and sub["floor_us"].notna().any():
                ax.plot(sub[x], sub["floor_us"], "--", color="grey", lw=1, label="memory-roof floor")
            _scales(ax, ok[x], _times(ok, stages))
            ax.set_title(f"{version}  {_label(others, combo)}", fontsize=9)
            if r == len(combos) - 1:
                ax.set_xlabel(x)
            if c == 0:
                ax.set_ylabel("median time (us)")
    handles, labels = grid[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1 - 1.4 / fig.get_figwidth(), 0.96))
    return _save(fig)


def speedup_rows(frame: pd.DataFrame, axes: list[str], versions: list[str], column: str = "e2e_us") -> pd.DataFrame:
    """(later version, main axis value, other axes..., speedup = first version's time / later's)."""
    ok = frame[frame["status"] == "ok"].dropna(subset=[column])
    if len(versions) < 2 or ok.empty:
        return pd.DataFrame(columns=["version", *axes, "speedup"])
    base = ok[ok["version"] == versions[0]].set_index(axes)[column]
    rows = []
    for v in versions[1:]:
        other = ok[ok["version"] == v].set_index(axes)[column]
        ratio = (base / other).dropna()
        rows.append(ratio.rename("speedup").reset_index().assign(version=v))
    return pd.concat(rows, ignore_index=True)[["version", *axes, "speedup"]]


def speedup_png(frame: pd.DataFrame, axes: list[str], versions: list[str], title: str) -> bytes | None:
    rows = speedup_rows(frame, axes, versions)
    if rows.empty:
        return None
    x = main_axis(frame[frame["status"] == "ok"], axes)
    others = [a for a in axes if a != x]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for v in versions[1:]:
        for combo in _combos(rows[rows["version"] == v], others):
            sub = _select(rows[rows["version"] == v], others, combo).sort_values(x)
            ax.plot(sub[x], sub["speedup"], "-o", ms=4, label=f"{versions[0]}/{v}  {_label(others, combo)}")
    ax.axhline(1.0, color="black", lw=1)
    _scales(ax, rows[x], rows["speedup"])
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))     # ratios span less than a decade
    ax.set_xlabel(x)
    ax.set_ylabel(f"time {versions[0]} / time of the later version")
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return _save(fig)


def _times(ok: pd.DataFrame, stages: list[str]) -> pd.Series:
    cols = [c for c in ["e2e_us", "floor_us", *(f"{s}_us" for s in stages)] if c in ok]
    return pd.concat([pd.to_numeric(ok[c], errors="coerce") for c in cols]) if cols else pd.Series(dtype=float)


def _scales(ax, xs, ys) -> None:
    """Log-log where the values allow (ticks at the grid's own values, plain labels: 100k, 0.5); linear where an
    axis holds a value <= 0, which a log axis cannot place; categories where the x values are names."""
    xs = pd.Series(list(xs))
    numeric = pd.api.types.is_numeric_dtype(xs) and not pd.api.types.is_bool_dtype(xs)
    if numeric:
        if (xs > 0).all():
            ax.set_xscale("log")
        ax.set_xticks(sorted(set(xs)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: human(int(v)) if v >= 1 and v == int(v) else f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    if (pd.Series(list(ys)).dropna() > 0).any():
        ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.grid(True, which="both", alpha=0.3)


def _save(fig) -> bytes:
    return png_bytes(fig, layout=False, dpi=110, bbox_inches="tight")     # the figure legend stays inside
