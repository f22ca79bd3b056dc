"""Read the SQLite export of an Nsight Systems capture (``nsys export --type sqlite``) into a Timeline.

The export is NVIDIA's documented way to read a capture; the .nsys-rep itself is
never parsed here. Only the tables the wall-time analysis needs are read: NVTX
ranges, CUDA runtime/driver calls, kernels, memcpys, memsets and
synchronisation records. Enum values are decoded through the ENUM_* tables the
export carries, so a schema that renumbers them still reads correctly.

``strip_capture`` copies those tables (and nothing else) into a new file, with
no environment variables, paths, process list or host names: what goes into
test fixtures and profile folders.
"""
from __future__ import annotations

import os
import sqlite3

from app.analysis.timeline import Timeline
from app.errors import MalformedToolOutput

NEEDED = ("NVTX_EVENTS", "StringIds", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL",
          "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
          "ENUM_NSYS_EVENT_TYPE", "ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_MEM_KIND", "ENUM_CUPTI_SYNC_TYPE",
          "TARGET_INFO_GPU", "META_DATA_EXPORT")
COPY_KIND = {"HTOD": "HtoD", "DTOH": "DtoH", "DTOD": "DtoD", "HTOH": "HtoH", "PTOP": "PtoP",
             "HTOA": "HtoA", "ATOH": "AtoH", "ATOA": "AtoA", "ATOD": "AtoD", "DTOA": "DtoA"}
# Only these columns of TARGET_INFO_GPU survive stripping: what the GPU is, not where it sits.
GPU_COLUMNS = ("id", "name", "smCount", "l2CacheSize", "totalMemory", "memoryBandwidth", "clockRate",
               "computeMajor", "computeMinor")
EXPORT_KEYS = ("EXPORT_PRODUCT_NAME", "EXPORT_PRODUCT_VERSION", "EXPORT_SCHEMA_VERSION")


def _pid(global_id) -> int:
    """The process id inside nsys's global thread or process id (bits 24-47)."""
    return (int(global_id or 0) >> 24) & 0xFFFFFF


def _corr(corr, global_id) -> int:
    """A correlation id that is unique across the capture: each process numbers its own from 1, so in a
    capture of several processes the bare id would tie one process's calls to another's GPU ops."""
    return (_pid(global_id) << 32) | int(corr)


def _tables(con) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _enum(con, table: str, tables: set[str]) -> dict[int, str]:
    if table not in tables:
        return {}
    return {int(i): str(n) for i, n in con.execute(f"SELECT id, name FROM {table}")}


def _open(path: str, origin: str | None = None):
    """``origin``: what made the file, when this tool did (the profile's own `nsys export`): then the
    messages name that, not a temporary path, and their fix is not the one for a file the user passed."""
    if not os.path.isfile(path):
        if origin:
            raise MalformedToolOutput(f"{origin} wrote no SQLite file; re-run the profile, or pass --nsys PATH to "
                                      "another nsys")
        raise MalformedToolOutput(f"{path}: no such file; pass an nsys capture (.nsys-rep or .sqlite)")
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        tables = _tables(con)
    except sqlite3.DatabaseError as exc:
        raise _unreadable(origin, f"it is not an SQLite database ({exc})",
                          f"{path} is not an SQLite export of an nsys capture ({exc}); "
                          "make one with: nsys export --type sqlite REPORT.nsys-rep") from None
    return con, tables


def _unreadable(origin: str | None, why: str, message: str) -> MalformedToolOutput:
    """``message`` for a file the user passed; for one this tool's own export wrote, what wrote it and ``why``."""
    if origin:
        return MalformedToolOutput(f"{origin} wrote an SQLite file this tool cannot read: {why}; re-run the "
                                   "profile, or pass --nsys PATH to another nsys")
    return MalformedToolOutput(message)


