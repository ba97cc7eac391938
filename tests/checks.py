"""The check-and-count helper the command-line test scripts share: a failed check prints one line
naming it; finish() prints "N passed, M failed" (the closing line CI reads) and exits non-zero
when any check failed."""
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
