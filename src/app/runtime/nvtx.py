"""NVTX ranges per stage, reported as emitted only when they really were (truth rule 4)."""
from __future__ import annotations

import os


class Nvtx:
    def __init__(self, requested: bool, domain: str):
        self.requested, self.domain = requested, domain
        self.ranges = 0
        self._nvtx = None
        self.reason = "not requested (pass --nvtx)"
        if not requested:
            return
        if os.environ.get("NVTX_DISABLE"):
            self.reason = "NVTX_DISABLE is set"
            return
        try:
            import nvtx
        except ImportError:
            self.reason = "the nvtx package is not installed (pip install nvtx)"
            return
        self._nvtx = nvtx
        self.reason = f"nvtx {getattr(nvtx, '__version__', '?')} push/pop per stage"

    @property
    def active(self) -> bool:
        return self._nvtx is not None

    def push(self, name: str) -> None:
        if self._nvtx is not None:
            self._nvtx.push_range(name, domain=self.domain)

    def pop(self) -> None:
        if self._nvtx is not None:
            self._nvtx.pop_range(domain=self.domain)
            self.ranges += 1

    def report(self) -> dict:
        return {"requested": self.requested, "emitted": self.ranges > 0, "ranges": self.ranges,
                "domain": self.domain, "detail": self.reason}
