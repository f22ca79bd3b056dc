"""--baseline: a previous profile's trace.json, checked before any profiling starts.

A baseline is input like any other: the path must be a regular file of sane size
holding a trace of this tool, with finite times, and it must describe the same
kernel, version, parameters and device as the run it is compared with -- a
comparison across those is refused unless ``--force``, and then every report
says so at the top.
"""
from __future__ import annotations

import json
import math
import os
import re
import stat
import sys

from app.errors import BadParameter, VerificationCouldNotRun, VerificationFailed

MAX_BYTES = 64 << 20          # a trace of this tool is kilobytes; anything this large is not one


# The fix for a trace this tool wrote that has since been damaged or edited: its figures cannot be trusted.
# The folder a profile's writer fills before it renames it into place (report/writer.py): never a finished profile.
PARTIAL = re.compile(r"^\..*\.partial-\d+$")
DAMAGED = "the trace is damaged: profile again, or pass another profile folder or its trace.json"


def _fail(path, why: str, what: str = "--baseline", fix: str = "pass a profile folder or its trace.json"):
    raise BadParameter(f"{what} {path}: {why}; {fix}")


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def read_trace(path: str, what: str = "--baseline") -> dict:
    """A profile's trace.json (or the folder holding it), checked: a regular file of sane size, with the
    fields a comparison needs, finite and of the right types. Anything else is one clear error."""
    p = os.path.join(path, "trace.json") if os.path.isdir(path) else path
    if PARTIAL.search(os.path.basename(os.path.dirname(os.path.abspath(p)))):
        _fail(path, "a profile folder still being written, or left by a writer that was stopped (its name ends in "
                    ".partial-<pid>)", what, "profile again, or pass a finished profile folder")
    try:
        st = os.stat(p)
    except OSError as exc:
        _fail(path, f"not a readable profile trace ({p}: {exc.strerror})", what)
    if not stat.S_ISREG(st.st_mode):
        _fail(path, f"{p} is not a regular file", what)
    if st.st_size > MAX_BYTES:
        _fail(path, f"{p} is {st.st_size / 2**20:,.0f} MiB, too large to be a profile trace", what)
    try:
        with open(p, encoding="utf-8") as f:
            trace = json.load(f)
    except (OSError, ValueError, RecursionError) as exc:      # RecursionError: JSON nested past Python's stack
        _fail(path, f"not a readable profile trace ({exc})", what, DAMAGED if isinstance(exc, ValueError) else
              "pass a profile folder or its trace.json")
    _check_shape(path, trace, what)
    return trace


def load_baseline(path: str | None, plan=None, device_name: str | None = None, force: bool = False) -> dict | None:
    if not path:
        return None
    return check_baseline(read_trace(path), path, plan, device_name, force)


def check_baseline(trace: dict, path, plan=None, device_name: str | None = None, force: bool = False) -> dict:
    """A baseline trace (read from ``path``, or handed over already loaded: the Python API's) checked as every
    baseline is: whole, of a verified output, and of the same kernel, version, parameters and device unless
    ``force`` (then marked so)."""
    _check_shape(path, trace)
    refuse_unverified(trace, path, "--baseline")
    mismatch = "" if plan is None else mismatch_of(trace, plan.kernel, plan.version, plan.params, device_name)
    if mismatch and not force:
        raise BadParameter(f"--baseline {path} was measured for {mismatch}; compare like with like, or pass "
                           "--force to compare anyway (the report will say so)")
    if mismatch:
        trace["_mismatch"] = mismatch
    return trace


