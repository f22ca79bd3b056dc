"""Whether GPU clocks were locked, and what they were: params.json's ``clocks`` block.

"Locked" is claimed only when both hold:

* the state file scripts/lock-gpu-clock.sh leaves behind is exactly what the script
  writes and names this GPU's UUID, and
* the clocks the GPU reports (at the start and, where taken, at the end of the
  profile) match what the script set: the SM clock within ``TOLERANCE_MHZ`` of the
  locked SM clock and, where the script locked the memory clock, the memory clock
  within ``TOLERANCE_MHZ`` of it.

Anything else -- no file, a file for another GPU, a stale file whose lock has been
undone (a reset, a reboot), clocks that cannot be read -- is "not locked" with a
detail that says why. The tool never changes clocks (gpu_clocks only reads).
"""
from __future__ import annotations

import json
import os
import sys

from app.runtime.gpu_clocks import UUID_RE, ClockSampler, snapshot


def state_path() -> str:
    return os.environ.get("APP_CLOCK_STATE", "/tmp/app-kernel-clock-state.json")


LOCK_SCRIPT = "scripts/lock-gpu-clock.sh"
TOLERANCE_MHZ = 15
_INT_OR_NULL = (int, type(None))
STATE_FIELDS = {"gpu": int, "uuid": str, "name": str,
                "locked_sm_mhz": int, "readback_sm_mhz": _INT_OR_NULL,
                "locked_mem_mhz": _INT_OR_NULL, "readback_mem_mhz": _INT_OR_NULL,
                "max_sm_mhz": _INT_OR_NULL, "max_mem_mhz": _INT_OR_NULL,
                "locked_at": str, "by": str}
# What the lock script wrote before it recorded the GPU's UUID.
_OLD_FIELDS = {"gpu", "name", "locked_sm_mhz", "readback_sm_mhz", "max_sm_mhz", "locked_at", "by"}


def read_state(path: str, uuid: str | None = None) -> tuple[dict | None, str | None]:
    """(state, None) when ``path`` holds exactly what the lock script writes (and, with ``uuid``,
    for that GPU); (None, None) when there is no file; (None, why) otherwise. The file sits where
    others may write: it is input like any other."""
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"unreadable ({exc})"
    if isinstance(state, dict) and set(state) == _OLD_FIELDS:
        return None, f"written by an older {LOCK_SCRIPT} that did not record the GPU's UUID; lock again"
    if not isinstance(state, dict) or set(state) != set(STATE_FIELDS):
        return None, "not the lock script's format"
    for key, kind in STATE_FIELDS.items():
        if not isinstance(state[key], kind) or isinstance(state[key], bool):
            return None, f"field {key!r} has the wrong type"
    if state["by"] != LOCK_SCRIPT or state["locked_sm_mhz"] <= 0 or (state["locked_mem_mhz"] or 1) <= 0:
        return None, "not written by " + LOCK_SCRIPT
    if not UUID_RE.match(state["uuid"]):
        return None, "field 'uuid' is not a GPU UUID"
    if uuid and state["uuid"].lower() != uuid.lower():
        return None, f"it records GPU {state['uuid']} ({state['name']}), not this GPU ({uuid})"
    return state, None


def clock_snapshot(selection) -> dict | None:
    """The selected GPU's clocks now (None on the CPU): taken at the start and the end of a profile."""
    return snapshot(gpu_uuid(selection)) if selection.selected == "gpu" else None


def gpu_uuid(selection) -> str | None:
    return (selection.info or {}).get("uuid") if selection.selected == "gpu" else None


class _NoSampler:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def poll(self) -> None:
        pass

    def summary(self):
        return None


def sampler_for(selection):
    """A ClockSampler of the selected GPU (a no-op on the CPU); use it around the timed runs."""
    return ClockSampler(gpu_uuid(selection)) if selection.selected == "gpu" else _NoSampler()