def read_sqlite(path: str, origin: str | None = None) -> Timeline:
    """The Timeline of an nsys SQLite export. ``origin``: see _open."""
    con, tables = _open(path, origin)
    try:
        if "StringIds" not in tables:
            raise _unreadable(origin, "it has no StringIds table (not an nsys SQLite export)",
                              f"{path} has no StringIds table: not an nsys SQLite export")
        strings = dict(con.execute("SELECT id, value FROM StringIds"))
        ranges = _ranges(con, tables, strings)
        api = _api(con, tables, strings)
        ops = _kernels(con, tables, strings) + _memcpys(con, tables) + _memsets(con, tables)
        sync_corr = frozenset(_corr(c, p) for c, p in con.execute(
            "SELECT correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")) \
            if "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION" in tables else frozenset()
        meta = _meta(con, tables)
    except sqlite3.DatabaseError as exc:
        raise _unreadable(origin, f"unexpected nsys export schema ({exc})",
                          f"{path}: unexpected nsys export schema ({exc})") from None
    finally:
        con.close()
    return Timeline(ranges, api, ops, sync_corr, source="nsys sqlite export", meta=meta)


def _ranges(con, tables, strings) -> list[tuple]:
    if "NVTX_EVENTS" not in tables:
        return []
    types = {v: k for k, v in _enum(con, "ENUM_NSYS_EVENT_TYPE", tables).items()}
    push, startend = types.get("NvtxPushPopRange", 59), types.get("NvtxStartEndRange", 60)
    domain_create = types.get("NvtxDomainCreate", 75)
    # Domain ids are numbered per process: key them by (process, id), or one process's domain would be
    # named after another's.
    domains = {}
    rows = con.execute("SELECT start, end, eventType, text, textId, globalTid, domainId FROM NVTX_EVENTS "
                       "ORDER BY start").fetchall()
    for start, end, etype, text, text_id, tid, dom in rows:
        if etype == domain_create:
            domains[(_pid(tid), dom)] = text if text is not None else strings.get(text_id, "")
    out = []
    for start, end, etype, text, text_id, tid, dom in rows:
        if etype in (push, startend) and end is not None:
            name = text if text is not None else strings.get(text_id, "")
            domain = "" if not dom else domains.get((_pid(tid), dom), str(dom))
            out.append((name, domain, int(start), int(end), int(tid or 0)))
    return out


def _api(con, tables, strings) -> list[tuple]:
    if "CUPTI_ACTIVITY_KIND_RUNTIME" not in tables:
        return []
    return [(int(s), int(e), strings.get(n, str(n)), _corr(c, t), int(t or 0)) for s, e, n, c, t in con.execute(
        "SELECT start, end, nameId, correlationId, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME")]


def _kernels(con, tables, strings) -> list[tuple]:
    if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:
        return []
    return [(int(s), int(e), "kernel", strings.get(short, strings.get(dem, "?")), _corr(c, p), int(st), int(dev), 0,
             "", "") for s, e, dem, short, c, st, dev, p in con.execute(
                "SELECT start, end, demangledName, shortName, correlationId, streamId, deviceId, globalPid "
                "FROM CUPTI_ACTIVITY_KIND_KERNEL")]


def _memcpys(con, tables) -> list[tuple]:
    if "CUPTI_ACTIVITY_KIND_MEMCPY" not in tables:
        return []
    oper = _enum(con, "ENUM_CUDA_MEMCPY_OPER", tables)
    kind = _enum(con, "ENUM_CUDA_MEM_KIND", tables)
    out = []
    for s, e, c, st, dev, nbytes, ck, src, dst, p in con.execute(
            "SELECT start, end, correlationId, streamId, deviceId, bytes, copyKind, srcKind, dstKind, globalPid "
            "FROM CUPTI_ACTIVITY_KIND_MEMCPY"):
        direction = COPY_KIND.get(oper.get(ck, "").rsplit("_", 1)[-1], "other")
        host_side = src if direction.startswith("H") else dst if direction.endswith("H") else None
        host_mem = _mem_kind(kind.get(host_side, "")) if host_side is not None else ""
        out.append((int(s), int(e), "memcpy", f"memcpy {direction}", _corr(c, p), int(st), int(dev), int(nbytes or 0),
                    direction, host_mem))
    return out


