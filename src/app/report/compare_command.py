"""`python -m app.kernel compare BASE[,BASE...] NEW[,NEW...] [--json] [--fail-on-regression PCT] [--force]`.

Each side may be several profiles of its code, each made in its own process: a lent host's pace moves from one
process to the next (by up to 1.6x on an H200 host, identical code), so one profile a side can credit the host's
change to the code. With several, each side's figure is the median of its processes' medians and the interval
resamples the processes (analysis.compare.process_change_interval)."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from app.analysis.baseline import (mismatch_of, other_backend, other_card, other_settings, read_trace,
                                   refuse_unverified, same_cpu_stages)
from app.analysis.compare import (DEFAULT_FLOOR, MIN_PROCESSES, MIN_RUNS, ONE_PROCESS_WHY, compare_processes, regression,
                                  total_text, verdict_text)
from app.errors import BadParameter, OneLineParser
from app.report.timing_text import host_pace_change
from app.report.writer import finite_or_null


def parser() -> OneLineParser:
    p = OneLineParser(prog="python -m app.kernel compare", allow_abbrev=False,
                description="Compare two profiles of the same kernel, version, parameters and device, stage by "
                            "stage and for the whole plan (each profile's total): medians, the change with its 95% "
                            "bootstrap interval, and a verdict (faster, slower or noise). A host's speed can change "
                            "from one process to the next by more than a code change: give each side as several "
                            "profiles, each made in its own process, and the interval holds that change too (a verdict "
                            f"needs {MIN_PROCESSES} processes a side, {MIN_RUNS} runs in each; from one profile a side "
                            "the change and what its runs call it are shown, no verdict). A profile whose output did not "
                            "match the reference (exit 9), or could not be checked (exit 10), is refused: it times a "
                            "wrong answer.")
    p.add_argument("base", metavar="BASE[,BASE...]",
                   help="the earlier profile folder (or its trace.json); or several, comma-separated, each made in "
                        f"its own process (profile each side in {MIN_PROCESSES} or more processes for a verdict, the "
                        "two sides' processes in turns)")
    p.add_argument("new", metavar="NEW[,NEW...]", help="the later profile folder, or several, as BASE")
    p.add_argument("--json", action="store_true", help="print the comparison as one JSON document")
    p.add_argument("--fail-on-regression", type=float, metavar="PCT",
                   help="exit 1 when the whole plan (total) is 'slower' by more than PCT percent (a CI regression "
                        f"gate; needs {MIN_PROCESSES} or more profiles a side, each from its own process; never on "
                        "noise)")
    p.add_argument("--floor", type=float, default=100 * DEFAULT_FLOOR, metavar="PCT",
                   help=f"changes below PCT percent are noise whatever the interval (default {100 * DEFAULT_FLOOR:g})")
    p.add_argument("--force", action="store_true",
                   help="compare profiles of different kernels, versions, parameters or devices anyway")
    return p


# What compare's whole-plan row is, and is not: a profile's report also gives an "end to end, host arrays in and out"
# figure, timed in other runs, and the two differ (1,189.8 against 1,132.0 us in one CPU profile of the join).
TOTAL_LABEL = "whole plan (total)"
TOTAL_NOTE = (f"{TOTAL_LABEL}: each profile's 'total, median of timed runs' (host arrays in, the result left where "
              "the plan made it: on the device in a GPU run), "
              "not its report's 'end to end, host arrays in and out', which other runs time")


def _us(v) -> str:
    return "absent" if v is None else f"{v:,.1f}"


def table(result: dict, base: dict, new: dict, warning: str) -> str:
    lines = []
    if warning:
        lines.append(f"WARNING: {warning}")
    total = result["total"]
    few = f", {total['why']}" if total["why"].startswith("too few") else ""
    # the verdict word in capitals ("NO VERDICT (one process a side; ...)", "SLOWER"), the reason as written
    word, _, rest = total_text(total).partition(" (")
    called = word.upper() + (f" ({rest}" if rest else "")
    lines.append(f"{new['kernel']} {new['version']}: {base.get('mode')} profile vs {new.get('mode')} profile on "
                 f"{new.get('device', {}).get('name')} -- {TOTAL_LABEL}: {called}{few}")
    lines.append(f"{'':<28} {'base (us)':>12} {'new (us)':>12} {'change':>9} {'95% interval':>20}  verdict")
    reasons = []
    for name, r in [(TOTAL_LABEL, total)] + [(s["name"], s) for s in result["stages"]]:
        lo, hi = r["ci_pct"]
        if lo is not None:
            ci = f"[{lo:+.1f}%, {hi:+.1f}%]"
        else:       # no interval: too few runs or a median out of range; the reason is given under the table
            ci = next((f"({few})" for few in ("too few runs", "too few processes") if r["why"].startswith(few)),
                      "(none)")
            if r["why"] not in reasons:
                reasons.append(r["why"])
        if r.get("within_process") and r["why"] not in reasons:
            reasons.append(r["why"])
        change = "--" if r["change_pct"] is None else f"{r['change_pct']:+.1f}%"
        lines.append(f"{name:<28} {_us(r['base_median_us']):>12} {_us(r['new_median_us']):>12} "
                     f"{change:>9} {ci:>20}  {verdict_text(r)}")
    for r in result.get("one_side_stages", []):
        side = ("--", "--") if r.get("no_kernels") else (_us(r["base_median_us"]), _us(r["new_median_us"]))
        lines.append(f"{r['name']:<28} {side[0]:>12} {side[1]:>12} {'--':>9} {'--':>20}  {r['why'].split(':')[0]}")
    lines.append(f"noise: the interval includes 0, or |change| is below the runs' own spread or "
                 f"{result['floor_pct']:g}%, or a side has fewer than {result.get('min_runs', MIN_RUNS)} runs")
    lines += [f"no verdict: {why}" if why == ONE_PROCESS_WHY else f"noise, no interval: {why}" for why in reasons]
    if any(not r.get("no_kernels") for r in result.get("one_side_stages", [])):
        lines.append("a stage in one side only (renamed, or another kernel's) has nothing to compare with: no verdict")
    lines += [f"{r['name']}: {r['why']}" for r in result.get("one_side_stages", []) if r.get("no_kernels")]
    lines.append(TOTAL_NOTE)
    if total.get("processes", [1, 1]) != [1, 1]:
        medians = ["; ".join(f"{m:,.1f}" for m in side) for side in total["process_medians_us"]]
        lines.append(f"processes: base {total['processes'][0]} (medians {medians[0]} us), new {total['processes'][1]} "
                     f"(medians {medians[1]} us); each side's figure is the median of its processes' medians, and the "
                     "interval resamples the processes, then their runs")
    lines += [f"note: {n}" for n in result.get("notes", [])]
    pace = result.get("host_pace")
    if pace:
        lines.append(f"host CPU pace (a fixed Python loop before each timed run): {host_pace_change(pace)}")
    else:
        lines.append("host CPU pace: not recorded in either profile (event and nsys modes time it; a counter-mode "
                     "profile, ncu or annotation, or one made before it was measured has none)")
    launch = result.get("launch_pace")
    if launch:
        lines.append(f"host launch pace (an empty kernel launched before each timed run, us a launch): "
                     f"{host_pace_change(launch)}")
    else:
        lines.append("host launch pace: not recorded in either profile (event and nsys modes time it on a GPU; a "
                     "counter-mode profile, a CPU run, or one made before it was measured has none)")
    if result.get("caution"):
        lines.append(f"CAUTION: {result['caution']}")
    return "\n".join(lines)


def _side(paths: str, what: str) -> tuple[list[dict], list[Path]]:
    """The traces of one side and their resolved trace paths: one profile, or several comma-separated, each once (a
    profile listed twice would count one process as two and narrow the interval for nothing)."""
    seen = {}
    for path in paths.split(","):
        if not path.strip():
            raise BadParameter(f"{what} {paths!r} holds an empty profile path (a stray comma?); separate the profiles "
                               "by single commas")
        try:
            key = Path(path).resolve()
            key = key / "trace.json" if key.is_dir() else key
        except OSError as exc:      # a name no file can have (too long), a loop of links
            raise BadParameter(f"{what} {path}: not a readable profile ({exc.strerror or exc}); pass a profile "
                               "folder or its trace.json") from None
        if key in seen:
            also = "" if seen[key] == path else f" (also as {seen[key]})"
            raise BadParameter(f"{what} lists the profile {path} twice{also}: give each process's profile once")
        seen[key] = path
    traces = [read_trace(path, what) for path in seen.values()]
    for path, trace in zip(seen.values(), traces):
        refuse_unverified(trace, path, what)       # a wrong answer's timings are compared with nothing
    return traces, list(seen)


_STAMP = re.compile(r"^(\d{8}-\d{6})")      # a profile folder's name starts with the second it was written (UTC)


def _stamp(key: Path) -> str | None:
    """When a profile was written, from its folder's name (None where the folder was renamed)."""
    m = _STAMP.match((key.parent if key.name == "trace.json" else key).name)
    return m.group(1) if m else None


