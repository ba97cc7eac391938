"""What the command-line test scripts share: the check-and-count helper (a failed check prints one
line naming it; finish() prints "N passed, M failed", the closing line CI reads, and exits
non-zero when any check failed) and running meshflow on threads or under mpirun."""
import subprocess
import sys

checked = 0
failures = 0


def check(cond, what):
    global checked, failures
    checked += 1
    if not cond:
        failures += 1
        print("FAILED:", what)


def finish():
    print(f"{checked - failures} passed, {failures} failed")
    sys.exit(1 if failures else 0)


def run_meshflow(meshflow, args, mpirun=None, ranks=None, timeout=120):
    """Runs `meshflow ARGS`, or with `ranks` under `MPIRUN -n RANKS` with --backend mpi; returns
    the completed process (text output captured)."""
    cmd = [meshflow, *args]
    if ranks:
        cmd = [mpirun, "--oversubscribe", "--allow-run-as-root", "-n", str(ranks), *cmd, "--backend", "mpi"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