def _mem_kind(name: str) -> str:
    name = name.upper()
    return "pageable" if "PAGEABLE" in name else "pinned" if "PINNED" in name else name.rsplit("_", 1)[-1].lower()


def _memsets(con, tables) -> list[tuple]:
    if "CUPTI_ACTIVITY_KIND_MEMSET" not in tables:
        return []
    return [(int(s), int(e), "memset", "memset", _corr(c, p), int(st), int(dev), int(nbytes or 0), "", "")
            for s, e, c, st, dev, nbytes, p in con.execute(
                "SELECT start, end, correlationId, streamId, deviceId, bytes, globalPid FROM CUPTI_ACTIVITY_KIND_MEMSET")]


def _meta(con, tables) -> dict:
    meta = {}
    if "TARGET_INFO_GPU" in tables:
        names = [r[0] for r in con.execute("SELECT name FROM TARGET_INFO_GPU")]
        meta["gpus"] = names
    if "META_DATA_EXPORT" in tables:
        kv = dict(con.execute("SELECT name, value FROM META_DATA_EXPORT"))
        meta["nsys_version"] = kv.get("EXPORT_PRODUCT_VERSION")
        meta["export_schema"] = kv.get("EXPORT_SCHEMA_VERSION")
    return meta


def strip_capture(src: str, dst: str) -> None:
    """Copy the analysis tables of ``src`` into a new SQLite file ``dst``, without what identifies the
    machine or the user: no environment, command line, paths, process list, host name or GPU UUID.
    Strings are kept only where a kept row refers to them (range, API and kernel names)."""
    con, tables = _open(src)
    if os.path.exists(dst):
        os.remove(dst)
    out = sqlite3.connect(dst)
    try:
        for table in NEEDED:
            if table not in tables or table in ("StringIds", "TARGET_INFO_GPU", "META_DATA_EXPORT"):
                continue
            _copy_table(con, out, table)
        if "TARGET_INFO_GPU" in tables:
            cols = [c for c in GPU_COLUMNS if c in _columns(con, "TARGET_INFO_GPU")]
            _copy_table(con, out, "TARGET_INFO_GPU", cols)
        if "META_DATA_EXPORT" in tables:
            _copy_table(con, out, "META_DATA_EXPORT", where="name IN (%s)" % ",".join(f"'{k}'" for k in EXPORT_KEYS))
        used = set()
        for table, cols in (("NVTX_EVENTS", ("textId",)), ("CUPTI_ACTIVITY_KIND_RUNTIME", ("nameId",)),
                            ("CUPTI_ACTIVITY_KIND_KERNEL", ("demangledName", "shortName", "mangledName"))):
            if table in tables:
                for col in cols:
                    used |= {r[0] for r in con.execute(f"SELECT DISTINCT {col} FROM {table}") if r[0] is not None}
        out.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
        out.executemany("INSERT INTO StringIds VALUES (?, ?)",
                        [(i, v) for i, v in con.execute("SELECT id, value FROM StringIds") if i in used])
        out.commit()
        out.execute("VACUUM")
    finally:
        out.close()
        con.close()


def _columns(con, table) -> list[str]:
    return [r[1] for r in con.execute(f"PRAGMA table_info({table})")]


def _copy_table(con, out, table, cols=None, where=None) -> None:
    cols = cols or _columns(con, table)
    out.execute(f"CREATE TABLE {table} ({', '.join(cols)})")
    rows = con.execute(f"SELECT {', '.join(cols)} FROM {table}" + (f" WHERE {where}" if where else ""))
    out.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(cols))})", rows)