def not_in_turns(base_keys: list[Path], new_keys: list[Path]) -> str:
    """Why two sets of profiles may differ by when they ran, or '': every profile of one side written before every
    profile of the other. The pace of a lent host moves between processes and over minutes, so the sets must take
    turns for a change between them to be the code's. Said only where each side has two or more profiles and every
    folder still has its time in its name."""
    if min(len(base_keys), len(new_keys)) < 2:
        return ""
    base, new = [_stamp(k) for k in base_keys], [_stamp(k) for k in new_keys]
    if None in base or None in new:
        return ""
    for first, a, second, b in (("BASE", base, "NEW", new), ("NEW", new, "BASE", base)):
        if max(a) < min(b):
            return (f"the {first} profiles were all made before the {second} ones ({min(a)} to {max(a)}, then "
                    f"{min(b)} to {max(b)}, UTC): the sides did not take turns, so a change in the machine's pace "
                    "between them would read as the code's; make them in turns (python -m app.kernel ab does)")
    return ""


def check_percentages(args) -> None:
    """--floor and --fail-on-regression (either may be None: not given), checked before any work: compare's own,
    and ab's before it makes a worktree."""
    if args.floor is not None and not (math.isfinite(args.floor) and args.floor >= 0):
        raise BadParameter("--floor must be a finite percentage >= 0")
    if args.fail_on_regression is not None and not (math.isfinite(args.fail_on_regression)
                                                    and args.fail_on_regression >= 0):
        raise BadParameter("--fail-on-regression must be a finite percentage >= 0")


