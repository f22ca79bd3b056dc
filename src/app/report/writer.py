"""A profile directory is written completely or not at all: write aside, then rename."""
from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

from app.errors import OutputNotWritable


def profile_parent(out_root: str | Path, mode: str, kernel: str, slug: str) -> Path:
    return Path(out_root) / "profiles" / mode / kernel / slug


def first_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (the root always does); OSError for a name no file can have
    (too long), where exists() raises instead of returning False."""
    path = Path(path).absolute()
    return next(p for p in (path, *path.parents) if p.exists())


def check_writable(parent: Path) -> None:
    """Fail before any work is done -- and without creating anything."""
    try:
        probe = first_existing(parent)
    except OSError as exc:     # exists() raises for a name no folder can have (too long: ENAMETOOLONG)
        raise OutputNotWritable(f"cannot write profiles under {parent} ({exc.strerror or exc}); "
                                "pass --out DIR with a writable folder") from None
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise OutputNotWritable(f"cannot write profiles under {parent} ({probe} is not a writable folder); "
                                "pass --out DIR with a writable folder")


def write_profile(parent: Path, files: dict[str, str | bytes | dict | list]) -> Path:
    """Write ``files`` (relative path -> content) into parent/<timestamp>/ atomically.

    The files go to a hidden ``.<name>.partial-<pid>`` folder first, which is renamed
    into place once complete. Two runs finishing in the same second get distinct
    names (the rename is retried with the next free suffix, never overwriting), and
    partial folders left by writers that were killed are removed here. When a signal
    (or any error, a full disk's too) stops it before the rename, the folders this call
    created on the way to ``parent`` go too, unless something else was put in them
    meanwhile: an interrupted or failed run leaves the output root as it found it.
    """
    check_writable(parent)
    created: list[Path] = []          # the folders made here, outermost first
    try:
        make_folders(parent, created)
    except BaseException as exc:      # KeyboardInterrupt too
        if isinstance(exc, OSError):
            raise OutputNotWritable(f"cannot create {parent} ({exc.strerror or exc}); "
                                    "pass --out DIR with a writable folder") from None
        remove_empty(created)
        raise
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    tmp = parent / f".{stamp}.partial-{os.getpid()}"
    final = None
    try:
        remove_stale_partials(parent)
        for rel, content in files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, (dict, list)):
                path.write_text(json.dumps(finite_or_null(content), indent=2, default=_json_default,
                                           allow_nan=False) + "\n")
            elif isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)
        final = claim_folder(parent, stamp)
        os.rename(tmp, final)             # onto the empty folder we own: atomic
    except BaseException as exc:  # KeyboardInterrupt too: never leave half a profile
        if final is not None and not tmp.exists():
            exc.profile_dir = final       # the signal came after the rename: the profile is complete
        else:
            shutil.rmtree(tmp, ignore_errors=True)
            if final is not None:
                shutil.rmtree(final, ignore_errors=True)     # the name we claimed, still empty
            remove_empty(created)     # a full disk too: the run leaves the output root as it found it
        if isinstance(exc, OSError):
            raise OutputNotWritable(f"writing the profile under {parent} failed ({exc.strerror or exc}); "
                                    "check free space and permissions") from None
        raise
    return final


def make_folders(path: Path, created: list[Path]) -> None:
    """Create ``path`` and its missing parents, appending to ``created`` each folder this call made (outermost
    first) as soon as it is made; one another process makes meanwhile is found existing and is not listed."""
    missing = []
    for p in (path, *path.parents):
        if p.is_dir():
            break
        missing.append(p)
    for p in reversed(missing):
        try:
            os.mkdir(p)
        except FileExistsError:
            if not p.is_dir():
                raise
            continue
        created.append(p)


def remove_empty(created: list[Path]) -> None:
    """Remove the folders of ``created`` (outermost first, as make_folders lists them), innermost first, while
    they are empty: one that holds anything (another run's profile, a file put there meanwhile) stays, and so do
    the folders around it. Only folders this run created are ever in the list."""
    for p in reversed(created):
        try:
            os.rmdir(p)               # removes only an empty folder
        except OSError:
            return


def claim_folder(parent: Path, stamp: str) -> Path:
    """Create and return the first free ``stamp``, ``stamp-2``, ... folder: a concurrent writer that
    finishes in the same second gets the next one, so no finished profile is ever overwritten."""
    for n in range(1, 10_000):
        final = parent / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            os.mkdir(final)
        except FileExistsError:
            continue
        return final
    raise OutputNotWritable(f"no free profile name under {parent} for {stamp}; clean up old profiles")


def remove_stale_partials(parent: Path) -> list[Path]:
    """Remove ``.*.partial-<pid>`` folders whose writer process is gone."""
    removed = []
    for p in parent.glob(".*.partial-*"):
        pid = p.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True                       # someone else's live process
    return True


def finite_or_null(doc):
    """``doc`` with every NaN or infinite float as None: JSON has no NaN, and a reading or interval that is
    missing (NaN in memory) is null in the files, never a number a reader could take."""
    if isinstance(doc, dict):
        return {k: finite_or_null(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [finite_or_null(v) for v in doc]
    if isinstance(doc, float) and not math.isfinite(doc):
        return None
    return doc


def _json_default(o):
    import numpy as np

    if isinstance(o, np.generic):
        return finite_or_null(o.item())
    if isinstance(o, np.ndarray):
        return finite_or_null(o.tolist())
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
