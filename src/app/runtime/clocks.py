"""Whether GPU clocks were locked, and what they were: params.json's ``clocks`` block.

"Locked" is claimed only when all hold:

* the state file scripts/lock-gpu-clock.sh leaves behind for this GPU (one file per
  GPU, named by its UUID: ``state_path_for``; an older single-record file at
  ``state_path()`` is still read) is exactly what the script writes and names this
  GPU's UUID,
* the clocks the GPU reports (at the start and, where taken, at the end of the
  profile, and every sample taken between the timed runs) match what the script set:
  the SM clock within ``TOLERANCE_MHZ`` of the locked SM clock and, where the script
  locked the memory clock, the memory clock within ``TOLERANCE_MHZ`` of it, and
* the locked SM clock is below the GPU's max boost clock: a lock at the max reads the
  same as an unlocked GPU boosting to it, so it is "locked (recorded ...)" with
  ``locked`` None (unknown).

A file for another GPU or a stale file whose lock has been undone (a reset, a
reboot) is "not locked"; clocks or a UUID that cannot be read make it unknown
(``locked`` is None), never "not locked"; so do clocks the GPU reports held by an
applications clocks setting with no lock recorded. ``detail`` always says why. The
tool never changes clocks (gpu_clocks only reads).
"""
from __future__ import annotations

import glob
import json
import os
import sys

from app.runtime.gpu_clocks import UUID_RE, ClockSampler, snapshot


def state_path() -> str:
    """The state file name: an older single-record file (one GPU) sits there; see state_path_for."""
    return os.environ.get("APP_CLOCK_STATE", "/tmp/app-kernel-clock-state.json")


def _stem() -> str:
    base = state_path()
    return base[:-5] if base.endswith(".json") else base


def state_path_for(uuid: str) -> str:
    """One GPU's lock record, as the lock script names it: state_path() with the lower-case UUID before .json,
    so that locking one GPU never erases another's record."""
    return f"{_stem()}.{uuid.lower()}.json"


