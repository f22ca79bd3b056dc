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
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2, default=str)
    os.replace(tmp, path)
    return path


def read_json(path: Path) -> tuple[object | None, str | None]:
    """(document, None); (None, None) when there is no file; (None, why) when it cannot be read."""
    try:
        return json.loads(path.read_text()), None
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"{path} is unreadable ({exc})"
