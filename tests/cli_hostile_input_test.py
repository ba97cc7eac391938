"""Hostile input and faults from the command line: sizes that do not fit, device ids used as
labels, wrong JSON types, broken .npy headers, replicas that disagree, trailing slashes, integer
Partial data, and the crash-safety promise (a killed writer never leaves the output path without
a complete folder, and the next writer clears what it left). Every error must be one line on
standard error with a non-zero exit, naming the offending value; no output may appear.
Usage: cli_hostile_input_test.py MESHFLOW"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from checks import check, finish

meshflow = sys.argv[1]


def run(*args, timeout=120):
    return subprocess.run([meshflow, *args], capture_output=True, text=True, timeout=timeout)


def expect_error(args, needle, what=None):
    r = run(*args)
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 1, f"{what or args}: exit {r.returncode}, stderr {r.stderr!r}")
    check(len(lines) == 1, f"{what or args}: one line expected, got {r.stderr!r}")
    check(needle in r.stderr, f"{what or args}: {needle!r} not in {r.stderr!r}")
    check("Success" not in r.stderr and "json.exception" not in r.stderr and "vector" not in r.stderr,
          f"{what or args}: library text in {r.stderr!r}")
    check(len(r.stderr) < 400, f"{what or args}: message too long ({len(r.stderr)} chars)")
    return r


def layout_json(mesh_shape, devices, placements, shape, dtype="float32"):
    return {"mesh": {"shape": mesh_shape, "devices": devices, "names": []},
            "placements": placements, "shape": shape, "dtype": dtype}


rng = np.random.default_rng(11)
with tempfile.TemporaryDirectory() as tmp:
    # --- sizes: overflow-checked, never sized by a device id ---
    expect_error(["plan", "--mesh", "4", "--shape", "9223372036854775807", "--from", "S(0)", "--to", "R"],
                 "shape 9223372036854775807 of float32 is too large")
    expect_error(["plan", "--mesh", "4", "--shape", "4611686018427387904", "--from", "S(0)", "--to", "R"],
                 "is too large")
    expect_error(["plan", "--mesh", "4294967296", "--shape", "4", "--from", "R", "--to", "R"],
                 "mesh shape 4294967296 is too large: a mesh may hold at most 65536 devices")
    expect_error(["plan", "--mesh", "65536x65536", "--shape", "4", "--from", "R,R", "--to", "R,R"],
                 "mesh shape 65536x65536 is too large")
    r = run("plan", "--mesh", "1@2147483647", "--shape", "4", "--from", "R", "--to", "S(0)")
    check(r.returncode == 0, f"a large device id is a label: {r.stderr}")

    x = rng.standard_normal((13, 6)).astype(np.float32)
    np.save(f"{tmp}/x.npy", x)
    r = run("shard", "--input", f"{tmp}/x.npy", "--mesh", "1@2147483647", "--placements", "R",
            "--out", f"{tmp}/big_id")
    check(r.returncode == 0, f"shard onto device 2147483647: {r.stderr}")
    r = run("redistribute", "--in", f"{tmp}/big_id", "--to", "S(0)", "--to-mesh", "2@2147483646,7",
            "--out", f"{tmp}/big_id2")
    check(r.returncode == 0, f"redistribute between labels 2147483647 -> 2147483646,7: {r.stderr}")
    if r.returncode == 0:
        run("gather", "--in", f"{tmp}/big_id2", "--out", f"{tmp}/big_id.npy")
        check(np.load(f"{tmp}/big_id.npy").tobytes() == x.tobytes(), "labels round trip")
    expect_error(["redistribute", "--in", f"{tmp}/big_id", "--to", "S(0)", "--to-mesh", "600",
                  "--out", f"{tmp}/huge"], "more than the threads backend runs (512 at most)")
    check(not os.path.exists(f"{tmp}/huge"), "no output after a refused launch")

    # --- layout.json: strict types and ranges, every error names the field ---
    os.makedirs(f"{tmp}/bad", exist_ok=True)
    np.save(f"{tmp}/bad/rank0.npy", np.zeros((4,), np.float32))
    np.save(f"{tmp}/bad/rank1.npy", np.zeros((4,), np.float32))
    bad_layouts = [
        (layout_json([2 ** 32, 2 ** 32], [], ["R", "R"], [4]), '"mesh.shape[0]" must be an integer in [1, 65536]'),
        (layout_json([2.5], [0, 1], ["R"], [4]), '"mesh.shape[0]" must be an integer'),
        (layout_json([2], [0, True], ["R"], [4]), '"mesh.devices[1]" must be an integer'),
        (layout_json([2], [0, 1], ["R"], ["4"]), '"shape[0]" must be an integer'),
        (layout_json([2], [0, 2 ** 31], ["R"], [4]), '"mesh.devices[1]" must be an integer in [0, 2147483647]'),
        (layout_json([2], [0, 1], ["R"], [2 ** 64 - 1]), '"shape[0]" must be an integer'),
        (layout_json([2], [0, 1], [3], [4]), '"placements[0]" must be a string'),
        (layout_json([2], [0, 1], ["R"], [4], dtype=32), '"dtype" must be a string'),
        (layout_json([2], [0, 0], ["R"], [4]), "mesh lists device 0 twice"),
        (layout_json([2], [0], ["R"], [4]), "needs 2 devices but 1 were given"),
        (layout_json([2], [0, 1], ["P(avg)"], [4], dtype="int32"), '"P(avg)" needs a floating-point dtype'),
        ({"mesh": [2]}, '"mesh" must be an object'),
    ]
    for layout, needle in bad_layouts:
        with open(f"{tmp}/bad/layout.json", "w") as f:
            json.dump(layout, f)
        expect_error(["gather", "--in", f"{tmp}/bad", "--out", f"{tmp}/bad.npy"], needle, f"gather {layout}")
        expect_error(["redistribute", "--in", f"{tmp}/bad", "--to", "R", "--out", f"{tmp}/bad_out"], needle,
                     f"redistribute {layout}")
    check(not os.path.exists(f"{tmp}/bad.npy") and not os.path.exists(f"{tmp}/bad_out"), "no output from bad layouts")

    # --- machine file: errors name the field ---
    machine = {"links": {"shm": {"bandwidth_gbps": 4, "latency_us": 2}}, "default_link": "shm",
               "memcpy_gbps": 18, "collective_overhead_us": 40}
    for change, needle in [({"memcpy_gbps": "fast"}, '"memcpy_gbps" must be a number'),
                           ({"default_link": "nvlink"}, '"default_link" names "nvlink"'),
                           ({"links": {"shm": {"bandwidth_gbps": 0, "latency_us": 2}}}, '"links.shm.bandwidth_gbps" must be > 0'),
                           ({"collective_overhead_us": None}, '"collective_overhead_us" must be a number')]:
        m = dict(machine, **change)
        with open(f"{tmp}/machine.json", "w") as f:
            json.dump(m, f)
        expect_error(["plan", "--mesh", "4", "--shape", "8", "--from", "S(0)", "--to", "R", "--machine",
                      f"{tmp}/machine.json"], needle)
    with open(f"{tmp}/machine.json", "w") as f:
        f.write('{"links": ')
    expect_error(["plan", "--mesh", "4", "--shape", "8", "--from", "S(0)", "--to", "R", "--machine",
                  f"{tmp}/machine.json"], "machine.json: invalid JSON at byte")

    # --- .npy headers ---
    def npy_with_header(dict_text, data=b""):
        header = dict_text.encode()
        header += b" " * ((64 - (10 + len(header) + 1) % 64) % 64) + b"\n"
        return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + data

    for dict_text, needle in [
        ("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } trailing", "unexpected text after the dict"),
        ("{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }", "unsupported dtype descr '<f2'"),
        ("{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }", "unsupported dtype descr '|b1'"),
        ("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", "Fortran-order arrays are not supported"),
        ("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", "shape overflows"),
        ("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904,), }", "is too large"),
    ]:
        with open(f"{tmp}/h.npy", "wb") as f:
            f.write(npy_with_header(dict_text, b"\0" * 8))
        expect_error(["shard", "--input", f"{tmp}/h.npy", "--mesh", "2", "--placements", "S(0)",
                      "--out", f"{tmp}/h_out"], needle, dict_text)
    check(not os.path.exists(f"{tmp}/h_out"), "no output from bad headers")

    # --- replicas that disagree: the same check and message everywhere a folder is read ---
    r = run("shard", "--input", f"{tmp}/x.npy", "--mesh", "2x2", "--placements", "S(0),R", "--out", f"{tmp}/rep")
    check(r.returncode == 0, r.stderr)
    t = np.load(f"{tmp}/rep/rank3.npy")
    t[0, 0] += 1
    np.save(f"{tmp}/rep/rank3.npy", t)
    needle = "replicas disagree: devices 2 (rank2) and 3 (rank3) hold different values for box [7:13, 0:6]"
    expect_error(["gather", "--in", f"{tmp}/rep", "--out", f"{tmp}/rep.npy"], needle)
    expect_error(["redistribute", "--in", f"{tmp}/rep", "--to", "R,R", "--out", f"{tmp}/rep_out"], needle)
    check(not os.path.exists(f"{tmp}/rep.npy") and not os.path.exists(f"{tmp}/rep_out"), "no output after replicas disagree")

    # --- trailing slashes name the same folder ---
    r = run("shard", "--input", f"{tmp}/x.npy", "--mesh", "2x2", "--placements", "S(0),S(1)", "--out", f"{tmp}/slash/")
    check(r.returncode == 0 and os.path.isfile(f"{tmp}/slash/layout.json"), f"shard --out DIR/: {r.stderr}")
    r = run("redistribute", "--in", f"{tmp}/slash/", "--to", "R,S(0)", "--out", f"{tmp}/slash2/")
    check(r.returncode == 0 and os.path.isfile(f"{tmp}/slash2/layout.json"), f"redistribute --out DIR/: {r.stderr}")
    r = run("gather", "--in", f"{tmp}/slash2/", "--out", f"{tmp}/slash.npy")
    check(r.returncode == 0 and np.load(f"{tmp}/slash.npy").tobytes() == x.tobytes(), f"gather of DIR/: {r.stderr}")
    check(not [n for n in os.listdir(tmp) if "meshflow-tmp" in n], f"no staging left: {os.listdir(tmp)}")

    # --- integer Replicate -> Partial(sum) keeps every value ---
    ints = np.array([7, 5, 1, 3, -9], dtype=np.int64)
    np.save(f"{tmp}/ints.npy", ints)
    run("shard", "--input", f"{tmp}/ints.npy", "--mesh", "3", "--placements", "R", "--out", f"{tmp}/ints_r")
    r = run("redistribute", "--in", f"{tmp}/ints_r", "--to", "P(sum)", "--out", f"{tmp}/ints_p")
    check(r.returncode == 0, r.stderr)
    run("gather", "--in", f"{tmp}/ints_p", "--out", f"{tmp}/ints_back.npy")
    back = np.load(f"{tmp}/ints_back.npy")
    check(back.dtype == np.int64 and back.tolist() == [7, 5, 1, 3, -9], f"int64 R -> P(sum) gathered {back}")
    check(np.load(f"{tmp}/ints_p/rank1.npy").tolist() == [0] * 5, "devices after the first hold 0")
    expect_error(["redistribute", "--in", f"{tmp}/ints_r", "--to", "P(avg)", "--out", f"{tmp}/ints_avg"],
                 '"P(avg)" needs a floating-point dtype')

    # --- crash safety: kill a writer at many moments; the path always holds a complete folder ---
    big = rng.standard_normal((4096, 1024)).astype(np.float32)  # 16 MiB
    np.save(f"{tmp}/big.npy", big)
    out = f"{tmp}/crash"
    r = run("shard", "--input", f"{tmp}/x.npy", "--mesh", "2", "--placements", "S(0)", "--out", out)
    check(r.returncode == 0, r.stderr)
    start = time.monotonic()
    r = run("shard", "--input", f"{tmp}/big.npy", "--mesh", "2x2", "--placements", "S(1),S(0)", "--out", f"{tmp}/timing")
    duration = time.monotonic() - start
    kinds = set()
    for i in range(24):
        delay = duration * i / 20
        p = subprocess.Popen([meshflow, "shard", "--input", f"{tmp}/big.npy", "--mesh", "2x2", "--placements",
                              "S(1),S(0)", "--out", out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        g = run("gather", "--in", out, "--out", f"{tmp}/crash.npy")
        check(g.returncode == 0, f"after a kill at {delay:.3f}s the folder is complete: {g.stderr}")
        if g.returncode == 0:
            y = np.load(f"{tmp}/crash.npy")
            if y.shape == x.shape and y.tobytes() == x.tobytes():
                kinds.add("old")
            elif y.shape == big.shape and y.tobytes() == big.tobytes():
                kinds.add("new")
            else:
                check(False, f"after a kill at {delay:.3f}s the folder holds neither version")
        # Back to the old contents for the next round (clearing what the killed writer left).
        r = run("shard", "--input", f"{tmp}/x.npy", "--mesh", "2", "--placements", "S(0)", "--out", out)
        check(r.returncode == 0, r.stderr)
        leftovers = [n for n in os.listdir(tmp) if "meshflow-tmp" in n]
        check(not leftovers, f"the next writer cleared what the killed one left: {leftovers}")
    check("old" in kinds, f"some kills landed before the switch: {kinds}")

finish()
