"""`python -m app.kernel devlog PROFILE [--file F]`: append a profile's Performance block to a devlog.

The devlog is a markdown file in the user's own repository (``docs/kernels/<kernel>.md``
under the current folder by default). Each entry ends with a machine-readable
marker keyed by the profile's folder, so appending the same profile twice adds
nothing, and the next entry of the same kernel, version, mode, parameters and
device (and, in nsys mode, backend) finds the previous values to compare with. A profile from another GPU
starts a series of its own: an H100 is not "faster" than an H200 because one
plan ran on each (``compare`` refuses such a pair for the same reason).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import statistics
import time
from pathlib import Path

import jinja2

from app.analysis.baseline import MACHINES_CAVEAT, backend_of, other_card, other_settings, read_trace, refuse_unverified
from app.analysis.compare import machine_caution, one_process_verdict, pace_samples, samples_change, samples_of
from app.errors import BadParameter, OutputNotWritable
from app.report.clock_text import lock_known
from app.report.timing_text import pace_change_text
from app.report.writer import first_existing

MARKER = re.compile(r"<!-- app-kernel devlog entry (\{.*?\}) -->")
# The device an entry names in its Performance line, for entries whose marker predates the device field.
PERFORMANCE_DEVICE = re.compile(r"\*\*Performance\*\* \((.+?), clocks (?:not locked|locked|lock unknown),")
_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                          trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def _entries(text: str) -> list[dict]:
    out, start = [], 0
    for m in MARKER.finditer(text):
        try:
            entry = json.loads(m.group(1))
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        _clean(entry)
        if "device" not in entry:      # written before markers named the device: its Performance line does
            named = PERFORMANCE_DEVICE.findall(text, start, m.start())
            entry["device"] = named[-1] if named else None
        out.append(entry)
        start = m.end()
    return out


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _clean(entry: dict) -> None:
    """A marker's figures as the next entry reads them: a value edited into something that is no time or rate (a
    string, 0, NaN) is dropped, so the comparison says "--" rather than failing or printing "+inf%"."""
    for key in ("duration_us", "achieved_tflops", "achieved_gbps"):
        if key in entry and not _positive(entry[key]):
            entry.pop(key)
    if not isinstance(entry.get("key"), str):
        entry.pop("key", None)
    if not isinstance(entry.get("settings"), dict):
        entry.pop("settings", None)
    for key in ("samples", "host_pace_samples", "launch_pace_samples"):
        if key in entry and not (isinstance(entry[key], list) and entry[key] and all(map(_positive, entry[key]))):
            entry.pop(key)
    if "model" in entry and _model_totals(entry["model"]) is None:
        entry.pop("model")


def _model_totals(totals) -> dict | None:
    """``{"bytes": b, "flops": f}``, each a finite number of 0 or more; None where ``totals`` is not that."""
    if not isinstance(totals, dict):
        return None
    vals = {k: totals.get(k) for k in ("bytes", "flops")}
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
             for v in vals.values())
    return vals if ok else None


def _model_of_trace(trace: dict) -> dict | None:
    """The cost model's bytes and FLOPs over the stages an event profile's rates divide by its time; None where the
    rates are measured (the counter modes) or there are none."""
    if not str((trace.get("summary") or {}).get("rates_from") or "").startswith("cost-model"):
        return None
    return _model_totals(((trace.get("roofline") or {}).get("end_to_end")) or {})


def _model_of(entry: dict) -> dict | None:
    """An entry's cost-model totals: its marker's, or, for a marker written before markers kept them, those in its
    profile's trace where that is still there."""
    if entry.get("model"):
        return entry["model"]
    trace = _profile_trace(entry)
    return _model_of_trace(trace) if trace else None


def _model_change(new: dict | None, old: dict | None) -> dict:
    """Which of the cost model's totals ("bytes", "flops") differ between two entries of one series: the same
    parameters, so a difference is the model's own (counted differently), not the work's."""
    if not new or not old:
        return {}
    return {k: (old[k], new[k]) for k in ("bytes", "flops") if not math.isclose(old[k], new[k], rel_tol=1e-9)}


# The summary fields an entry prints, each a number (or null: missing, and said so) or, for the rest, its type.
_NUMBERS = ("duration_us", "achieved_tflops", "achieved_gbps", "occupancy_pct", "sm_pct")
_TYPES = {"missing": dict, "issues": list, "insights": list, "bottleneck": str, "occupancy_kind": str,
          "rates_from": str}