def clock_report(selected: str, uuid: str | None = None, *, start: dict | None = None, end: dict | None = None,
                 samples: dict | None = None) -> dict:
    """params.json's ``clocks``: locked, reason, detail, uuid, state, start, end, samples.

    ``start`` is taken now when not given; ``end`` and ``samples`` are recorded when given."""
    if selected != "gpu":
        return {"locked": False, "reason": "cpu", "detail": "CPU run: GPU clocks do not apply"}
    if start is None:
        start = snapshot(uuid)
    this = uuid or (start.get("uuid") if start.get("available") else None)
    report: dict = {"locked": False, "uuid": this}
    state, why = read_state(state_path())
    if state is None and why is None:
        report |= {"reason": "no-lock", "detail": f"not locked: no lock recorded ({state_path()} does not exist; "
                                                  f"run {LOCK_SCRIPT} to lock)"}
    elif state is None:
        report |= {"reason": "state-ignored",
                   "detail": f"not locked as far as this tool can tell: the clock state file {state_path()} "
                             f"was ignored ({why})"}
    else:
        report["state"] = state
        snaps = [("start", start)] + ([("end", end)] if end is not None else [])
        locked, reason, detail = decide(state, this, snaps)
        report |= {"locked": locked, "reason": reason, "detail": detail}
    report["start"] = start
    if end is not None:
        report["end"] = end
    if samples is not None:
        report["samples"] = samples
    if report["reason"] not in ("no-lock", "locked"):
        print(f"warning: {report['detail']}", file=sys.stderr)
    return report


def decide(state: dict, uuid: str | None, snaps: list[tuple[str, dict]]) -> tuple[bool, str, str]:
    """(locked, reason, detail) for a well-formed lock ``state`` against this GPU's snapshots."""
    path = state_path()
    if not uuid:
        return False, "uuid-unknown", (f"not locked as far as this tool can tell: {path} records a lock of "
                                       f"{state['uuid']}, but this GPU's UUID could not be read")
    if state["uuid"].lower() != uuid.lower():
        return False, "other-gpu", (f"not locked: {path} records a lock of {state['uuid']} ({state['name']}), "
                                    f"not of this GPU ({uuid})")
    sm_lock, mem_lock = state["locked_sm_mhz"], state["locked_mem_mhz"]
    for label, snap in snaps:
        if not snap or not snap.get("available"):
            return False, "clocks-unreadable", (f"not locked as far as this tool can tell: {path} records a lock of "
                                                f"this GPU, but its clocks could not be read at {label} "
                                                f"({(snap or {}).get('why', 'no snapshot')})")
        for what, lock, field in (("SM", sm_lock, "sm_mhz"), ("memory", mem_lock, "mem_mhz")):
            if lock is None:
                continue
            now = snap.get(field)
            if now is None:
                return False, "clocks-unreadable", (f"not locked as far as this tool can tell: {path} records a "
                                                    f"{what} lock at {lock} MHz, but the {what} clock could not be "
                                                    f"read at {label} ({field} unreadable)")
            if abs(now - lock) > TOLERANCE_MHZ:
                reasons = snap.get("reasons") or []
                extra = f" (clock-event reasons: {', '.join(reasons)})" if reasons else ""
                return False, "sm-mismatch" if what == "SM" else "mem-mismatch", (
                    f"not locked: {path} records a {what} clock lock at {lock} MHz ({state['locked_at']}), but the "
                    f"GPU reads {now} MHz at {label}{extra}: the lock was undone or is held down "
                    f"(run {LOCK_SCRIPT} again)")
    read = {label: snap.get("sm_mhz") for label, snap in snaps}
    mem = f" / {mem_lock} MHz memory" if mem_lock is not None else " (memory clock not locked)"
    return True, "locked", (f"locked by {state['by']} at {sm_lock} MHz SM{mem} on {uuid} ({state['locked_at']}); "
                            "the GPU reads " + ", ".join(f"{v} MHz SM at {k}" for k, v in read.items()))
