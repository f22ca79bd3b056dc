"""In-process CUDA trace with cupti-python: the records nsys would have captured, without nsys.

Collects activity records for kernels, memcpys, memsets, runtime and driver
API calls and synchronisations, converted to plain tuples inside the buffer
callback (CUPTI reuses its buffers). Range boundaries come from the caller's
own clock marks taken with ``cupti.get_timestamp()`` -- the clock the records
use -- because CUPTI sees NVTX only through an injection library set before
the process starts. The result feeds the same analysis as an nsys export.
"""
from __future__ import annotations

from app.analysis.timeline import Timeline
from app.errors import ToolNotFound

# CUpti_ActivityMemcpyKind and CUpti_ActivityMemoryKind, used when the module's enums lack a value.
COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
              9: "HtoH", 10: "PtoP"}
MEMORY_KINDS = {1: "pageable", 2: "pinned", 3: "device", 4: "array", 5: "managed"}
KINDS = ("CONCURRENT_KERNEL", "MEMCPY", "MEMSET", "RUNTIME", "DRIVER", "SYNCHRONIZATION")


def load_cupti():
    try:
        from cupti import cupti
    except ImportError as exc:
        raise ToolNotFound(f"--backend cupti needs cupti-python ({exc}); pip install cupti-python "
                           "matching your CUDA major version, or use --backend nsys") from None
    return cupti


def _cbid_names(cupti) -> dict[tuple[str, int], str]:
    """(domain, callback id) -> API function name, from whichever enum this cupti-python exposes."""
    names = {}
    for domain, candidates in (("runtime", ("runtime_api_trace_cbid", "Runtime_api_trace_cbid",
                                            "RuntimeApiTraceCbid")),
                               ("driver", ("driver_api_trace_cbid", "Driver_api_trace_cbid",
                                           "DriverApiTraceCbid"))):
        for attr in candidates:
            enum = getattr(cupti, attr, None)
            if enum is None:
                continue
            for member in enum:
                name = member.name
                for prefix in ("CUPTI_RUNTIME_TRACE_CBID_", "CUPTI_DRIVER_TRACE_CBID_"):
                    name = name.removeprefix(prefix)
                names[(domain, int(member))] = name
            break
    return names


class CuptiTrace:
    def __init__(self):
        self.cupti = load_cupti()
        self.kinds = [getattr(self.cupti.ActivityKind, k) for k in KINDS]
        self.k = {k: int(getattr(self.cupti.ActivityKind, k)) for k in KINDS}
        self.names = _cbid_names(self.cupti)
        self.api, self.ops, self.sync_corr = [], [], []
        self.dropped = 0

    def clock(self) -> int:
        return int(self.cupti.get_timestamp())

    def start(self) -> None:
        self.cupti.activity_register_callbacks(self._requested, self._completed)
        for kind in self.kinds:
            self.cupti.activity_enable(kind)

    def stop(self) -> dict:
        self.cupti.activity_flush_all(1)
        for kind in self.kinds:
            self.cupti.activity_disable(kind)
        self.cupti.activity_flush_all(1)
        return {"api": self.api, "ops": self.ops, "sync_corr": self.sync_corr, "source": "cupti activity records"}

    @staticmethod
    def _requested():
        return 8 * 1024 * 1024, 0

    def _completed(self, activities) -> None:
        k = self.k
        for a in activities:
            kind = int(a.kind)
            if kind in (k["RUNTIME"], k["DRIVER"]):
                domain = "runtime" if kind == k["RUNTIME"] else "driver"
                name = self.names.get((domain, int(a.cbid)), f"{domain}#{int(a.cbid)}")
                self.api.append((int(a.start), int(a.end), name, int(a.correlation_id), int(a.thread_id)))
            elif kind == k["CONCURRENT_KERNEL"]:
                self.ops.append((int(a.start), int(a.end), "kernel", str(a.name), int(a.correlation_id),
                                 int(a.stream_id), int(a.device_id), 0, "", ""))
            elif kind == k["MEMCPY"]:
                direction = COPY_KINDS.get(int(a.copy_kind), "other")
                host = a.src_kind if direction.startswith("H") else a.dst_kind if direction.endswith("H") else None
                self.ops.append((int(a.start), int(a.end), "memcpy", f"memcpy {direction}", int(a.correlation_id),
                                 int(a.stream_id), int(a.device_id), int(a.bytes), direction,
                                 MEMORY_KINDS.get(int(host), "") if host is not None else ""))
            elif kind == k["MEMSET"]:
                self.ops.append((int(a.start), int(a.end), "memset", "memset", int(a.correlation_id),
                                 int(a.stream_id), int(a.device_id), int(a.bytes), "", ""))
            elif kind == k["SYNCHRONIZATION"]:
                self.sync_corr.append(int(a.correlation_id))


def timeline_from_records(rec: dict, device_name: str) -> Timeline:
    """The Timeline of what ``CuptiTrace.stop()`` returned plus the worker's logged ranges."""
    # CUPTI reports the API thread as a 32-bit id; the ranges carry the full thread id.
    mask = 0xFFFFFFFF
    return Timeline([(n, d, s, e, t & mask) for n, d, s, e, t in rec["ranges"]],
                    [(s, e, n, c, t & mask) for s, e, n, c, t in rec["api"]], rec["ops"], frozenset(rec["sync_corr"]),
                    source=rec["source"], meta={"gpus": [device_name]})
