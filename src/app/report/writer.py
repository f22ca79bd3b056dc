"""A profile directory is written completely or not at all: write aside, then rename."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from app.errors import OutputNotWritable


def profile_parent(out_root: str | Path, mode: str, kernel: str, slug: str) -> Path:
    return Path(out_root) / "profiles" / mode / kernel / slug


def check_writable(parent: Path) -> None:
    """Fail before any work is done -- and without creating anything."""
    probe = Path(parent).absolute()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise OutputNotWritable(f"cannot write profiles under {parent} ({probe} is not a writable folder); "
                                "pass --out DIR with a writable folder")


def write_profile(parent: Path, files: dict[str, str | bytes | dict | list]) -> Path:
    """Write ``files`` (relative path -> content) into parent/<timestamp>/ atomically."""
    check_writable(parent)
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputNotWritable(f"cannot create {parent} ({exc.strerror or exc}); "
                                "pass --out DIR with a writable folder") from None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    final = parent / stamp
    n = 1
    while final.exists():
        n += 1
        final = parent / f"{stamp}-{n}"
    tmp = parent / f".{final.name}.partial-{os.getpid()}"
    try:
        for rel, content in files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, (dict, list)):
                path.write_text(json.dumps(content, indent=2, default=_json_default) + "\n")
            elif isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)
        os.rename(tmp, final)
    except BaseException as exc:  # KeyboardInterrupt too: never leave half a profile
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise OutputNotWritable(f"writing the profile under {parent} failed ({exc.strerror or exc}); "
                                    "check free space and permissions") from None
        raise
    return final


def _json_default(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