def record_path(uuid: str | None) -> str:
    """Where this GPU's lock is recorded: its own file, else an older single-record file at state_path(). With
    the UUID unknown, whichever record there is (decide() then says the GPU cannot be matched to it)."""
    if uuid:
        own = state_path_for(uuid)
        return own if os.path.lexists(own) else state_path()
    if os.path.lexists(state_path()):
        return state_path()
    others = sorted(glob.glob(glob.escape(_stem()) + ".gpu-*.json"))
    return others[0] if others else state_path()


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

    ``locked`` is True, False, or None when the GPU's reading cannot tell (unknown, ``detail`` says why).

    ``start`` is taken now when not given; ``end`` and ``samples`` are recorded when given."""
    if selected != "gpu":
        return {"locked": False, "reason": "cpu", "detail": "CPU run: GPU clocks do not apply"}
    if start is None:
        start = snapshot(uuid)
    this = uuid or (start.get("uuid") if start.get("available") else None)
    report: dict = {"locked": False, "uuid": this}
    path = record_path(this)
    missing = (f"neither {state_path_for(this)} nor {state_path()} exists" if this
               else f"{state_path()} does not exist and no GPU's record is there")
    state, why = read_state(path)
    if state is None and why is None and not start.get("available"):
        report |= {"locked": None, "reason": "no-lock-unread",
                   "detail": f"lock unknown: no lock recorded ({missing}), and this GPU's clocks "
                             f"could not be read ({start.get('why', 'no snapshot')}), so whether anything else "
                             "holds them is unknown"}
    elif state is None and why is None:
        report |= {"reason": "no-lock", "detail": f"not locked: no lock recorded ({missing}; "
                                                  f"run {LOCK_SCRIPT} to lock)"}
    elif state is None:
        report |= {"reason": "state-ignored",
                   "detail": f"not locked as far as this tool can tell: the clock state file {path} "
                             f"was ignored ({why})"}
    else:
        report["state"] = state
        snaps = [("start", start)] + ([("end", end)] if end is not None else [])
        locked, reason, detail = decide(state, this, snaps, samples, path)
        report |= {"locked": locked, "reason": reason, "detail": detail}
    held = _held_by(start, end, samples)
    if report["locked"] is False and report["reason"] in ("no-lock", "state-ignored", "other-gpu") and held:
        report |= {"locked": None, "reason": "held-unrecorded",
                   "detail": f"lock unknown: not locked by this tool's scripts ({report['detail']}); the GPU reports "
                             f"its clocks held by {held} (someone else's lock?)"}
    report["start"] = start
    if end is not None:
        report["end"] = end
    if samples is not None:
        report["samples"] = samples
    if report["reason"] not in ("no-lock", "locked"):
        print(f"warning: {report['detail']}", file=sys.stderr)
    return report


# Clock-event reasons with which the GPU says a setting holds its clocks: a lock this tool did not record.
LOCK_LIKE = {"applications_clocks_setting": "an applications clocks setting (clock-event reason 0x2, which "
                                            "locked clocks also show)"}


def _held_by(start: dict | None, end: dict | None, samples: dict | None) -> str | None:
    """What holds the clocks, in words, when the GPU reports a lock-like clock-event reason; else None."""
    seen = []
    for label, snap in (("start", start), ("end", end)):
        seen += [(r, label) for r in (snap or {}).get("reasons") or () if r in LOCK_LIKE]
    seen += [(r, "the timed runs") for r in (samples or {}).get("reasons_seen") or () if r in LOCK_LIKE]
    if not seen:
        return None
    names = list(dict.fromkeys(r for r, _ in seen))
    where = list(dict.fromkeys(w for _, w in seen))
    sm = (start or {}).get("sm_mhz")
    return (" and ".join(LOCK_LIKE[r] for r in names) + f" at {', '.join(where)}"
            + (f", SM at {sm} MHz" if sm is not None else ""))


def decide(state: dict, uuid: str | None, snaps: list[tuple[str, dict]],
           samples: dict | None = None, path: str | None = None) -> tuple[bool | None, str, str]:
    """(locked, reason, detail) for a well-formed lock ``state`` against this GPU's snapshots and the samples
    taken between the timed runs (ClockSampler.summary()); locked is None (unknown) when the reading cannot tell."""
    path = path or state_path()
    if not uuid:
        return None, "uuid-unknown", (f"lock unknown: {path} records a lock of "
                                      f"{state['uuid']}, but this GPU's UUID could not be read")
    if state["uuid"].lower() != uuid.lower():
        return False, "other-gpu", (f"not locked: {path} records a lock of {state['uuid']} ({state['name']}), "
                                    f"not of this GPU ({uuid})")
    sm_lock, mem_lock = state["locked_sm_mhz"], state["locked_mem_mhz"]
    for label, snap in snaps:
        if not snap or not snap.get("available"):
            return None, "clocks-unreadable", (f"lock unknown: {path} records a lock of "
                                               f"this GPU, but its clocks could not be read at {label} "
                                               f"({(snap or {}).get('why', 'no snapshot')})")
        for what, lock, field in (("SM", sm_lock, "sm_mhz"), ("memory", mem_lock, "mem_mhz")):
            if lock is None:
                continue
            now = snap.get(field)
            if now is None:
                return None, "clocks-unreadable", (f"lock unknown: {path} records a "
                                                   f"{what} lock at {lock} MHz, but the {what} clock could not be "
                                                   f"read at {label} ({field} unreadable)")
            if abs(now - lock) > TOLERANCE_MHZ:
                reasons = snap.get("reasons") or []
                extra = f" (clock-event reasons: {', '.join(reasons)})" if reasons else ""
                return False, "sm-mismatch" if what == "SM" else "mem-mismatch", (
                    f"not locked: {path} records a {what} clock lock at {lock} MHz ({state['locked_at']}), but the "
                    f"GPU reads {now} MHz at {label}{extra}: the lock was undone or is held down "
                    f"(run {LOCK_SCRIPT} again)")
    for what, lock, key in (("SM", sm_lock, "sm_mhz"), ("memory", mem_lock, "mem_mhz")):
        st = (samples or {}).get(key) if lock is not None else None
        if st and (abs(st["min"] - lock) > TOLERANCE_MHZ or abs(st["max"] - lock) > TOLERANCE_MHZ):
            seen = (samples or {}).get("reasons_seen") or []
            extra = f" (clock-event reasons seen: {', '.join(seen)})" if seen else ""
            return False, "sm-moved" if what == "SM" else "mem-moved", (
                f"not locked: clocks moved between runs: {st['min']}-{st['max']} MHz {what} in "
                f"{samples.get('n', '?')} samples taken between the timed runs, but {path} records a {what} clock "
                f"lock at {lock} MHz ({state['locked_at']}){extra}")
    read = {label: snap.get("sm_mhz") for label, snap in snaps}
    mem = f" / {mem_lock} MHz memory" if mem_lock is not None else " (memory clock not locked)"
    maxes = [m for m in [state["max_sm_mhz"]] + [snap.get("max_sm_mhz") for _, snap in snaps] if m is not None]
    if not maxes or sm_lock >= min(maxes) - TOLERANCE_MHZ:
        at = f"its max boost clock ({min(maxes)} MHz)" if maxes else "its max boost clock, which could not be read"
        return None, "locked-unconfirmed", (
            f"locked (recorded; the reading is consistent but cannot confirm it at the max clock): {path} records a "
            f"lock by {state['by']} at {sm_lock} MHz SM{mem} on {uuid} ({state['locked_at']}) and the GPU reads "
            + ", ".join(f"{v} MHz SM at {k}" for k, v in read.items())
            + f", but the lock is at {at}: a GPU whose lock was undone and that boosts to its max reads the same")
    return True, "locked", (f"locked by {state['by']} at {sm_lock} MHz SM{mem} on {uuid} ({state['locked_at']}); "
                            "the GPU reads " + ", ".join(f"{v} MHz SM at {k}" for k, v in read.items()))
