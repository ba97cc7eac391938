"""Runs every command block fenced as `sh` in the README, docs/user_guide.md, docs/models.md and
the GPT example's README, in
order, as a user would type them from the repository root with the build in place (here: a
scratch folder whose `build/dev` is this build tree and whose `examples` is the repository's, so
the repository stays clean). Fails on the first command
that fails, printing it.
Usage: docs_commands_test.py SOURCE_DIR BUILD_DIR"""
import os
import re
import subprocess
import sys
import tempfile

source, build = sys.argv[1:3]
failures = 0
checked = 0
for doc in ["README.md", "docs/user_guide.md", "docs/models.md", "examples/models/gpt/README.md"]:
    text = open(os.path.join(source, doc)).read()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(f"{tmp}/build")
        os.symlink(build, f"{tmp}/build/dev")
        os.symlink(os.path.join(source, "examples"), f"{tmp}/examples")
        for i, block in enumerate(blocks):
            # `set -x` shows each command as it runs, so a failure names it.
            script = "set -euxo pipefail\n" + block
            r = subprocess.run(["bash", "-c", script], cwd=tmp, capture_output=True, text=True, timeout=300)
            checked += 1
            if r.returncode != 0:
                failures += 1
                print(f"FAILED: {doc} block {i + 1}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
print(f"{checked - failures} passed, {failures} failed")
sys.exit(1 if failures else 0)