def _summary(trace: dict, profile: str) -> dict:
    """The profile's summary, checked field by field: one line naming the field where it is not what is printed."""
    summary = trace.get("summary")
    if not isinstance(summary, dict):
        raise BadParameter(f"devlog {profile}: this profile has no summary (made by an older version of the tool); "
                           "profile again to log it")
    for key in _NUMBERS:
        v = summary.get(key)
        if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                  and v >= 0):
            raise BadParameter(f"devlog {profile}: field 'summary.{key}' is {json.dumps(v)[:60]}, not a finite number "
                               "of 0 or more; the trace is damaged: profile again to log it")
    for key, kind in _TYPES.items():
        if summary.get(key) is not None and not isinstance(summary[key], kind):
            raise BadParameter(f"devlog {profile}: field 'summary.{key}' is not {'an' if kind is dict else 'a'} "
                               f"{kind.__name__.replace('dict', 'object').replace('str', 'string')}; the trace is "
                               "damaged: profile again to log it")
    return summary


def _params(path: Path, profile: str) -> dict:
    """The profile's params.json ({} where there is none), read for its clock state: one line where it is not a
    JSON object with ``clocks`` an object."""
    if not path.is_file():
        return {}
    try:
        params = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise BadParameter(f"devlog {profile}: {path} is not readable JSON ({exc}); the profile is damaged: "
                           "profile again to log it") from None
    if not isinstance(params, dict) or not isinstance(params.get("clocks") or {}, dict):
        raise BadParameter(f"devlog {profile}: {path} is not a profile's parameters (a JSON object with 'clocks' an "
                           "object); the profile is damaged: profile again to log it")
    return params


def _value(v, unit: str, digits: int = 1, why: str | None = None) -> str:
    if v is None:
        return f"missing ({why})" if why else "missing"
    return f"{v:,.{digits}f}{unit}"


def _mega(v: float) -> str:
    return f"{v / 1e6:,.3f} M"


def _vs(new, old, lower_is_better: bool = False) -> str:
    if new is None or old is None or not old:
        return "--"
    change = 100 * (new / old - 1)
    if lower_is_better:
        return f"{abs(change):.1f}% {'faster' if change < 0 else 'slower'}" if abs(change) >= 0.05 else "same"
    return f"{change:+.1f}%"


def _pace_rows(trace: dict, record: dict, prev: dict) -> tuple[list[list[str]], dict]:
    """The host's pace while the profile ran, each against the previous entry's: the fixed Python loop event mode
    times before every timed run, and on a GPU an empty kernel's launch timed the same way. At the default sizes
    the plans are bound by their host's launches, and a lent host's pace moves from one process to the next, so an
    entry "faster" than the last may have had the faster host. Returns the rows and the changes (None: not in both)."""
    rows, changes = [], {}
    for key, label, digits in (("host_pace", "Host CPU pace (a fixed Python loop before each timed run)", 1),
                               ("launch_pace", "Host launch pace (an empty kernel launched before each timed run)", 2)):
        samples = record[f"{key}_samples"] = pace_samples(trace, key)
        info = (trace.get("timing") or {}).get(key) or {}
        if samples:
            value = f"{1e6 * statistics.median(samples):,.{digits}f} us"
        elif info.get("why"):
            value = f"not measured ({info['why']})"
        else:
            value = "not recorded (the profile predates it, or its mode does not time it)"
        change = changes[key] = samples_change(prev.get(f"{key}_samples") or [], samples)
        rows.append([label, value, pace_change_text(change) if change else "--"])
    return rows, changes


def _digest(path: Path) -> str | None:
    """The first 16 hex digits of the trace file's SHA-256: which profile an entry is, beyond its folder's name."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def _settings(trace: dict) -> dict:
    """What other_settings reads of a profile, kept in its entry's marker."""
    timing = trace.get("timing") or {}
    return {"l2": (timing.get("l2") or {}).get("mode"), "warmup_runs": (timing.get("warmup") or {}).get("runs"),
            "selected_runtime": trace.get("selected_runtime"),
            "logical_cpus": (trace.get("device") or {}).get("logical_cpus")}


def _as_trace(settings: dict) -> dict:
    """A marker's settings in the form other_settings reads."""
    return {"timing": {"l2": {"mode": settings.get("l2")}, "warmup": {"runs": settings.get("warmup_runs")}},
            "selected_runtime": settings.get("selected_runtime"),
            "device": {"logical_cpus": settings.get("logical_cpus")}}


def _profile_trace(entry: dict) -> dict | None:
    """The trace.json of the profile an entry's key names, where that folder is still there (the key of a profile
    kept under docs/ is its path from the repository's root, where the command runs): what an entry written before
    its marker kept a field is read from. None where it is gone or is no readable profile trace."""
    if not entry.get("key") or not Path(entry["key"]).is_dir():
        return None
    try:
        return read_trace(entry["key"], "devlog")
    except BadParameter:
        return None


