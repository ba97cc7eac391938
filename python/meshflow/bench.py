"""The Python module's benchmark: ``python3 -m meshflow.bench [--json]``.

Measures what a Python user pays on top of the C++ engine: the dispatch of an eager operator on
operands whose layouts were seen before (the operator's route is cached), and distribute_tensor /
full_tensor of large arrays against NumPy copying the same bytes (baseline ``numpy``, measured
interleaved with the case in the same run). Prints a table, or with ``--json`` the object every
``meshflow bench NAME --json`` prints (docs/benchmarks.md). Under mpi (``mpirun -n N``) every
process runs it, each one device, and only rank 0 prints.
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np

import meshflow as mf

# The target for dispatching one eager operator from Python.
DISPATCH_TARGET_S = 10e-6


def _parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _result(case, mesh, nbytes, case_s, baseline_s=None, floor_s=None, **extra):
    med = statistics.median(case_s)
    out = {"case": case, "backend": mf.backend(), "mesh": str(mesh), "devices": mesh.size(),
           "bytes": nbytes, "median_s": med, "min_s": min(case_s), "max_s": max(case_s),
           "floor_s": None, "vs_floor": None, "baseline": None, "vs_baseline": None}
    if floor_s:
        out["floor_s"] = statistics.median(floor_s)
        out["vs_floor"] = med / out["floor_s"]
    if baseline_s:
        out["baseline"] = "numpy"
        out["baseline_median_s"] = statistics.median(baseline_s)
        out["vs_baseline"] = med / out["baseline_median_s"]
    out.update(extra)
    return out


def _timed(fn):
    start = time.perf_counter()
    kept = fn()
    took = time.perf_counter() - start
    del kept  # freed outside the timing, as the baseline's copy is
    return took


def dispatch_cases(mesh, reps, calls):
    """Eager operators on an 8x8 float32 tensor sharded on mesh dim 0, per call; the baseline is
    the same operator on the same array in NumPy (one device, no dispatch)."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((8, 8)).astype(np.float32)
    b = rng.standard_normal((8, 8)).astype(np.float32)
    placements = [mf.Shard(0)] + [mf.Replicate()] * (mesh.ndim - 1)
    x = mf.distribute_tensor(a, mesh, placements)
    y = mf.distribute_tensor(b, mesh, placements)
    w = mf.distribute_tensor(b, mesh, [mf.Replicate()] * mesh.ndim)
    cases = [
        ("dispatch x + y", lambda: x + y, lambda: a + b),
        ("dispatch x * 2.0", lambda: x * 2.0, lambda: a * 2.0),
        ("dispatch relu(x)", lambda: mf.ops.relu(x), lambda: np.maximum(a, 0)),
        ("dispatch x @ w", lambda: x @ w, lambda: a @ b),
        ("dispatch sum(x, dims=[1])", lambda: mf.ops.sum(x, dims=[1]), lambda: a.sum(axis=1)),
    ]
    results = []
    for name, op, baseline in cases:
        for _ in range(calls // 10):  # routes cached, allocator warm
            op()
        case_s, base_s = [], []
        for _ in range(reps):
            start = time.perf_counter()
            for _ in range(calls):
                op()
            case_s.append((time.perf_counter() - start) / calls)
            start = time.perf_counter()
            for _ in range(calls):
                baseline()
            base_s.append((time.perf_counter() - start) / calls)
        results.append(_result(name, mesh, None, case_s, base_s, target_s=DISPATCH_TARGET_S))
    return results


def movement_cases(mesh, nbytes, reps):
    """distribute_tensor and full_tensor of a float32 array of `nbytes` for S(0), S(1) and R on
    mesh dim 0. Baseline: NumPy copying, from the array, the bytes the case writes in this
    process (every shard it holds for distribute, the array once for full_tensor) into new
    arrays, as ``a.copy()`` does. Floor: the same bytes copied into buffers allocated before the
    timing (``np.copyto``), so no page is faulted in."""
    side = max(1, int((nbytes // 4) ** 0.5))
    a = np.random.default_rng(2).random((side, nbytes // 4 // side), dtype=np.float32)
    flat = a.reshape(-1)
    sync = mf.distribute_tensor(np.zeros(1, dtype=np.float32), mesh)
    results = []
    rest = [mf.Replicate()] * (mesh.ndim - 1)
    for first in (mf.Shard(0), mf.Shard(1), mf.Replicate()):
        placements = [first] + rest
        text = ",".join(str(p) for p in placements)
        t = mf.distribute_tensor(a, mesh, placements)
        written = sum(s.nbytes for s in t.local_shards().values())
        pieces = []  # the element counts the case writes, at most the array's each
        left = written // a.itemsize
        while left > 0:
            pieces.append(min(left, flat.size))
            left -= pieces[-1]
        targets = [np.empty(n, dtype=a.dtype) for n in pieces]
        whole = np.empty_like(a)

        def copy_written():
            return [flat[:n].copy() for n in pieces]

        def copy_into_targets():
            for dst in targets:
                np.copyto(dst, flat[:dst.size])

        dist_s, dist_base, dist_floor = [], [], []
        full_s, full_base, full_floor = [], [], []
        for _ in range(reps):
            dist_s.append(_timed(lambda: mf.distribute_tensor(a, mesh, placements)))
            dist_base.append(_timed(copy_written))
            dist_floor.append(_timed(copy_into_targets))
            sync.full_tensor()  # under mpi: every process starts the collective together
            full_s.append(_timed(t.full_tensor))
            full_base.append(_timed(a.copy))
            full_floor.append(_timed(lambda: np.copyto(whole, a)))
        del t, targets, whole
        results.append(_result(f"distribute_tensor {text}", mesh, a.nbytes, dist_s, dist_base,
                               dist_floor, bytes_written=written))
        results.append(_result(f"full_tensor {text}", mesh, a.nbytes, full_s, full_base,
                               full_floor))
    return results


def memcpy_gbps(nbytes, reps):
    src = np.random.default_rng(3).random(max(1, nbytes // 8))
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(max(3, reps)):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return src.nbytes / statistics.median(times) / 1e9


def _format_s(s):
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.2f} us"
    return f"{s * 1e3:.3f} ms"


def _format_bytes(n):
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def to_table(report):
    header = ["case", "backend", "devices", "bytes", "median", "min-max", "floor", "vs_floor",
              "numpy", "vs_numpy", "target"]
    rows = [header]
    for r in report["results"]:
        rows.append([r["case"], r["backend"], str(r["devices"]), _format_bytes(r["bytes"]),
                     _format_s(r["median_s"]), f"{_format_s(r['min_s'])}-{_format_s(r['max_s'])}",
                     _format_s(r["floor_s"]),
                     "-" if r["vs_floor"] is None else f"{r['vs_floor']:.2f}x",
                     _format_s(r.get("baseline_median_s")),
                     "-" if r["vs_baseline"] is None else f"{r['vs_baseline']:.2f}x",
                     _format_s(r.get("target_s"))])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.append(f"memcpy (NumPy copyto, this run): {report['memcpy_gbps']:.1f} GB/s. numpy: NumPy "
                 "doing the same work on one array (dispatch: the same operator; distribute and "
                 "full_tensor: copying the bytes written into new arrays); floor: copying them into "
                 "buffers allocated beforehand. Both interleaved with the case.")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m meshflow.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--mesh", default="4", help='device mesh (default "4")')
    parser.add_argument("--sizes", default="256M",
                        help="comma-separated array sizes for distribute/full_tensor (default 256M)")
    parser.add_argument("--reps", type=int, default=7, help="timed repetitions per case (default 7)")
    parser.add_argument("--calls", type=int, default=2000,
                        help="operator calls per dispatch repetition (default 2000)")
    parser.add_argument("--json", action="store_true", help="print the JSON object")
    args = parser.parse_args(argv)
    if args.reps < 1 or args.calls < 1:
        parser.error("--reps and --calls must be at least 1")
    try:
        sizes = [_parse_size(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f'--sizes: "{args.sizes}" is not a list of sizes like 1M,256M')
    mesh = mf.DeviceMesh(args.mesh)
    results = dispatch_cases(mesh, args.reps, args.calls)
    for n in sizes:
        results += movement_cases(mesh, n, args.reps)
    report = {"benchmark": "python", "memcpy_gbps": memcpy_gbps(max(sizes, default=1 << 26), args.reps),
              "results": results}
    if mf.rank() == 0:
        print(json.dumps(report, indent=1) if args.json else to_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
