"""`python -m app.kernel timeline REPORT.{nsys-rep,sqlite} [--domain D] [--json]`: the wall-time
accounting of nsys mode on any capture with NVTX ranges, from this project or not."""
from __future__ import annotations

import json
import os

from app.analysis.audit import audit
from app.analysis.timeline import account_ranges, capture_summary, summarise
from app.errors import AppError, BadParameter, OneLineParser
from app.runtime.profiling.parsers.nsys_sqlite import read_sqlite
from app.runtime.profiling.tools import find_tool, run_tool, tool_tmpdir

JSON_KEYS = ("name", "domain", "instances", "span_us", "busy_us", "kernel_us", "memcpy_us", "memset_us", "ops",
             "idle_us")


def parser() -> OneLineParser:
    p = OneLineParser(prog="python -m app.kernel timeline", allow_abbrev=False,
                description="Account for the wall time of every NVTX range of an Nsight Systems capture: span = "
                            "GPU busy + idle time by cause. A .nsys-rep needs nsys (for its SQLite export); a "
                            ".sqlite export needs nothing.")
    p.add_argument("report", metavar="REPORT", help="an .nsys-rep, or its SQLite export (nsys export --type sqlite)")
    p.add_argument("--domain", metavar="D", help="only the ranges of this NVTX domain (default: every domain)")
    p.add_argument("--json", action="store_true",
                   help='print one JSON document {"ranges": [...]} with per-range medians instead of tables')
    p.add_argument("--nsys", metavar="PATH", help="nsys executable for exporting a .nsys-rep (default: $NSYS, PATH, "
                                                  "Nsight install folders)")
    p.add_argument("--nsys-timeout", type=float, default=600.0, metavar="SECONDS",
                   help="seconds before the export is stopped (default 600)")
    return p


def run_timeline(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    path = args.report
    if not os.path.isfile(path):
        raise BadParameter(f"{path}: no such file; pass an .nsys-rep or its .sqlite export")
    if path.endswith(".nsys-rep"):
        nsys = find_tool("nsys", args.nsys)
        with tool_tmpdir("timeline") as tmp:        # a killed run's folder is removed by the next tool run
            sqlite = os.path.join(tmp, "export.sqlite")
            run_tool([nsys, "export", "--type", "sqlite", "-q", "true", "-f", "true", "-o", sqlite, path],
                     timeout=args.nsys_timeout, label="nsys export")
            tl = read_sqlite(sqlite, origin="nsys export")     # its failure names the export, not a temp path
    else:
        tl = read_sqlite(path)
    instances = account_ranges(tl, domain=args.domain)
    if not instances:
        domains = sorted(set(tl.ranges["domain"].tolist()))
        raise AppError(f"{path} has no NVTX range" + (f" in domain {args.domain!r} (domains present: "
                                                      f"{', '.join(repr(d) for d in domains) or 'none'})"
                                                      if args.domain is not None else "")
                       + "; annotate the program with NVTX ranges and capture with nsys profile -t cuda,nvtx")
    summaries = summarise(instances)
    findings = audit(instances)
    if args.json:
        doc = {"ranges": [{k: s[k] for k in JSON_KEYS} | {"details": {k: v for k, v in s.items() if k not in JSON_KEYS}}
                          for s in summaries],
               "findings": findings, "capture": capture_summary(tl)}
        print(json.dumps(doc, indent=2))
    else:
        from app.report.timeline_report import timeline_text

        print(timeline_text(path, summaries, findings, capture_summary(tl)))
    return 0