def latest_profile(parent, device_name: str | None) -> str:
    """The newest earlier profile folder under ``parent`` (same mode, kernel, version and parameters by
    construction of the folder layout) that ran on ``device_name`` and whose output was not found wrong: a profile
    whose output did not match the reference (or whose check could not run) times a wrong answer, so it is
    skipped, and each one skipped is named on stderr (the newest good one is what a comparison wants after a
    broken run is fixed). A profile made with --no-verify is taken: its maker chose to time without a check."""
    folders = sorted((p for p in parent.glob("*") if p.is_dir() and not p.name.startswith(".")),
                     key=lambda p: p.name, reverse=True) if parent.is_dir() else []
    skipped = 0
    for folder in folders:
        try:
            with open(folder / "trace.json", encoding="utf-8") as f:
                trace = json.load(f)
            name = trace.get("device", {}).get("name")
        except (OSError, ValueError, AttributeError):
            continue
        if device_name is None or name == device_name:
            reason = unverified_reason(trace)
            if reason:
                skipped += 1
                print(f"baseline latest: skipped {folder}: {reason}", file=sys.stderr)
                continue
            return str(folder)
    also = f" with a verified output ({skipped} skipped above)" if skipped else ""
    raise BadParameter(f"--baseline latest: no earlier profile of these parameters on {device_name or 'this device'} "
                       f"under {parent}{also}; run once without --baseline first")


def launched_no_kernels(stage: dict) -> bool:
    """A stage of a counter-mode profile (ncu, annotation) that launched no kernel, such as the build's copies: ncu
    times kernels only, so it has no time (elapsed_seconds null; 0 in profiles made before that), not a time of zero,
    and no change is judged from it."""
    counters = stage.get("ncu")
    return (isinstance(counters, dict) and counters.get("kernels") == 0 and not counters.get("unprofiled")
            and stage.get("elapsed_seconds") in (0, None))


