#!/bin/sh
# test_install.sh SRC BUILD CC SANITIZE - kiln installed and embedded, the
# three ways a project takes it (docs/api.md):
#   1. cmake --install BUILD into a fresh prefix; the files and the exported
#      symbols (kiln_* only) are checked
#   2. examples/embed.c built through pkg-config (libkiln.so; then libkiln.a
#      with --static, and libkiln.a linked into a shared object) and run
#   3. a separate CMake project with find_package(kiln) (kiln::kiln and
#      kiln::kiln_static), built and run
#   4. a CMake project that add_subdirectory()s the source tree (kiln built
#      again there: only what the example needs, -j2, no optimisation), run
# SANITIZE=ON (the ASan + UBSan suite): every program is built with the
# sanitizers too, and runs under them.
set -eu
SRC=$1 BUILD=$2 CC=${3:-cc} SAN=${4:-OFF}
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-test-install-XXXXXX")
trap 'rm -rf "$T"' EXIT
P=$T/prefix
FLAGS="-std=c11 -Wall -Wextra -Werror -pedantic"
SANFLAGS=""
[ "$SAN" = ON ] && SANFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -g"
step() { echo "== $*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

step "cmake --install into $P"
cmake --install "$BUILD" --prefix "$P" >/dev/null
LIB=$P/lib
[ -d "$P/lib64" ] && LIB=$P/lib64
for f in include/kiln.h bin/kiln; do [ -f "$P/$f" ] || fail "$f not installed"; done
for f in libkiln.a libkiln.so pkgconfig/kiln.pc cmake/kiln/kilnConfig.cmake cmake/kiln/kilnConfigVersion.cmake \
         cmake/kiln/kilnTargets.cmake cmake/kiln/kilnStaticTargets.cmake; do
  [ -e "$LIB/$f" ] || fail "lib/$f not installed"
done
SONAME=$(readelf -d "$LIB/libkiln.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ -n "$SONAME" ] && [ -e "$LIB/$SONAME" ] || fail "no SONAME, or $LIB/$SONAME missing"
echo "SONAME $SONAME"
OTHER=$(nm -D --defined-only "$LIB/libkiln.so" | awk '{print $3}' | grep -v '^kiln_' || true)
[ -z "$OTHER" ] || fail "libkiln.so exports more than kiln_*: $OTHER"
echo "exports $(nm -D --defined-only "$LIB/libkiln.so" | wc -l) symbols, all kiln_*"
"$P/bin/kiln" --version

step "pkg-config: libkiln.so"
export PKG_CONFIG_PATH=$LIB/pkgconfig
pkg-config --exists kiln || fail "pkg-config does not find kiln"
mkdir "$T/pc"
# shellcheck disable=SC2046
# the README's line as written: kiln.pc's rpath finds libkiln.so in a prefix outside the loader's path
$CC $FLAGS $SANFLAGS "$SRC/examples/embed.c" -o "$T/pc/embed" $(pkg-config --cflags --libs kiln)
"$T/pc/embed" "$T/pc/run" | tee "$T/pc/out1"
"$T/pc/embed" "$T/pc/run" >"$T/pc/out2"
grep -q "weights: miss" "$T/pc/out1" || fail "the first run was not a cache miss"
grep -q "weights: hit" "$T/pc/out2" || fail "the second run was not a cache hit"
[ -s "$T/pc/run/latents.png" ] && [ -s "$T/pc/run/latents.safetensors" ] || fail "no outputs"

step "pkg-config --static: libkiln.a, in a program and in a shared object"
STATIC_LIBS=$(pkg-config --static --libs kiln | sed "s|-lkiln\b|$LIB/libkiln.a|")
# shellcheck disable=SC2046,SC2086
$CC $FLAGS $SANFLAGS "$SRC/examples/embed.c" -o "$T/pc/embed-static" $(pkg-config --cflags kiln) $STATIC_LIBS
"$T/pc/embed-static" "$T/pc/run-static" >/dev/null
cat >"$T/pc/plugin.c" <<'C'
#include <kiln.h>
const char *plugin_version(void) { return kiln_last_error()[0] ? "" : kiln_version(); }
C
# shellcheck disable=SC2046,SC2086
$CC $FLAGS $SANFLAGS -shared -fPIC "$T/pc/plugin.c" -o "$T/pc/libplugin.so" $(pkg-config --cflags kiln) $STATIC_LIBS
echo "libkiln.a links into a shared object"

step "find_package(kiln)"
mkdir "$T/fp"
cp "$SRC/examples/embed.c" "$T/fp/"
cat >"$T/fp/CMakeLists.txt" <<'C'
cmake_minimum_required(VERSION 3.20)
project(embed_find_package C)
find_package(kiln 0.1 REQUIRED)
if(NOT TARGET kiln::kiln_static)
  message(FATAL_ERROR "kiln::kiln_static missing")
endif()
add_executable(embed embed.c)
target_link_libraries(embed PRIVATE kiln::kiln)
add_executable(embed_static embed.c)
target_link_libraries(embed_static PRIVATE kiln::kiln_static)
C
cmake -S "$T/fp" -B "$T/fp/build" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_C_COMPILER="$CC" \
      -DCMAKE_C_FLAGS="$SANFLAGS" -DCMAKE_EXE_LINKER_FLAGS="$SANFLAGS" >/dev/null
cmake --build "$T/fp/build" -j2 >/dev/null
"$T/fp/build/embed" "$T/fp/run" >/dev/null
"$T/fp/build/embed_static" "$T/fp/run-static" >/dev/null
echo "kiln::kiln and kiln::kiln_static built and ran"

step "add_subdirectory(kiln)"
mkdir "$T/sub"
cp "$SRC/examples/embed.c" "$T/sub/"
cat >"$T/sub/CMakeLists.txt" <<C
cmake_minimum_required(VERSION 3.20)
project(embed_add_subdirectory C)
add_subdirectory("$SRC" kiln)
add_executable(embed embed.c)
target_link_libraries(embed PRIVATE kiln::kiln)
C
cmake -S "$T/sub" -B "$T/sub/build" -DCMAKE_C_COMPILER="$CC" -DKILN_SANITIZE="$SAN" \
      -DCMAKE_C_FLAGS="$SANFLAGS" -DCMAKE_EXE_LINKER_FLAGS="$SANFLAGS" >/dev/null
cmake --build "$T/sub/build" -j2 --target embed >/dev/null
"$T/sub/build/embed" "$T/sub/run" >/dev/null
echo "add_subdirectory build ran"
echo "test_install: all passed"
