"""Nsight Compute CSV exports -> DataFrames.

Real ncu output (see tests/fixtures/ncu): ``==PROF==``/``==WARNING==`` lines and
the program's own stdout come before the header row; the raw page's second row
holds units; numbers carry thousands separators; the NVTX cell holds
``PID  "domain:range:...:range"  "domain2:..."`` with the outermost range first.
"""
from __future__ import annotations

import csv
import io
import re

import pandas as pd

from app.errors import MalformedToolOutput
from app.runtime.profiling.parsers.columns import ncu_columns

_RANGE = re.compile(r'"([^"]*)"')
# domain:NAME:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:NAME -- NAME may itself hold colons.
_RANGE_FIELDS = re.compile(r"^(?P<domain>[^:]*):(?P<name>.*):[^:]*:[^:]*:[^:]*:[^:]*:[^:]*:(?P=name)$")


def _table_rows(text: str, first_cell: str) -> list[list[str]]:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f'"{first_cell}"'):
            return list(csv.reader(io.StringIO("\n".join(lines[i:]))))
    raise MalformedToolOutput(f"no CSV header starting with {first_cell!r} in the ncu output; "
                              "was ncu run with --csv?")


def to_number(cell: str):
    """'1,234.5' -> 1234.5; '' or 'n/a' -> NaN; other text stays text."""
    s = cell.strip().replace(",", "")
    if s in ("", "n/a", "N/A"):
        return float("nan")
    try:
        return float(s)
    except ValueError:
        return cell


def split_nvtx(cell: str) -> list[tuple[str, str]]:
    """NVTX push/pop stack of a kernel, outermost first, as (domain, range) pairs."""
    out = []
    for entry in _RANGE.findall(cell or ""):
        m = _RANGE_FIELDS.match(entry)
        if m:
            out.append((m["domain"], m["name"]))
        elif entry:
            domain, _, rest = entry.partition(":")
            out.append((domain, rest.split(":")[0]))
    return out


def parse_raw(text: str, version: str | None = None) -> tuple[pd.DataFrame, dict]:
    """The raw page: one row per profiled kernel, metrics as numbers; also {column: unit}."""
    rows = _table_rows(text, "ID")
    if len(rows) < 2:
        raise MalformedToolOutput("ncu raw CSV has a header but no units row")
    header, units = rows[0], rows[1]
    body = [r for r in rows[2:] if r and len(r) == len(header)]
    if any(r and len(r) != len(header) for r in rows[2:]):
        raise MalformedToolOutput(f"ncu raw CSV rows do not match its {len(header)}-column header")
    cmap = ncu_columns(version)
    text_cols = {"Kernel Name", "Process Name", "Host Name", "Block Size", "Grid Size"} | {
        k for k in cmap if k.startswith("thread Domain")}
    columns = {}
    for j, col in enumerate(header):
        cells = [r[j] for r in body]
        columns[cmap.get(col, col)] = cells if col in text_cols or col.startswith("Id:Domain") \
            else [to_number(c) for c in cells]
    df = pd.DataFrame(columns)
    df["nvtx_stack"] = [split_nvtx(c) for c in df["nvtx"]] if "nvtx" in df else [[] for _ in range(len(df))]
    return df, {cmap.get(h, h): u for h, u in zip(header, units) if u}


def parse_details(text: str, version: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The details page: (metrics rows, rule rows). Rule rows carry OPT/INF and speedups."""
    rows = _table_rows(text, "ID")
    header = rows[0]
    cmap = ncu_columns(version)
    names = [cmap.get(h, h) for h in header]
    metric_rows, rule_rows = [], []
    for r in rows[1:]:
        if not r:
            continue
        rec = dict(zip(names, r + [""] * (len(names) - len(r))))
        (rule_rows if rec.get("rule") else metric_rows).append(rec)
    metrics = pd.DataFrame(metric_rows, columns=names)
    rules = pd.DataFrame(rule_rows, columns=names)
    if len(metrics):
        metrics["value_num"] = metrics["value"].map(to_number)
    if len(rules):
        rules["speedup_pct"] = rules["speedup_pct"].map(to_number)
    for df in (metrics, rules):
        if "nvtx" in df:
            df["nvtx_stack"] = df["nvtx"].map(split_nvtx)
    return metrics.drop(columns=[c for c in ("rule", "rule_type", "rule_description", "speedup_type",
                                             "speedup_pct") if c in metrics]), rules


def parse_source(text: str) -> dict[str, pd.DataFrame]:
    """The source page (--print-source sass): per kernel, one row per SASS instruction."""
    blocks: dict[str, pd.DataFrame] = {}
    name, lines = None, []

    def flush():
        if name is not None and lines:
            rows = list(csv.reader(io.StringIO("\n".join(lines))))
            header = rows[0]
            df = pd.DataFrame([r[:len(header)] for r in rows[1:] if r], columns=header)
            for col in header[2:]:
                df[col] = df[col].map(to_number)
            key, n = name, 2
            while key in blocks:
                key, n = f"{name} #{n}", n + 1
            blocks[key] = df

    for line in text.splitlines():
        if line.startswith('"Kernel Name"'):
            flush()
            name, lines = next(csv.reader([line]))[1], []
        elif name is not None and line.strip():
            lines.append(line)
    flush()
    if not blocks:
        raise MalformedToolOutput("ncu source CSV holds no 'Kernel Name' block; was it --page source --csv?")
    return blocks