def _card_of(entry: dict) -> str | None:
    """The card an entry's profile ran on: its marker's, or, for a marker written before markers recorded it, the
    card in its profile's trace where that is still there."""
    if entry.get("card"):
        return entry["card"]
    trace = _profile_trace(entry)
    return (trace.get("device") or {}).get("uuid") if trace else None


def devlog_path(kernel: str, file: str | None) -> Path:
    """``file``, or the kernel's devlog in the user's repository: docs/kernels/<kernel>.md under the current folder."""
    return Path(file) if file else Path("docs") / "kernels" / f"{kernel}.md"


def _read(path: Path, flag: str) -> str:
    """The devlog's text ('' where there is none yet); one line naming ``flag`` where it cannot be read."""
    try:
        return path.read_text(encoding="utf-8") if path.is_file() else ""
    except (OSError, UnicodeDecodeError) as exc:     # a name no file can have, unreadable, not text
        raise OutputNotWritable(f"cannot read the devlog {path} ({getattr(exc, 'strerror', None) or exc}); pass "
                                f"{flag} with a readable text file") from None


def check_devlog(kernel: str, file: str | None) -> None:
    """Before a profile with --devlog runs: its devlog can be read, and written or created, so that a bad path fails
    before the work rather than after it."""
    path = devlog_path(kernel, file)
    _read(path, "--devlog FILE")
    target = path.absolute()
    try:
        probe = first_existing(target)
    except OSError as exc:
        why = exc.strerror or str(exc)
    else:
        if probe == target:                             # the devlog is there: appended to
            why = "it is a folder" if probe.is_dir() else None if os.access(probe, os.W_OK) else "it is not writable"
        elif not probe.is_dir():
            why = f"{probe} is not a folder"
        else:                                           # created, with the folders missing below the probe
            why = None if os.access(probe, os.W_OK | os.X_OK) else f"{probe} is not writable"
    if why:
        raise OutputNotWritable(f"cannot append to the devlog {path} ({why}); pass --devlog FILE with a writable "
                                "file")


