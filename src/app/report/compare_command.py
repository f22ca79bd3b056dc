"""`python -m app.kernel compare BASE NEW [--json] [--fail-on-regression PCT] [--force]`."""
from __future__ import annotations

import json
import math

from app.analysis.baseline import mismatch_of, other_card, read_trace
from app.analysis.compare import DEFAULT_FLOOR, compare_traces, regression
from app.errors import BadParameter, OneLineParser
from app.report.markdown import host_pace_change


def parser() -> OneLineParser:
    p = OneLineParser(prog="python -m app.kernel compare", allow_abbrev=False,
                description="Compare two profiles of the same kernel, version, parameters and device, stage by "
                            "stage and end to end: medians, the change with its 95% bootstrap interval, and a "
                            "verdict (faster, slower or noise).")
    p.add_argument("base", metavar="BASE", help="the earlier profile folder (or its trace.json)")
    p.add_argument("new", metavar="NEW", help="the later profile folder (or its trace.json)")
    p.add_argument("--json", action="store_true", help="print the comparison as one JSON document")
    p.add_argument("--fail-on-regression", type=float, metavar="PCT",
                   help="exit 1 when end to end is 'slower' by more than PCT percent (a CI regression gate)")
    p.add_argument("--floor", type=float, default=100 * DEFAULT_FLOOR, metavar="PCT",
                   help=f"changes below PCT percent are noise whatever the interval (default {100 * DEFAULT_FLOOR:g})")
    p.add_argument("--force", action="store_true",
                   help="compare profiles of different kernels, versions, parameters or devices anyway")
    return p


def table(result: dict, base: dict, new: dict, warning: str) -> str:
    lines = []
    if warning:
        lines.append(f"WARNING: {warning}")
    lines.append(f"{new['kernel']} {new['version']}: {base.get('mode')} profile vs {new.get('mode')} profile on "
                 f"{new.get('device', {}).get('name')} -- end to end: {result['verdict'].upper()}")
    lines.append(f"{'':<28} {'base (us)':>12} {'new (us)':>12} {'change':>9} {'95% interval':>20}  verdict")
    for name, r in [("(end to end)", result["total"])] + [(s["name"], s) for s in result["stages"]]:
        lo, hi = r["ci_pct"]
        ci = f"[{lo:+.1f}%, {hi:+.1f}%]" if math.isfinite(lo) else "(one sample)"
        lines.append(f"{name:<28} {r['base_median_us']:>12,.1f} {r['new_median_us']:>12,.1f} "
                     f"{r['change_pct']:>+8.1f}% {ci:>20}  {r['verdict']}")
    lines.append(f"noise: the interval includes 0, or |change| is below the runs' own spread or {result['floor_pct']:g}%")
    pace = result.get("host_pace")
    if pace:
        lines.append(f"host CPU pace (a fixed Python loop before each timed run): {host_pace_change(pace)}")
    else:
        lines.append("host CPU pace: not recorded in both profiles (profiles made before it was measured)")
    launch = result.get("launch_pace")
    if launch:
        lines.append(f"host launch pace (an empty kernel launched before each timed run, us a launch): "
                     f"{host_pace_change(launch)}")
    else:
        lines.append("host launch pace: not recorded in both profiles (GPU profiles only, and only since it was "
                     "measured)")
    if result.get("caution"):
        lines.append(f"CAUTION: {result['caution']}")
    return "\n".join(lines)


def run_compare(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if not (math.isfinite(args.floor) and args.floor >= 0):
        raise BadParameter("--floor must be a finite percentage >= 0")
    if args.fail_on_regression is not None and not (math.isfinite(args.fail_on_regression)
                                                    and args.fail_on_regression >= 0):
        raise BadParameter("--fail-on-regression must be a finite percentage >= 0")
    base, new = read_trace(args.base, "BASE"), read_trace(args.new, "NEW")
    warning = mismatch_of(base, new["kernel"], new["version"], new.get("metadata", {}).get("params"),
                          new.get("device", {}).get("name"))
    if warning and not args.force:
        raise BadParameter(f"BASE was measured for {warning}; compare like with like, or pass --force")
    if base.get("mode") != new.get("mode"):
        warning = "; ".join(x for x in (warning, f"modes differ ({base.get('mode')} vs {new.get('mode')}): their "
                                                  "stage times measure different things") if x)
    warning = "; ".join(x for x in (warning, other_card(base, new)) if x)
    result = compare_traces(base, new, args.floor / 100)
    gate = regression(result, args.fail_on_regression)
    if args.json:
        print(json.dumps(result | {"warning": warning or None, "regression": gate}, indent=2))
    else:
        print(table(result, base, new, warning))
        if gate:
            print(f"regression: end to end is {result['total']['change_pct']:+.1f}% (slower by more than "
                  f"{args.fail_on_regression:g}%)")
    return 1 if gate else 0
