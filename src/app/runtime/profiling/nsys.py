"""nsys mode: the plan's timeline, and where every microsecond of each stage went.

The worker (the same CLI, worker role) runs the cold run and warm-ups outside
any NVTX range, then ``--bench_runs`` iterations, each inside
``<kernel>@profile`` with one range per stage. Two backends record the same
facts -- NVTX ranges, CUDA runtime/driver calls, kernels, copies, memsets and
synchronisations:

* ``nsys`` (default): ``nsys profile -t cuda,nvtx -s none --cpuctxsw=none``
  around the worker, then ``nsys export --type sqlite``;
* ``cupti``: the worker traces itself with cupti-python, no nsys needed.

Both feed analysis.timeline (span = GPU busy + idle by cause, per stage) and
analysis.audit; the report reconciles each stage with the CUDA-event time the
worker measured for the same iterations.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import statistics
import subprocess
import time

from app.analysis.audit import answers, audit
from app.analysis.compare import MIN_RUNS, change_interval
from app.analysis.summary import nsys_summary
from app.analysis.timeline import (CAUSES, Timeline, account_ranges, capture_summary, stages_of, summarise,
                                  time_outside_stages)
from app.errors import AppError, BadParameter, MalformedToolOutput
from app.runtime import launch_pace
from app.runtime.lock import measurement_window
from app.runtime.profiling.base import Mode, Profile, ProfileOptions, register_mode
from app.runtime.profiling.cupti_trace import timeline_from_records
from app.runtime.profiling.parsers.nsys_sqlite import read_sqlite, strip_capture
from app.runtime.profiling.session import gpu_session, profile_files, worker_command, worker_env
from app.runtime.profiling.tools import find_tool, run_tool, tool_version
from app.runtime.profiling.worker import PROFILE_RANGE
from app.runtime.stats import drift

MISSING_LIB = re.compile(r"(lib[\w.+-]+\.so[.\d]*): cannot open shared object file")


@register_mode
class NsysMode(Mode):
    name = "nsys"

    def profile(self, plan, options: ProfileOptions) -> Profile:
        from app.report.timeline_report import nsys_report, stage_summary_line

        options.refuse_event_only(self.name)
        if options.bench_runs == "auto":
            raise BadParameter("--bench_runs auto: nsys mode traces a fixed number of iterations; give a number "
                               "(default 10), or use auto with --prof_type event")
        t0 = time.monotonic()
        capture = _cupti_capture if options.backend == "cupti" else _nsys_capture
        with gpu_session(plan, options, f"nsys mode ({options.backend})") as ses:
            # The traced iterations' idle times are host time: no other profile on this host times beside them.
            with measurement_window() as window:
                tl, worker, tool, capture_files = capture(plan, options, ses)
        analysis = analyse_plan(plan, tl, worker)
        trace = nsys_trace(plan, worker, analysis, tool)
        trace["timing"]["mode_wall_seconds"] = time.monotonic() - t0
        trace["timing"]["window_waited_seconds"] = window["waited_seconds"]
        trace["summary"] = nsys_summary(trace, analysis)
        files = profile_files(plan, worker, ses.selection, options, self.name, {options.backend: tool.get("version")})
        files["trace.json"] = trace
        files.update(capture_files)
        files["report.md"] = nsys_report(trace, analysis, files["params.json"], options.baseline)
        from app.report.chrome_trace import chrome_trace
        from app.report.plots import timeline_png     # matplotlib: only when a plot is drawn

        window = (min(r["start_ns"] for r in analysis["iterations"]),
                  max(r["end_ns"] for r in analysis["iterations"]))
        files["timeline.json"] = chrome_trace(tl, window, plan.kernel)
        files["timeline.png"] = timeline_png(tl, analysis, f"{plan.kernel} {plan.version} on "
                                             f"{worker['selection']['device_name']} ({tool['backend']})")
        files["timeline_ranges.csv"] = ranges_csv(analysis["instances"])
        verification = worker.get("verification")
        ok = verification is None or verification["matches"]
        return Profile(trace=trace, files=files, summary=stage_summary_line(trace, analysis), ok=ok)


def _nsys_capture(plan, options, ses):
    nsys = find_tool("nsys", options.nsys)
    rep = os.path.join(ses.tmpdir, "profile")
    cmd = [nsys, "profile", "-t", "cuda,nvtx", "-s", "none", "--cpuctxsw=none", "-f", "true", "-o", rep,
           *worker_command(plan, ses.worker_json, options.warmup, options.timed_runs(), verify=options.verify,
                           pace=True)]
    try:
        out, err = run_tool(cmd, timeout=options.nsys_timeout, label="nsys profile", env=worker_env())
    except AppError as exc:
        # nsys may exit non-zero when only its importer failed: name the library, not just the exit code.
        if os.path.exists(rep + ".nsys-rep") or not (".qdstrm" in str(exc) or MISSING_LIB.search(str(exc))):
            raise
        out, err = str(exc), ""
    if not os.path.exists(rep + ".nsys-rep"):
        raise AppError(_no_report(out + err, nsys))
    out, err = run_tool([nsys, "export", "--type", "sqlite", "-q", "true", "-f", "true", "-o", rep + ".sqlite",
                         rep + ".nsys-rep"], timeout=options.nsys_timeout, label="nsys export")
    if not os.path.isfile(rep + ".sqlite"):
        said = " | ".join(line.strip() for line in (out + err).splitlines() if line.strip())[-300:]
        raise MalformedToolOutput(f"nsys export wrote no SQLite file (it exited 0 and printed "
                                  f"{said or 'nothing'}); re-run the profile, or pass --nsys PATH to another nsys")
    tl = read_sqlite(rep + ".sqlite", origin="nsys export")
    strip_capture(rep + ".sqlite", rep + ".stripped.sqlite")
    files = {}
    for src, dst in ((".nsys-rep", "profile.nsys-rep"), (".stripped.sqlite", "profile.sqlite")):
        with open(rep + src, "rb") as f:
            files[dst] = f.read()
    tool = {"backend": "nsys", "path": nsys, "version": tool_version(nsys), "command": cmd}
    return tl, ses.load_worker("nsys profile"), tool, files


def _no_report(output: str, nsys: str) -> str:
    """nsys wrote its raw .qdstrm but its importer could not turn it into a .nsys-rep."""
    missing = MISSING_LIB.findall(output) or missing_libraries(importer_of(nsys))
    if missing:
        package = missing[0].split(".so")[0] + "1"          # libdw.so.1 -> Debian's libdw1
        return (f"nsys recorded the run but its importer (QdstrmImporter) cannot load {', '.join(missing)}, so only "
                f"a raw .qdstrm was written; install it (on Debian/Ubuntu: apt-get install {package}) or put the "
                "folder holding it on LD_LIBRARY_PATH")
    tail = " | ".join(line.strip() for line in output.splitlines() if line.strip())[-300:]
    return (f"nsys wrote no .nsys-rep: its importer failed ({tail or 'no output'}); check the Nsight Systems "
            "install (QdstrmImporter and its libraries) or pass --nsys PATH to another nsys")


def importer_of(nsys: str) -> str | None:
    """The QdstrmImporter that ships with this nsys: beside it, or in a sibling host folder."""
    here = os.path.dirname(os.path.realpath(nsys))
    for pattern in (os.path.join(here, "QdstrmImporter"), os.path.join(here, "..", "*", "QdstrmImporter")):
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def missing_libraries(binary: str | None) -> list[str]:
    """Shared libraries ``ldd`` cannot find for ``binary`` (with this process's library path)."""
    ldd = shutil.which("ldd")
    if not binary or not ldd:
        return []
    try:
        out = subprocess.run([ldd, binary], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_ldd(out)


def parse_ldd(text: str) -> list[str]:
    return [line.split("=>")[0].strip() for line in text.splitlines() if "=> not found" in line]


def _cupti_capture(plan, options, ses):
    cmd = worker_command(plan, ses.worker_json, options.warmup, options.timed_runs(), collect="cupti",
                         verify=options.verify, pace=True)
    run_tool(cmd, timeout=options.nsys_timeout, label="nsys (cupti backend) worker", env=worker_env())
    worker = ses.load_worker("the cupti worker")
    rec = worker["cupti"]
    tl = timeline_from_records(rec, worker["selection"]["device_name"])
    try:
        from importlib.metadata import version
        ver = version("cupti-python")
    except Exception:  # noqa: BLE001  (a version string is provenance, not a requirement)
        ver = None
    tool = {"backend": "cupti", "version": ver, "command": cmd, "overhead": _overhead(worker["overhead"])}
    files = {"cupti_records.json": {k: rec[k] for k in ("ranges", "api", "ops", "sync_corr")}}
    return tl, worker, tool, files


def _overhead(o: dict) -> dict:
    """CUPTI's cost: the median host wall time of the same iterations traced against untraced, with the change's 95%
    bootstrap interval (``ci_pct``; None under MIN_RUNS iterations a side)."""
    untraced, traced_runs = o["untraced_wall_seconds"], o["traced_wall_seconds"]
    plain, traced = statistics.median(untraced), statistics.median(traced_runs)
    ci = None
    if plain and min(len(untraced), len(traced_runs)) >= MIN_RUNS:
        _, lo, hi = change_interval(untraced, traced_runs)
        ci = [100 * lo, 100 * hi]
    return {"untraced_wall_us": plain * 1e6, "traced_wall_us": traced * 1e6,
            "overhead_pct": 100 * (traced - plain) / plain if plain else None, "ci_pct": ci,
            "note": "median host wall time of the same iterations, CUPTI off then on, in one process"}


def analyse_plan(plan, tl: Timeline, worker: dict) -> dict:
    """Accounting, summaries, event-mode reconciliation and audit for one captured plan."""
    # The recorder brackets each stage range with CUDA event records: use them for the event estimate. The stage
    # that hands back the result (the last, and any that emits it) and the whole iteration finish after their
    # read of it: the host's time after that read returns is its own, no round trip.
    names = [s.name for s in plan.stages]
    terminal = {names[-1]} | {s.name for s in plan.stages if s.category == "emit"}
    instances = account_ranges(tl, domain=plan.kernel, event_marks=True, finishing=terminal | {PROFILE_RANGE})
    iterations = [r for r in instances if r["name"] == PROFILE_RANGE]
    if not iterations:
        raise AppError(f"the capture holds no {plan.kernel}@{PROFILE_RANGE} range: nothing was profiled "
                       "(is the nvtx package installed where the worker runs? did it emit its ranges?)")
    if not any(r["ops"] for r in iterations):
        raise AppError(f"the capture holds no GPU op inside the {len(iterations)} profiled iteration(s): "
                       "the CUDA trace is empty (was the plan run on the GPU? was CUDA tracing on?)")
    summ = {s["name"]: s for s in summarise(instances)}
    missing = [n for n in names if n not in summ]
    if missing:
        raise AppError(f"the capture has no NVTX range for stage(s) {', '.join(missing)}; the trace is incomplete")
    # Each iteration's CUDA-event times, in the iterations' order (the ranges' instance numbers): a row of the
    # report compares its instance with that iteration's own event, not the median of all of them.
    samples = {n: [s["seconds"] * 1e6 for it in worker["iterations"] for s in it["stages"] if s["name"] == n]
               for n in names}
    samples[PROFILE_RANGE] = [it["total_seconds"] * 1e6 for it in worker["iterations"]]
    events = {n: statistics.median(v) for n, v in samples.items()}
    by_name = {s["name"]: s for s in worker["stages"]}
    # The stage's own account of how it staged its inputs (the capture shows each copy's host memory, not what
    # the host did before the first of them) and how many of its reads were of the result's size.
    stage_info = {n: {"category": by_name[n]["category"], "device": by_name[n]["device"],
                      "staging": str(by_name[n].get("meta", {}).get("staging", "")),
                      "size_reads": int(by_name[n].get("counters", {}).get("result_size_reads", 0))} for n in names}
    findings = audit([r for r in instances if r["name"] in names], stage_info, terminal)
    stages = [summ[n] for n in names]
    it = summ[PROFILE_RANGE]
    # The median iteration (the whole iteration's row in the accounting table) and its own stage instances: what
    # the plan's stages can act on. Its idle time "inside the stages" is each of those instances' own accounting,
    # summed, not the iteration's causes clipped to the stage windows: a build stage's 90 us after its last DMA was
    # the iteration's launch gap (the next stage's op came later) but that stage's 'after last op', where no launch
    # is pending and fusing kernels or a graph removes none of it. Its time outside every stage range (the
    # recorder's records and closing synchronize, the host finishing the run) is the run's, and a stage figure set
    # beside an iteration figure must be the same iteration's (an H200 overlay's advice set one iteration's
    # 243.2 us beside another's 267.6).
    rec = next(r for r in iterations if r["instance"] == it["median_instance"])
    inside = stages_of(rec, instances, names)
    order = {n: i for i, n in enumerate(names)}
    own_stages = sorted(summarise(inside), key=lambda s: order[s["name"]])
    it["idle_in_stages_us"] = {c: sum(s["idle_us"][c] for s in own_stages) for c in CAUSES}
    # The answers pick the largest cause from those stages' own accounting, and cite the same iteration's stage
    # instances (a stage's median instance is often another iteration: the join's build row is iteration 5, the
    # iteration's row 10).
    q1, q2 = answers(it, own_stages, findings, stage_info, terminal)
    return {"instances": instances, "iterations": iterations, "iteration": it, "stages": stages,
            "iteration_stages": own_stages, "event_us": events, "event_samples_us": samples, "findings": findings,
            "answers": [q1, q2], "capture": capture_summary(tl), "terminal": sorted(terminal)}


def nsys_trace(plan, worker, analysis, tool) -> dict:
    """trace.json: seed-000 fields, stage time = median host span of the stage's range."""
    sel = worker["selection"]
    by_name = {s["name"]: s for s in worker["stages"]}
    it = analysis["iteration"]
    spans = _span_samples(analysis, PROFILE_RANGE)
    stages = []
    for s in analysis["stages"]:
        w = by_name[s["name"]]
        stages.append({
            "name": s["name"], "category": w["category"], "device": w["device"],
            "elapsed_seconds": s["span_us"] / 1e6,
            "spread": s["span_spread"] | {"samples": _span_samples(analysis, s["name"])},
            "rows_in": w["rows_in"], "rows_out": w["rows_out"],
            "metadata": dict(w["meta"]) | w["counters"],
            "event_seconds": analysis["event_us"][s["name"]] / 1e6,
            # Each iteration's CUDA-event time of the stage, the median above's runs, in the iterations' order.
            "event_samples": [st["seconds"] for it in worker["iterations"] for st in it["stages"]
                              if st["name"] == s["name"]],
            "timeline": {k: v for k, v in s.items() if k not in ("name", "domain", "span_spread")},
            "tiling": plan.tiling[s["name"]],
        })
    return {
        "schema": "app.trace/1", "kernel": plan.kernel, "version": plan.version, "mode": "nsys",
        "selected_runtime": sel["selected"], "requested_runtime": sel["requested"],
        "device": {"name": sel["device_name"]} | sel["info"],
        "total_elapsed_seconds": it["span_us"] / 1e6,
        "timing": {"clock": f"host wall time of each NVTX range ({tool['backend']} trace)",
                   "timed_runs": it["instances"],
                   "total": it["span_spread"] | {"samples": spans},
                   "uncovered_seconds": statistics.median(_uncovered(analysis, by_name)) / 1e9,
                   "event_total_seconds": analysis["event_us"][PROFILE_RANGE] / 1e6,
                   "event_total_samples": [it["total_seconds"] for it in worker["iterations"]],
                   "drift": drift(spans), **_paces(worker, spans)},
        "metadata": {"planner_selected_runtime": sel["planner"], "selection_reason": sel["reason"],
                     "params": plan.params, "nvtx": worker["nvtx"], "verification": worker.get("verification"),
                     "tool": tool, "capture": analysis["capture"],
                     "iteration": {k: v for k, v in it.items() if k not in ("name", "domain")}},
        "stages": stages,
        "audit": {"findings": analysis["findings"], "answers": analysis["answers"]},
    }


def _paces(worker: dict, spans: list[float]) -> dict:
    """The host's paces the worker timed before each traced iteration, beside the iterations' spans (in the
    order both ran), as event mode gives them; a worker that did not time them says so."""
    pace = worker.get("pace")
    if pace is None:
        why = {"why": "not recorded: the worker of this capture did not time the host's pace"}
        return {"host_pace": why, "launch_pace": why}
    return launch_pace.timing(pace["loop_seconds"], pace["launch_seconds"], spans)


def _uncovered(analysis: dict, stage_names) -> list[int]:
    """Each iteration's time outside its stages' ranges (ns)."""
    return [time_outside_stages(it, analysis["instances"], stage_names) for it in analysis["iterations"]]


def _span_samples(analysis: dict, name: str) -> list[float]:
    """Each iteration's span of a range, in seconds (what `compare` resamples)."""
    return [r["span_ns"] / 1e9 for r in analysis["instances"] if r["name"] == name]


def ranges_csv(instances: list[dict]) -> str:
    """One row per range instance: the accounting behind every median in the report."""
    import pandas as pd

    rows = []
    for r in instances:
        row = {k: v for k, v in r.items() if not isinstance(v, (dict, list))}
        row.update({f"idle_{c}_ns": v for c, v in r["idle_ns"].items()})
        row["syncs"] = len(r["syncs"])
        rows.append(row)
    return pd.DataFrame(rows).to_csv(index=False)