def append_devlog(profile: str, file: str | None = None) -> tuple[Path, bool]:
    """(devlog path, appended?) -- False when this profile's entry is already there."""
    trace = read_trace(profile, "devlog")
    refuse_unverified(trace, profile, "devlog")     # a wrong answer's timings start no series and end none
    folder = Path(profile) if Path(profile).is_dir() else Path(profile).parent
    summary = _summary(trace, profile)
    params = _params(folder / "params.json", profile)
    path = devlog_path(trace["kernel"], file)
    key = "/".join(folder.resolve().parts[-4:])              # mode/kernel/params/timestamp
    text = _read(path, "--file F")
    entries = _entries(text)
    # The folder's name is its second: a profile written in the same second as one since deleted (or under another
    # out root) has the same key, so the trace's own digest tells the two apart (entries without one: the key).
    digest = _digest(folder / "trace.json")
    if any(e.get("key") == key and e.get("trace_sha256", digest) == digest for e in entries):
        return path, False
    device = trace.get("device", {}).get("name")
    # nsys mode's backends trace at different costs (CUPTI in process, nsys around it): each is a series of its own.
    backend = backend_of(trace)
    series = (trace["kernel"], trace["version"], trace.get("mode"), trace.get("metadata", {}).get("params"), device,
              backend)
    same = [e for e in entries if (e.get("kernel"), e.get("version"), e.get("mode"), e.get("params"), e.get("device"),
                                   e.get("backend")) == series]
    prev = same[-1] if same else {}
    miss = summary.get("missing", {})
    record = {"key": key, "kernel": trace["kernel"], "version": trace["version"], "mode": trace.get("mode"),
              "params": trace.get("metadata", {}).get("params"), "device": device,
              "card": trace.get("device", {}).get("uuid"), "duration_us": summary.get("duration_us"),
              "achieved_tflops": summary.get("achieved_tflops"), "achieved_gbps": summary.get("achieved_gbps"),
              "samples": samples_of(trace), "settings": _settings(trace), "trace_sha256": digest} | ({"backend": backend} if backend else {})
    model = _model_of_trace(trace)
    if model:
        record["model"] = model
    # Event mode's rates are the cost model's bytes and FLOPs over the measured time: where the model counts the
    # same work differently from the previous entry's (a model corrected between them), a rate's change is the
    # model's, not the kernel's, and is not given.
    remodelled = _model_change(model, _model_of(prev)) if prev else {}
    duration_vs = _vs(summary.get("duration_us"), prev.get("duration_us"), True)
    pace_rows, paces = _pace_rows(trace, record, prev)
    caution = None
    unjudged = ""
    if prev.get("samples") and duration_vs != "--":
        # The same verdict as `compare`: a change inside the runs' own noise is called noise, and so is one from too
        # few runs (the reason goes under the table); and its caution where the host's own pace changed the same
        # way as the plan.
        total = one_process_verdict(prev["samples"], record["samples"])      # two profiles: one process each
        duration_vs += " (no verdict: one process each)" if total.get("within_process") else f" ({total['verdict']})"
        unjudged = (f"the duration has no verdict: {total['why']}" if total.get("within_process") else
                    f"the duration's verdict is noise, {total['why']}" if total["ci_pct"][0] is None else "")
        caution = machine_caution(total, paces["host_pace"], paces["launch_pace"])
    # Entries of one card model may come from different machines: the marker records the card, and a comparison
    # across cards says so under the table. Where the card is not to be had (an older marker, its profile gone),
    # one machine cannot be told from two: that is said too, lest a machine's speed be credited to the code.
    prev_card = _card_of(prev) if prev else None
    card = other_card({"device": {"uuid": prev_card}}, trace) if prev else ""
    if prev and not prev_card and record["card"]:
        card = ("the previous entry recorded no card (it was written before entries did) and its profile is not here "
                "to read one from, so whether the two profiles ran on one machine is not known: " + MACHINES_CAVEAT)
    # The run settings compare warns about (L2 flushed or kept, warm-up or none, CPU counts), from the previous
    # entry's marker: its profile may be gone. An entry written before markers kept them compares nothing here.
    settings = other_settings([_as_trace(prev["settings"]), trace]) if prev.get("settings") else ""
    model_note = ("the cost model counts this work differently from the previous entry's ("
                  + ", ".join(f"{'FLOPs' if k == 'flops' else 'bytes'} {_mega(a)} then, {_mega(b)} now"
                              for k, (a, b) in remodelled.items())
                  + "), and the achieved rates are its counts over the time: their change would be the model's, so "
                    "none is given") if remodelled else ""
    notes = [x for x in (card, settings, model_note, unjudged) if x]
    rate_vs = {key: "-- (the cost model changed)" if what in remodelled else _vs(summary.get(key), prev.get(key))
               for key, what in (("achieved_tflops", "flops"), ("achieved_gbps", "bytes"))}
    rows = [
        ["Duration", _value(summary.get("duration_us"), " us", 1, miss.get("duration_us")), duration_vs],
        ["Achieved TFLOP/s", _value(summary.get("achieved_tflops"), "", 4, miss.get("achieved_tflops")),
         rate_vs["achieved_tflops"]],
        ["Achieved GB/s", _value(summary.get("achieved_gbps"), "", 1, miss.get("achieved_gbps")),
         rate_vs["achieved_gbps"]],
        [f"Occupancy ({summary.get('occupancy_kind') or 'n/a'})",
         _value(summary.get("occupancy_pct"), "%", 0, miss.get("occupancy_pct")), "--"],
        ["SM% (TC Util: these kernels use no tensor cores)", _value(summary.get("sm_pct"), "%", 1, miss.get("sm_pct")), "--"],
        *pace_rows,
    ]
    clocks = params.get("clocks", {})
    block = _ENV.get_template("devlog.md.j2").render(
        date=time.strftime("%Y-%m-%d", time.gmtime()), kernel=trace["kernel"], version=trace["version"],
        mode=trace.get("mode"), device=device,
        clocks={True: "clocks locked", False: "clocks not locked"}.get(lock_known(clocks), "clocks lock unknown"),
        params=", ".join(f"{k}={v}" for k, v in (trace.get("metadata", {}).get("params") or {}).items()),
        rows=rows, bottleneck=summary.get("bottleneck") or "n/a", issues=summary.get("issues") or [],
        insights=summary.get("insights") or [], profile=key, previous=prev.get("key"),
        card_note=f"Against the previous entry: {'; '.join(notes)}." if notes else "",
        caution=f"Caution: {caution}." if caution else "",
        rates_note=f"Rates: {summary['rates_from']}." if summary.get("rates_from") else "",
        marker=f"<!-- app-kernel devlog entry {json.dumps(record, sort_keys=True)} -->")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(block)
    except OSError as exc:
        raise OutputNotWritable(f"cannot append to the devlog {path} ({exc.strerror}); pass --file F with a "
                                "writable file") from None
    return path, True
