"""NVTX ranges per stage, reported as emitted only when they really were (a range pushed and popped)."""
from __future__ import annotations

import os
import threading


def _version(module) -> str:
    """The nvtx package's version: it has no ``__version__``, so from its installed distribution's metadata."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("nvtx")
    except (ImportError, PackageNotFoundError, ValueError):
        return getattr(module, "__version__", None) or "(version unknown)"


class Nvtx:
    """Push/pop NVTX ranges. With ``clock`` (a function returning integer ns), every range is also
    logged as (name, domain, start, end, thread id) on that clock -- how the in-process CUPTI trace
    learns the stage ranges, since CUPTI sees NVTX only through an injection library."""

    def __init__(self, requested: bool, domain: str, clock=None):
        self.requested, self.domain = requested, domain
        self.ranges = 0
        self._nvtx = self._domain = None
        self._attrs: dict = {}
        self.clock, self.log, self._open = clock, [], []
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
        self.reason = f"nvtx {_version(nvtx)} push/pop per stage"
        # The domain handle and one registered attribute set per range name are made once: a push is
        # then one C call, which keeps the instrumentation out of the stage times it brackets.
        dom = nvtx.get_domain(domain) if hasattr(nvtx, "get_domain") else None
        self._domain = dom if hasattr(dom, "get_event_attributes") and hasattr(dom, "push_range") else None

    def prepare(self, names) -> None:
        """Register the range names now: the first registration also starts the tool listening (nsys's injection
        library), which would otherwise happen at a push inside the first profiled range."""
        if self._domain is not None:
            for name in names:
                if name not in self._attrs:
                    self._attrs[name] = self._domain.get_event_attributes(message=name)

    @property
    def active(self) -> bool:
        return self._nvtx is not None

    def push(self, name: str) -> None:
        if self._domain is not None:
            attrs = self._attrs.get(name)
            if attrs is None:
                attrs = self._attrs[name] = self._domain.get_event_attributes(message=name)
            self._domain.push_range(attrs)
        elif self._nvtx is not None:
            self._nvtx.push_range(name, domain=self.domain)
        if self.clock is not None:
            self._open.append((name, self.clock()))

    def pop(self) -> None:
        if self.clock is not None:
            name, start = self._open.pop()
            self.log.append((name, self.domain, start, self.clock(), threading.get_ident()))
        if self._domain is not None:
            self._domain.pop_range()
            self.ranges += 1
        elif self._nvtx is not None:
            self._nvtx.pop_range(domain=self.domain)
            self.ranges += 1

    def report(self) -> dict:
        return {"requested": self.requested, "emitted": self.ranges > 0, "ranges": self.ranges,
                "domain": self.domain, "detail": self.reason}
