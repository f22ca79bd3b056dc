"""The tool's per-user cache (autotune results, GPU calibrations): where it lives, how files are read and
written. ``$APP_CACHE_DIR`` moves it; the default is ``~/.cache/app-kernel``."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def cache_dir(kind: str) -> Path:
    root = os.environ.get("APP_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "app-kernel")
    return Path(root) / kind


def write_json(path: Path, doc: dict) -> Path:
    """Atomically: a reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, json.dumps(doc, indent=2, default=str).encode())


def write_atomic(path: Path, data: bytes) -> Path:
    """Write ``path`` through a temporary file beside it, replaced in one step. A Ctrl-C or SIGTERM (Terminated,
    raised in whatever line runs) between the two removes the temporary file: a folder keeps no stray ``.name-XXXX``
    to confuse a reader (a sweep's later --resume, say)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)           # mkstemp's 0600 would hide the file from the user's group
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:               # already replaced: the new file is whole
            pass
        raise
    return path


def read_json(path: Path) -> tuple[object | None, str | None]:
    """(document, None); (None, None) when there is no file; (None, why) when it cannot be read."""
    try:
        return json.loads(path.read_text()), None
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"{path} is unreadable ({exc})"
