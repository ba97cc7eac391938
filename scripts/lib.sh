# Shared set-up for scripts/demo and scripts/test: installs the Debian packages meshflow needs
# (idempotent, silent when everything is present) and configures + builds one preset.

# Debian packages the build, the tests and the demo need.
MESHFLOW_PACKAGES=(
  cmake ninja-build g++ pkg-config
  libfmt-dev nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
  libopenblas-dev libsleef-dev libssl-dev libopenmpi-dev openmpi-bin libsentencepiece-dev
  python3 python3-numpy python3-dev python3-pytest pybind11-dev python3-sentencepiece
  clang libclang-rt-14-dev
)

# ensure_packages [EXTRA...]: installs what is missing of MESHFLOW_PACKAGES and EXTRA.
ensure_packages() {
  local missing=()
  for p in "${MESHFLOW_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing Debian packages: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# build_preset NAME: configures (once) and builds preset NAME.
build_preset() {
  local preset=$1
  if [ ! -f "build/$preset/build.ninja" ]; then
    cmake --preset "$preset" >/dev/null
  fi
  cmake --build --preset "$preset"
}

# run_fuzzers SECONDS: runs every libFuzzer harness of the `fuzz` preset for SECONDS each, from a
# copy of its corpus in fuzz/corpus/ (the repository's corpus is never written); fails on the
# first crash, leak or timeout, leaving the input that caused it in the printed folder.
run_fuzzers() {
  local seconds=$1 work
  work=$(mktemp -d)
  for harness in build/fuzz/fuzz/*_fuzz; do
    local name
    name=$(basename "$harness" _fuzz)
    mkdir -p "$work/$name"
    if ! "$harness" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$work/" -print_final_stats=1 "$work/$name" "fuzz/corpus/$name" \
        >"$work/$name.log" 2>&1; then
      tail -n 40 "$work/$name.log"
      echo "fuzzer $name failed; its input and log are in $work"
      return 1
    fi
    echo "fuzzer $name: $(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$name.log" | grep -o '[0-9]*$') inputs in ${seconds}s, no failure"
  done
  rm -rf "$work"
}

# Open MPI refuses to run as root unless told; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
