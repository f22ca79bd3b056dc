"""The clocks of a profile in words: one Configuration cell, and a note when the GPU throttled.

Both read params.json's ``clocks`` block (runtime.clocks.clock_report). A value that
could not be read shows as "n/a (<field> unreadable)", never as a number.
"""
from __future__ import annotations

from app.runtime.gpu_clocks import THROTTLING

NOT_LOCKED = {
    "no-lock": "not locked",
    "state-ignored": "not locked (lock file ignored)",
    "uuid-unknown": "not locked (this GPU's UUID is unreadable)",
    "clocks-unreadable": "not locked (clocks unreadable, lock unconfirmed)",
    "sm-mismatch": "not locked (the SM clock no longer matches the recorded lock)",
    "mem-mismatch": "not locked (the memory clock no longer matches the recorded lock)",
}


def _short(uuid: str | None) -> str:
    return f"{uuid[:12]}…" if uuid and len(uuid) > 12 else (uuid or "?")


def _mhz(snap: dict, field: str) -> str:
    v = snap.get(field)
    return f"{v:,}" if v is not None else f"n/a ({field} unreadable)"


def _snaps(clocks: dict) -> list[tuple[str, dict]]:
    return [(k, clocks[k]) for k in ("start", "end") if isinstance(clocks.get(k), dict)]


def _status(clocks: dict) -> str:
    if clocks.get("locked"):
        st = clocks.get("state") or {}
        mem = (f" / {st['locked_mem_mhz']:,} MHz mem" if st.get("locked_mem_mhz") is not None
               else " (mem not locked)")
        return f"locked at {st.get('locked_sm_mhz', '?'):,} MHz SM{mem} ({_short(clocks.get('uuid'))} matches)"
    reason = clocks.get("reason")
    if reason == "other-gpu":
        return f"not locked (the lock file is for {_short((clocks.get('state') or {}).get('uuid'))})"
    return NOT_LOCKED.get(reason, "not locked")


def _clock_range(snaps: list[tuple[str, dict]], field: str, label: str, samples: dict | None, key: str) -> str:
    values = [_mhz(s, field) for _, s in snaps]
    text = f"{label} {'→'.join(values) if len(set(values)) > 1 else values[0]} MHz"
    st = (samples or {}).get(key)
    if st:
        text += f" (timed runs {st['min']:,.0f}–{st['max']:,.0f}, median {st['median']:,.0f})"
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