def _check_shape(path, trace, what: str = "--baseline") -> None:
    """Every field a comparison, a report's vs Baseline section or a devlog entry reads, of the type it reads: a trace
    that is damaged or hand-edited is refused here in one line, before any work, never met later as a traceback or
    as a change of "+inf%"."""
    if not isinstance(trace, dict):
        _fail(path, "not a profile trace (the JSON is not an object)", what)
    for key in ("kernel", "version"):
        if not isinstance(trace.get(key), str):
            _fail(path, f"field {key!r} is missing or not a string", what)
    total = trace.get("total_elapsed_seconds")
    if total is None and "total_elapsed_seconds" in trace:
        # a counter-mode profile with a kernel time ncu did not report: its report names the reading
        _fail(path, "the profile has no total time (a reading it needs is missing: its report.md names it), so "
                    "there is nothing to compare or log", what, "profile again")
    if not _finite(total) or total <= 0:
        _fail(path, f"total_elapsed_seconds={total!r} is not a finite positive number", what)
    stages = trace.get("stages")
    if not isinstance(stages, list) or not all(isinstance(s, dict) for s in stages):
        _fail(path, "field 'stages' is missing or not a list of stages", what)
    for s in stages:
        # A stage's time is its median run's: 0 or less is no time a change can be measured from. A counter-mode stage
        # that launched no kernel has no time at all (launched_no_kernels), which compare and devlog leave out.
        if not isinstance(s.get("name"), str) or not launched_no_kernels(s) and (
                not _finite(s.get("elapsed_seconds")) or s["elapsed_seconds"] <= 0):
            _fail(path, f"stage {s.get('name')!r} has no finite elapsed_seconds above 0 ({s.get('elapsed_seconds')!r})",
                  what, DAMAGED)
    if not isinstance(trace.get("device", {}), dict) or not isinstance(trace.get("metadata", {}), dict):
        _fail(path, "fields 'device' and 'metadata' must be objects", what)
    for key in ("params", "tool"):
        if not isinstance(trace.get("metadata", {}).get(key) or {}, dict):
            _fail(path, f"field 'metadata.{key}' must be an object", what, DAMAGED)
    timing = trace.get("timing", {})
    if not isinstance(timing, dict):
        _fail(path, f"field 'timing' is {_shown(timing)}, not an object", what, DAMAGED)
    for key in ("total", "host_pace", "launch_pace"):
        if not isinstance(timing.get(key) or {}, dict):
            _fail(path, f"field 'timing.{key}' is {_shown(timing[key])}, not an object", what, DAMAGED)
    for sp, whose in [(timing.get("total"), "the whole plan")] + [(s.get("spread"), f"stage {s['name']!r}")
                                                                  for s in stages]:
        if sp is not None and not isinstance(sp, dict):
            _fail(path, f"the spread of {whose} is {_shown(sp)}, not an object", what, DAMAGED)
        samples = (sp or {}).get("samples")
        if samples is not None and not (isinstance(samples, list) and all(_finite(v) and v >= 0 for v in samples)):
            _fail(path, f"the timing samples of {whose} are not a list of finite non-negative numbers", what, DAMAGED)
        if samples and sorted(samples)[len(samples) // 2] == 0:          # the median is 0: no time to compare
            _fail(path, f"the timing samples of {whose} have a median of 0 s", what, DAMAGED)
    for key in ("host_pace", "launch_pace"):
        # The host's pace is a fixed loop's or launch's time: a sample of 0 or less, or not finite, is no pace.
        samples = (timing.get(key) or {}).get("samples")
        bad = ([v for v in samples if not (_finite(v) and v > 0)] if isinstance(samples, list)
               else [samples] if samples is not None else [])
        if bad:
            _fail(path, f"field 'timing.{key}.samples' must be a list of finite positive numbers (seconds), and "
                        f"holds {_shown(bad[0])}", what, DAMAGED)


def _shown(v, limit: int = 60) -> str:
    """A value as a message quotes it: JSON, cut short."""
    text = json.dumps(v)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# What every note on two profiles that may come from two machines ends with (here and in a devlog entry).
MACHINES_CAVEAT = ("part of the change may be the machines' (host speed, clocks), not the code's; time both on one "
                   "machine before crediting the code")


def other_card(base: dict, new: dict) -> str:
    """Why two profiles of one card model are not a like-for-like timing when they ran on different cards (their
    UUIDs differ), or may have (both GPU runs, and one or both record no card: an older trace), or '' (the same
    card, or a CPU run). A card is a machine as far as a profile can tell, and machines of one model differ: four
    fresh starts of a lent H200 machine read 398 to 703 us for the same code after the build at overlay 10k x 10k,
    and one built the 100k inputs in 3,452 us where another took 2,638."""
    a, b = ((t.get("device") or {}).get("uuid") for t in (base, new))
    if a and b:
        return "" if a == b else (f"the two profiles ran on different cards ({a}, {b}), so on different machines: "
                                  f"{MACHINES_CAVEAT}")
    if all(t.get("selected_runtime") == "gpu" for t in (base, new)):
        which = ("neither profile records" if not (a or b)
                 else f"the {'baseline' if not a else 'new'} profile does not record")
        return f"{which} the card it ran on, so whether the two ran on one machine is not known: {MACHINES_CAVEAT}"
    return ""


def backend_of(trace: dict) -> str | None:
    """The tracer of an nsys-mode profile (``nsys`` or ``cupti``); None in the other modes."""
    return ((trace.get("metadata") or {}).get("tool") or {}).get("backend") if trace.get("mode") == "nsys" else None


def other_backend(traces: list[dict]) -> str:
    """Why nsys-mode profiles traced by different backends (nsys around the process, or CUPTI inside it) are not a
    like-for-like timing, or '': each tracer adds its own cost to every CUDA call, so the iterations' spans and the
    host's launch pace differ with the backend alone (CUPTI added 13.8-64.9% to the host time of the default
    join's iterations on the lent H200s)."""
    backends = list(dict.fromkeys(backend_of(t) for t in traces if t.get("mode") == "nsys"))
    if len(backends) < 2:
        return ""
    return (f"the nsys profiles were traced by different backends ({' vs '.join(str(b) for b in backends)}), and "
            "each tracer adds its own cost to every CUDA call: their spans and launch paces differ by the tracer "
            "alone; compare profiles of one backend")


def other_settings(traces: list[dict]) -> str:
    """What the profiles' recorded run settings say makes them time different things, or '': L2 cleared or kept
    between timed runs (a kept L2 serves repeat reads a flushed one fetches from DRAM), warm-up runs or none (the
    timed runs of a profile with none include cold ones), or CPU runs on hosts of different CPU counts (another
    machine, which the CPU's name alone does not tell)."""
    out = []
    l2 = list(dict.fromkeys(str(((t.get("timing") or {}).get("l2") or {}).get("mode")) for t in traces
                            if ((t.get("timing") or {}).get("l2") or {}).get("mode")))
    if len(l2) > 1:
        out.append(f"the profiles treated L2 differently between timed runs ({' vs '.join(l2)}): a kept L2 serves "
                   "repeat reads that a flushed one fetches from DRAM")
    warm = [((t.get("timing") or {}).get("warmup") or {}).get("runs") for t in traces]
    if any(w == 0 for w in warm) and any(isinstance(w, int) and w > 0 for w in warm):
        out.append("one profile ran no warm-up runs and another did: the timed runs of the first include cold ones")
    cpus = list(dict.fromkeys(t["device"].get("logical_cpus") for t in traces
                              if t.get("selected_runtime") == "cpu" and (t.get("device") or {}).get("logical_cpus")))
    if len(cpus) > 1:
        out.append(f"the CPU profiles ran on hosts of {' vs '.join(map(str, cpus))} logical CPUs: other machines")
    return "; ".join(out)


def stages_ran(trace: dict) -> str:
    """The version whose stages a profile timed: on the CPU some versions run another's (their difference is in
    their GPU kernels only; metadata.cpu_stages_of), elsewhere its own."""
    return (trace.get("metadata") or {}).get("cpu_stages_of") or str(trace.get("version"))


def same_cpu_stages(traces: list[dict]) -> str:
    """Why CPU profiles of different versions timed the same code, or '': join v3 and v4 run v1's stages on the CPU,
    so a difference between their profiles is the runs' noise or the machine's, never the versions'."""
    versions = list(dict.fromkeys(str(t.get("version")) for t in traces))
    ran = {stages_ran(t) for t in traces}
    if len(versions) < 2 or len(ran) != 1 or any(t.get("selected_runtime") != "cpu" for t in traces):
        return ""
    return (f"on the CPU {' and '.join(versions)} {'both' if len(versions) == 2 else 'all'} run {ran.pop()}'s stages "
            "(the versions differ in their GPU kernels only): these profiles time the same code, so a difference "
            "between them is not the versions'")


def mismatch_of(trace: dict, kernel: str, version: str, params: dict | None, device_name: str | None,
                other: str = "this run") -> str:
    """What makes ``trace`` not comparable with a run of (kernel, version, params, device), or ''. ``other`` names
    that run in the text (compare: NEW, the profile it holds the others against)."""
    diffs = []
    if trace["kernel"] != kernel:
        diffs.append(f"kernel {trace['kernel']} ({other}: {kernel})")
    elif trace["version"] != version:
        diffs.append(f"version {trace['version']} ({other}: {version})")
    theirs_params = trace.get("metadata", {}).get("params")
    if trace["kernel"] == kernel and theirs_params is not None and params is not None and theirs_params != params:
        changed = sorted(k for k in set(theirs_params) | set(params) if theirs_params.get(k) != params.get(k))
        diffs.append("other parameters (" + ", ".join(f"{k}={theirs_params.get(k)} vs {params.get(k)}"
                                                      for k in changed) + ")")
    theirs = trace.get("device", {}).get("name")
    if device_name and theirs and theirs != device_name:
        diffs.append(f"device {theirs} ({other}: {device_name})")
    return "; ".join(diffs)


# --- verification: a profile whose output was wrong, or not checked when a check was asked for, is no measurement

# How many rows of each kind a verification lists at most (the plans' oracles keep their first or worst five).
LISTED = 5


def verification_of(trace: dict) -> dict | None:
    """The profile's verification record: None when none was made (``--no-verify``); a record that is no JSON
    object (a trace edited by hand) reads as a check that could not be read, never as a pass."""
    meta = trace.get("metadata") if isinstance(trace, dict) else None
    v = meta.get("verification") if isinstance(meta, dict) else None
    if v is None or isinstance(v, dict):
        return v
    return {"error": f"the trace's verification record is damaged ({_shown(v)})", "matches": None}


def verification_state(v: dict | None) -> str:
    """``skipped`` (--no-verify), ``error`` (the oracle could not run: neither a pass nor a mismatch), ``ok`` or
    ``mismatch``."""
    if not v:
        return "skipped"
    if v.get("error"):
        return "error"
    return "ok" if v.get("matches") is True else "mismatch"


def pair_text(key) -> str:
    """A result row's key, (point, polygon) or (a, b)."""
    return f"({key[0]}, {key[1]})"


def _some(rows: list, count) -> str:
    """How many rows one side has: the plan's count where it recorded one, else the rows listed (all of them when
    fewer than the oracle lists)."""
    if isinstance(count, int):
        return f"{count:,}"
    return f"{len(rows)}" if len(rows) < LISTED else f"{LISTED} or more"


def worst_text(row) -> str:
    """One of the overlay's worst rows, ((a, b), got, expected): which pair, both areas and the difference."""
    key, got, exp = row
    if not exp:
        return f"{pair_text(key)} extra (area {got:.6g}, none expected)"
    if not got:
        return f"{pair_text(key)} missing (area {exp:.6g} expected)"
    return f"{pair_text(key)} area {got:.6g} vs {exp:.6g} expected ({100 * (got / exp - 1):+.3g}%)"


def what_differs(v: dict) -> str:
    """What a failed verification found, in one line: the counts (pairs differing, missing, extra) and the worst or
    first rows; every figure the record holds, none it does not."""
    rows = f"{v.get('pairs', 0):,} rows vs {v.get('expected_pairs', 0):,} expected"
    if v.get("problem"):
        return f"not a valid answer ({v['problem']}); {rows}"
    if isinstance(v.get("mismatched_pairs"), int):
        n = v["mismatched_pairs"]
        worst = v.get("worst") or []
        text = f"{n:,} pair{' differs' if n == 1 else 's differ'} ({rows})"
        return text + (f"; worst: {'; '.join(worst_text(r) for r in worst[:3])}" if worst else "")
    if "missing" in v or "extra" in v:
        missing, extra = v.get("missing") or [], v.get("extra") or []
        text = (f"{rows}: {_some(missing, v.get('missing_count'))} missing, "
                f"{_some(extra, v.get('extra_count'))} extra")
        text += "".join(f"; {what}: {', '.join(pair_text(k) for k in keys[:3])}" + (" ..." if len(keys) > 3 else "")
                        for what, keys in (("missing", missing), ("extra", extra)) if keys)
        if not missing and not extra:
            text += " (the same rows, out of order or one repeated)"
        return text
    return rows


def unverified_reason(trace: dict) -> str:
    """Why a profile cannot stand as a measurement (its output did not match the reference, or the check could not
    run), or '' (the check passed, or --no-verify asked for none)."""
    v = verification_of(trace)
    state = verification_state(v)
    if state == "mismatch":
        return f"its output did not match the reference ({v.get('oracle')}: {what_differs(v)})"
    if state == "error":
        return f"its output was not verified: the verification could not run ({v['error']})"
    return ""


def refuse_unverified(trace: dict, path, what: str) -> None:
    """One line, exit 9 (10 where the check could not run: the profile's own exit status), where ``trace`` is of a
    wrong (or unverified) output: ``what`` (devlog, compare's BASE or NEW, --baseline) takes it as no
    measurement. A profile made with --no-verify passes: its maker chose that."""
    reason = unverified_reason(trace)
    if reason:
        error = (VerificationCouldNotRun if verification_state(verification_of(trace)) == "error"
                 else VerificationFailed)
        raise error(f"{what} {path}: {reason}; a wrong answer's timings are no measurement: fix the output and "
                    "profile again")
