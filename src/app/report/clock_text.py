"""The clocks of a profile in words: one Configuration cell, and a note when the GPU throttled.

Both read params.json's ``clocks`` block (runtime.clocks.clock_report). A value that
could not be read shows as "n/a (<field> unreadable)", never as a number.
"""
from __future__ import annotations

from app.runtime.gpu_clocks import THROTTLING

NOT_LOCKED = {
    "no-lock": "not locked",
    "state-ignored": "not locked (lock file ignored)",
    "sm-mismatch": "not locked (the SM clock no longer matches the recorded lock)",
    "mem-mismatch": "not locked (the memory clock no longer matches the recorded lock)",
    "sm-moved": "not locked (the SM clock moved between the timed runs)",
    "mem-moved": "not locked (the memory clock moved between the timed runs)",
}


# Reasons whose reading cannot tell: unknown even in records written before ``locked`` could be None.
UNKNOWN_REASONS = frozenset({"uuid-unknown", "clocks-unreadable"})


def lock_known(clocks: dict | None) -> bool | None:
    """True (locked), False (not locked) or None (unknown: the reading cannot tell) for a ``clocks`` block."""
    clocks = clocks or {}
    locked = clocks.get("locked")
    if locked is None or clocks.get("reason") in UNKNOWN_REASONS:
        return None
    return bool(locked)


def lock_word(clocks: dict | None) -> str:
    """"yes", "no" or "unknown": whether the clocks were locked, as the reading supports it."""
    return {True: "yes", False: "no", None: "unknown"}[lock_known(clocks)]


def _short(uuid: str | None) -> str:
    return f"{uuid[:12]}…" if uuid and len(uuid) > 12 else (uuid or "?")


def _mhz(snap: dict, field: str) -> str:
    v = snap.get(field)
    return f"{v:,}" if v is not None else f"n/a ({field} unreadable)"


def _snaps(clocks: dict) -> list[tuple[str, dict]]:
    return [(k, clocks[k]) for k in ("start", "end") if isinstance(clocks.get(k), dict)]


def _status(clocks: dict) -> str:
    if lock_known(clocks) is None:
        return _unknown(clocks)
    if clocks.get("locked"):
        st = clocks.get("state") or {}
        mem = (f" / {st['locked_mem_mhz']:,} MHz mem" if st.get("locked_mem_mhz") is not None
               else " (mem not locked)")
        return f"locked at {st.get('locked_sm_mhz', '?'):,} MHz SM{mem} ({_short(clocks.get('uuid'))} matches)"
    reason = clocks.get("reason")
    if reason == "other-gpu":
        return f"not locked (the lock file is for {_short((clocks.get('state') or {}).get('uuid'))})"
    return NOT_LOCKED.get(reason, "not locked")


def _unknown(clocks: dict) -> str:
    """The cell's status when the reading cannot tell whether the clocks were locked."""
    reason = clocks.get("reason")
    if reason == "uuid-unknown":
        return "unknown (this GPU's UUID is unreadable)"
    if reason == "clocks-unreadable":
        whys = []
        for label, s in _snaps(clocks):
            if not s.get("available"):
                whys.append(f"{label}: {s.get('why', 'no snapshot')}")
            elif s.get("unreadable"):
                whys.append(f"{label}: {', '.join(s['unreadable'])} unreadable")
        return f"unknown (clocks unreadable: {'; '.join(whys) or 'no snapshot'})"
    if reason == "locked-unconfirmed":
        return "locked (recorded; the reading is consistent but cannot confirm it at the max clock)"
    if reason == "held-unrecorded":
        return ("unknown (not locked by this tool's scripts; the GPU reports its clocks held by an applications "
                "clocks setting (someone else's lock?))")
    if reason == "no-lock-unread":
        return "unknown (no lock recorded, and the clocks are unreadable)"
    return f"unknown ({clocks.get('detail') or 'no reason recorded'})"


def _clock_range(snaps: list[tuple[str, dict]], field: str, label: str, samples: dict | None, key: str) -> str:
    values = [_mhz(s, field) for _, s in snaps]
    text = f"{label} {'→'.join(values) if len(set(values)) > 1 else values[0]} MHz"
    st = (samples or {}).get(key)
    if st:      # how many readings the range is of: NVML is read between timed runs, at most once an interval
        n = (samples or {}).get("n")
        of = f"; {n} reading{'s' if n != 1 else ''}" if n else ""
        text += f" (timed runs {st['min']:,.0f}–{st['max']:,.0f}, median {st['median']:,.0f}{of})"
    return text


def throttling(clocks: dict) -> tuple[list[str], list[str], bool]:
    """(throttle reasons seen, other reasons seen, whether any reason could not be read)."""
    seen, unread = [], False
    for _, s in _snaps(clocks):
        if s.get("available") and s.get("reasons") is None:
            unread = True
        seen += [r for r in s.get("reasons") or () if r not in seen]
    samples = clocks.get("samples") or {}
    seen += [r for r in samples.get("reasons_seen") or () if r not in seen]
    return [r for r in seen if r in THROTTLING], [r for r in seen if r not in THROTTLING], unread


def clock_cell(clocks: dict | None) -> str:
    """e.g. "not locked; SM 345→1,980 MHz, mem 3,201 MHz, no throttling" or
    "locked at 1,755 MHz SM / 3,201 MHz mem (GPU-1904f39e… matches); SM 1,755 MHz, mem 3,201 MHz, no throttling"."""
    if not clocks:
        return "n/a (no clock record)"
    if clocks.get("reason") == "cpu":
        return "n/a (CPU run)"
    parts = [_status(clocks)]
    snaps = _snaps(clocks)
    readable = [(k, s) for k, s in snaps if s.get("available")]
    if not readable:
        why = next((s.get("why") for _, s in snaps if s.get("why")), "no snapshot")
        return f"{parts[0]}; clocks n/a ({why})"
    samples = clocks.get("samples")
    parts.append(_clock_range(readable, "sm_mhz", "SM", samples, "sm_mhz"))
    parts.append(_clock_range(readable, "mem_mhz", "mem", samples, "mem_mhz"))
    if len(readable) < len(snaps):
        gone = [k for k, s in snaps if not s.get("available")]
        parts.append(f"{'/'.join(gone)} clocks n/a (unreadable)")
    throttle, other, unread = throttling(clocks)
    if throttle:
        parts.append(f"THROTTLED ({', '.join(throttle)})")
    elif unread and not (samples or {}).get("n"):
        parts.append("throttling n/a (reasons unreadable)")
    else:
        parts.append("no throttling" + (f" (other reasons: {', '.join(other)})" if other else ""))
    return "; ".join(parts[:1]) + "; " + ", ".join(parts[1:])


def throttle_note(clocks: dict | None) -> str:
    """A sentence naming the throttling seen (start, end, timed runs), or "" when there was none."""
    if not clocks or clocks.get("reason") == "cpu":
        return ""
    where = []
    for label, s in _snaps(clocks):
        bad = [r for r in s.get("reasons") or () if r in THROTTLING]
        if bad:
            where.append(f"{', '.join(bad)} at the {label}")
    samples = clocks.get("samples") or {}
    if samples.get("throttled_samples"):
        names = [r for r in samples.get("reasons_seen") or () if r in THROTTLING]
        where.append(f"{', '.join(names)} in {samples['throttled_samples']} of {samples['n']} samples taken "
                     "between the timed runs")
    if not where:
        return ""
    return ("The GPU throttled its clocks (" + "; ".join(where) + "): power, thermal or hardware limits held them "
            "below the set clocks, so the times are slower than an unthrottled run.")
