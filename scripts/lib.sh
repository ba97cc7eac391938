# Shared set-up for scripts/demo and scripts/test: installs the Debian packages meshflow needs
# (idempotent, silent when everything is present) and configures + builds one preset.

# Debian packages the build, the tests and the demo need.
MESHFLOW_PACKAGES=(
  cmake ninja-build g++ pkg-config
  libfmt-dev nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
  libopenblas-dev libopenmpi-dev openmpi-bin
  python3 python3-numpy
)

ensure_packages() {
  local missing=()
  for p in "${MESHFLOW_PACKAGES[@]}"; do
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

# Open MPI refuses to run as root unless told; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
