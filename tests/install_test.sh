#!/usr/bin/env bash
# meshflow as a dependency of another project, three ways: `cmake --install` into a temporary
# prefix, then examples/consumer built against it with find_package(meshflow); the same program
# built with `pkg-config meshflow`; and an outer project that add_subdirectory()s the source
# tree (its tests off). Each consumer runs and must print "ok".
# Usage: install_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1
build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >/dev/null
test -x "$work/prefix/bin/meshflow"
test -f "$work/prefix/include/meshflow/core/tensor.h"

echo "== find_package(meshflow)"
cmake -S "$src/examples/consumer" -B "$work/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
"$work/consumer/consumer" | grep ": ok"

echo "== pkg-config meshflow"
export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
# shellcheck disable=SC2046
g++ -O1 "$src/examples/consumer/main.cc" -o "$work/pc_consumer" $(pkg-config --cflags --libs meshflow)
"$work/pc_consumer" | grep ": ok"

echo "== add_subdirectory(meshflow)"
mkdir -p "$work/outer"
cat >"$work/outer/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(outer LANGUAGES CXX)
add_subdirectory("$src" meshflow)
add_executable(consumer "$src/examples/consumer/main.cc")
target_link_libraries(consumer PRIVATE meshflow::meshflow)
CMAKE
# Unoptimised: this checks that the tree builds and links as a subproject, and the whole
# library compiles again here (at -O2 the longest test of the suite).
cmake -S "$work/outer" -B "$work/outer/build" -G Ninja -DCMAKE_BUILD_TYPE= >/dev/null
grep -q "MESHFLOW_BUILD_TESTS:BOOL=OFF" "$work/outer/build/CMakeCache.txt"
cmake --build "$work/outer/build" --target consumer >/dev/null
"$work/outer/build/consumer" | grep ": ok"
echo "1 passed, 0 failed"
