"""JoinReplay against the eager plan, end to end per batch, side by side in one run (GPU only).

    python -m tests.benchmark.bench_replay [--sizes 100k:10k,1M:100k] [--batches 30]

Each size gets ``--batches`` batches of the same counts (new points, the polygons shifted), every one answered
both ways in turns, the order flipped every batch: the eager plan as the benchmarks' end to end runs it (one
backend kept across batches, host arrays in, host arrays out, no stage marks), after the check of the points that
spatial_join makes, and JoinReplay (its graph captured
on the first batch, which is not timed). Host clock around each call; each answer is checked against shapely's on
the first and last batches (shapely's own time is not the point here). Medians with ~95% intervals; the ratio is
the median of the batches' eager/replay ratios.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import numpy as np  # noqa: E402

from app.kernel.datagen import make_points, make_polygons, shifted  # noqa: E402
from app.kernel.geometry import points_from_any  # noqa: E402
from app.kernel.join import JoinReplay  # noqa: E402
from app.kernel.join.plan import JoinInputs  # noqa: E402
from app.kernel.plan import get_plan_class  # noqa: E402
from app.runtime.device import select  # noqa: E402
from app.runtime.execute import backend_for  # noqa: E402
from app.runtime.nvtx import Nvtx  # noqa: E402
from app.runtime.recorder import Recorder  # noqa: E402
from app.runtime.stats import median_interval  # noqa: E402
from tests.benchmark.bench_join import ms, parse_size  # noqa: E402


def batches(n: int, g: int, count: int):
    polys = make_polygons(g, 16, 0)
    for k in range(count):
        p = shifted(polys, 0.01 * k, -0.01 * k)
        yield make_points(n, 100 + k), p


def run(n: int, g: int, count: int, version: str) -> dict:
    import cupy as cp

    plan = get_plan_class("join", version)({"points": n, "polygons": g})
    backend, _ = backend_for(plan, select("gpu"))
    bare = Recorder("gpu", cp, Nvtx(False, "join"), per_stage=False)
    replay = JoinReplay(version=version)

    def eager(pts, polys):
        xy, _ = points_from_any(pts)      # the check spatial_join and JoinReplay make of every batch's points
        out, _ = bare.run(plan, JoinInputs(xy, polys, "within"), backend)
        return backend.outputs_to_host(out)

    data = list(batches(n, g, count + 1))
    first = data.pop(0)
    for _ in range(3):                   # the eager backend's cold runs, and the replay's capture
        eager(*first)
    replay(*first)
    times = {"eager": [], "replay": []}
    ratios, checked = [], 0
    for i, (pts, polys) in enumerate(data):
        got = {}
        for name in (("eager", "replay") if i % 2 == 0 else ("replay", "eager")):
            fn = eager if name == "eager" else replay
            t0 = time.perf_counter()
            got[name] = fn(pts, polys)
            times[name].append(time.perf_counter() - t0)
        assert all(np.array_equal(a, b) for a, b in zip(got["eager"], got["replay"])), f"batch {i}: answers differ"
        if i in (0, len(data) - 1):
            check = plan.verify(JoinInputs(pts, polys, "within"), got["replay"])
            assert check["matches"], check
            checked += 1
        ratios.append(times["eager"][-1] / times["replay"][-1])
    return {"size": f"{version} {n:,} x {g:,}", "eager": statistics.median(times["eager"]),
            "eager_ci": median_interval(times["eager"]), "replay": statistics.median(times["replay"]),
            "replay_ci": median_interval(times["replay"]), "ratio": statistics.median(ratios),
            "ratio_ci": median_interval(ratios), "stats": dict(replay.stats), "checked": checked,
            "card": select("gpu").device_name}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100k:10k,1M:100k", help="POINTS:POLYGONS,...")
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--version", default="v4", choices=("v3", "v4", "v5"))
    args = ap.parse_args(argv)
    rows = []
    for size in args.sizes.split(","):
        n, g = (parse_size(x) for x in size.split(":"))
        r = run(n, g, args.batches, args.version)
        rows.append(r)
        lo, hi = r["ratio_ci"]
        print(f"{r['size']:>22}  eager end to end {ms(r['eager'], r['eager_ci'])}  JoinReplay "
              f"{ms(r['replay'], r['replay_ci'])}  eager/replay {r['ratio']:.2f}x [{lo:.2f}-{hi:.2f}]  "
              f"batches {r['stats']}  checked against shapely: {r['checked']}  [{r['card']}]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