def run_compare(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    check_percentages(args)
    (bases, base_keys), (news, new_keys) = _side(args.base, "BASE"), _side(args.new, "NEW")
    both = [str(k.parent if k.name == "trace.json" else k) for k in base_keys if k in new_keys]
    if both:
        raise BadParameter(f"BASE and NEW both hold the profile {both[0]}: a profile compared with itself shows "
                           "nothing; give each side its own profiles")
    if args.fail_on_regression is not None and min(len(bases), len(news)) < MIN_PROCESSES:
        # From fewer processes a side no verdict is drawn, so the gate could never fire: refused, not passed silently.
        raise BadParameter(f"--fail-on-regression needs {MIN_PROCESSES} or more profiles a side, each made in its own "
                           f"process, the two sides in turns (got {len(bases)} and {len(news)}): processes of "
                           "identical code differ by more than a gate's threshold; use `python -m app.kernel ab`, "
                           "or compare BASE1,...,BASE5 NEW1,...,NEW5")
    base, new = bases[0], news[0]
    warning = ""
    for what, trace in [("BASE", t) for t in bases] + [("NEW", t) for t in news[1:]]:
        unlike = mismatch_of(trace, new["kernel"], new["version"], new.get("metadata", {}).get("params"),
                             new.get("device", {}).get("name"), "NEW")
        if unlike and not args.force:
            raise BadParameter(f"{what} was measured for {unlike}; compare like with like, or pass --force")
        warning = warning or unlike
    modes = list(dict.fromkeys(str(t.get("mode")) for t in bases + news))
    if len(modes) > 1:
        warning = "; ".join(x for x in (warning, f"modes differ ({' vs '.join(modes)}): their "
                                                  "stage times measure different things") if x)
    warning = "; ".join(x for x in (warning, not_in_turns(base_keys, new_keys), other_backend(bases + news),
                                    other_settings(bases + news),
                                    same_cpu_stages(bases + news),
                                    next(filter(None, (other_card(base, t) for t in bases + news)), "")) if x)
    result = compare_processes(bases, news, args.floor / 100)
    gate = regression(result, args.fail_on_regression)
    if args.json:
        # JSON has no NaN or infinity: a figure without one (no interval, say) is null
        print(json.dumps(finite_or_null(result | {"warning": warning or None, "regression": gate}), indent=2))
    else:
        print(table(result, base, new, warning))
        if gate:
            print(f"regression: the {TOTAL_LABEL} is {result['total']['change_pct']:+.1f}% (slower by more than "
                  f"{args.fail_on_regression:g}%)")
    return 1 if gate else 0
