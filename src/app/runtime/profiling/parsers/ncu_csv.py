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
from app.runtime.profiling.parsers.columns import ncu_columns, unit_factor

_RANGE = re.compile(r'"([^"]*)"')
# domain:NAME:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:NAME -- NAME may itself hold colons.
_RANGE_FIELDS = re.compile(r"^(?P<domain>[^:]*):(?P<name>.*):[^:]*:[^:]*:[^:]*:[^:]*:[^:]*:(?P=name)$")


def _table_rows(text: str, first_cell: str, source: str) -> list[tuple[int, list[str]]]:
    """The CSV table from its header row on, as (line number in ``text``, cells) pairs."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f'"{first_cell}"'):
            return _csv_rows(lines[i:], source, i + 1)
    raise MalformedToolOutput(f"{source}: no CSV header starting with {first_cell!r}; was ncu run with --csv?")


def _csv_rows(lines: list[str], source: str, first_line: int) -> list[tuple[int, list[str]]]:
    """Rows with the line each starts on. Output cut off inside a quoted cell is refused, not closed."""
    reader = csv.reader(io.StringIO("\n".join(lines)), strict=True)
    out = []
    while True:
        start = first_line + reader.line_num
        try:
            row = next(reader)
        except StopIteration:
            return out
        except csv.Error as exc:
            what = ("ends inside a quoted cell: the output was cut off" if "unexpected end of data" in str(exc)
                    else f"is not valid CSV ({exc})")
            raise MalformedToolOutput(f"{source}: the row at line {start} {what}; re-run the profile") from None
        out.append((start, row))


def _ragged(source: str, line: int, cells: int, expected: str) -> MalformedToolOutput:
    return MalformedToolOutput(f"{source}: the row at line {line} has {cells} cells, {expected}: the output was "
                               "cut off or damaged; re-run the profile")


def to_number(cell):
    """'1,234.5' -> 1234.5; '', 'n/a' or None -> NaN; a number stays a number (as float); other text stays
    text."""
    if cell is None:
        return float("nan")
    if isinstance(cell, (int, float)) and not isinstance(cell, bool):
        return float(cell)
    if not isinstance(cell, str):
        return float("nan")
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


def parse_raw(text: str, version: str | None = None, source: str = "ncu raw CSV") -> tuple[pd.DataFrame, dict]:
    """The raw page: one row per profiled kernel, metrics as numbers in the base unit their column names
    (columns.METRIC_UNITS: a duration printed in usecond is scaled to ns); also {column: unit as printed}.
    A metric in a unit this tool does not know is NaN in every row (kernel_table names it and its unit).
    A page without kernel rows, or with a row cut short or run long, is refused with the line."""
    rows = _table_rows(text, "ID", source)
    if len(rows) < 2:
        raise MalformedToolOutput(f"{source} has a header but no units row; re-run the profile")
    (_, header), (units_line, units) = rows[0], rows[1]
    if len(units) != len(header):
        raise _ragged(source, units_line, len(units), f"its header {len(header)}")
    for line, r in rows[2:]:
        if r and len(r) != len(header):
            raise _ragged(source, line, len(r), f"its header {len(header)}")
    body = [r for _, r in rows[2:] if r]
    if not body:
        raise MalformedToolOutput(f"{source} has its header and units rows but no kernel rows: no kernel was "
                                  "profiled, or the output was cut off; re-run the profile")
    cmap = ncu_columns(version)
    text_cols = {"Kernel Name", "Process Name", "Host Name", "Block Size", "Grid Size"} | {
        k for k in cmap if k.startswith("thread Domain")}
    columns = {}
    for j, col in enumerate(header):
        name = cmap.get(col, col)
        cells = [r[j] for r in body]
        if col in text_cols or col.startswith("Id:Domain"):
            columns[name] = cells
            continue
        values = [to_number(c) for c in cells]
        factor = unit_factor(name, units[j])
        if factor is None:           # not read: a value in an unknown unit is no value in the base unit
            values = [float("nan")] * len(values)
        elif factor != 1.0:
            values = [v * factor if isinstance(v, float) else v for v in values]
        columns[name] = values
    df = pd.DataFrame(columns)
    df["nvtx_stack"] = [split_nvtx(c) for c in df["nvtx"]] if "nvtx" in df else [[] for _ in range(len(df))]
    return df, {cmap.get(h, h): u for h, u in zip(header, units) if u}


def parse_details(text: str, version: str | None = None,
                  source: str = "ncu details CSV") -> tuple[pd.DataFrame, pd.DataFrame]:
    """The details page: (metrics rows, rule rows). Rule rows carry OPT/INF and speedups. ncu ends a metric
    row at its empty "Rule Name" cell (18 cells of 22 in 2025.3) and writes a rule row in full; a row of any
    other length is refused with its line."""
    rows = _table_rows(text, "ID", source)
    header = rows[0][1]
    cmap = ncu_columns(version)
    names = [cmap.get(h, h) for h in header]
    short = names.index("rule") + 1 if "rule" in names else len(names)
    metric_rows, rule_rows = [], []
    for line, r in rows[1:]:
        if not r:
            continue
        if len(r) != len(names) and not (len(r) == short and not r[-1]):
            raise _ragged(source, line, len(r), f"a metric row has {short} and a rule row {len(names)}")
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


def parse_source(text: str, source: str = "ncu source CSV", kernels: int | None = None) -> dict[str, pd.DataFrame]:
    """The source page (--print-source sass): per kernel, one row per SASS instruction, keyed by the kernel's
    name ("name #2" for its second launch, and so on), in the order of the raw page. A row whose length differs
    from its kernel's header is refused with its line. ncu 2025.3.1 may print a kernel's block twice in a row,
    identical (seen on an H200 with join v2's kernels, each built with -lineinfo). Where the page holds more
    blocks than the raw page's ``kernels``, such a repeat is dropped, not taken for a second launch; where it
    holds as many, every block is a launch (two launches of a tiny kernel can have equal tables: no samples)."""
    found: list[tuple[str, pd.DataFrame]] = []
    name, lines, first = None, [], 0

    def flush():
        rows = [(n, r) for n, r in _csv_rows(lines, source, first) if r] if name is not None else []
        if not rows:
            return
        header = rows[0][1]
        for line_no, r in rows[1:]:
            if len(r) != len(header):
                raise _ragged(source, line_no, len(r), f"the header of kernel {name!r} {len(header)}")
        df = pd.DataFrame([r for _, r in rows[1:]], columns=header)
        for col in header[2:]:
            df[col] = df[col].map(to_number)
        found.append((name, df))

    for i, line in enumerate(text.splitlines(), 1):
        if line.startswith('"Kernel Name"'):
            flush()
            cells = _csv_rows([line], source, i)[0][1]
            if len(cells) < 2:
                raise _ragged(source, i, len(cells), "a 'Kernel Name' row has the kernel's name in its second")
            name, lines, first = cells[1], [], i + 1
        elif name is not None:
            lines.append(line)
    flush()
    if not found:
        raise MalformedToolOutput(f"{source} holds no 'Kernel Name' block; was it --page source --csv?")
    if kernels is None or len(found) > kernels:
        found = [b for i, b in enumerate(found) if not (i and found[i - 1][0] == b[0] and found[i - 1][1].equals(b[1]))]
    blocks: dict[str, pd.DataFrame] = {}
    for name, df in found:
        key, n = name, 2
        while key in blocks:
            key, n = f"{name} #{n}", n + 1
        blocks[key] = df
    return blocks
