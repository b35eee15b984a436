#!/usr/bin/env bash
# The exactness checks on emulated ARM64 CPUs (QEMU user mode on an x86-64 host): onnxruntime's 8-bit GEMMs,
# the native kernels and the library's own GEMM (QGemm: NEON smlal on every core, sdot where the model has the
# dot product) against numpy, and the bundled digits model's validate across the three backends; then QGemm's
# i8mm (smmla) path alone on QEMU's max core (no Cortex model of QEMU 7.2 has i8mm).
#
# Installs what it needs from scratch (apt: qemu-user, the aarch64 cross compiler, Debian's arm64 Python 3.11
# unpacked into a sysroot; pip: the cp311 aarch64 wheels), all cached under ~/.cache/ivit-arm so reruns only
# run the checks. No torch. Usage: tests/arm/run.sh [CPU model ...] (default: cortex-a72 cortex-a76);
# IVIT_ARM_I8MM=0 skips the i8mm step.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
cache=${IVIT_ARM_CACHE:-$HOME/.cache/ivit-arm}
sysroot=$cache/sysroot site=$cache/site
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(cortex-a72 cortex-a76)
mkdir -p "$cache"
t0=$(date +%s)

# 1. host packages: QEMU and the cross compiler (which Debian's arm64 sysconfig names, too)
if ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-g++ >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user g++-aarch64-linux-gnu >/dev/null
fi

# 2. the sysroot: Debian bookworm's arm64 python3.11 and the libraries it needs, unpacked (not installed)
if [ ! -x "$sysroot/usr/bin/python3.11" ]; then
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    dpkg --add-architecture arm64
    apt-get update -qq
  fi
  debs=$cache/debs
  mkdir -p "$debs"
  pkgs=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
           --no-enhances --no-pre-depends python3.11:arm64 libstdc++6:arm64 libgomp1:arm64 \
         | grep -E '^[a-z0-9].*:arm64$' | sort -u)
  (cd "$debs" && apt-get download -qq $pkgs 2>&1 | grep -v "^W:" || true)
  rm -rf "$sysroot.tmp" && mkdir -p "$sysroot.tmp"
  for d in "$debs"/*.deb; do dpkg -x "$d" "$sysroot.tmp"; done
  mv "$sysroot.tmp" "$sysroot"
fi

# 3. the cp311 aarch64 wheels (the runtime dependencies and pytest), unpacked onto the guest's PYTHONPATH
reqs=("numpy>=1.24" "onnx==1.23.*" "onnxruntime==1.31.*" "onnx-graphsurgeon>=0.5" "onnxruntime-extensions==0.15.2"
      "pytest>=8" "hypothesis>=6")
if [ "$(cat "$site/.done" 2>/dev/null)" != "${reqs[*]}" ]; then
  rm -rf "$site" "$cache/wheels" && mkdir -p "$site" "$cache/wheels"
  python3 -m pip download -q --only-binary=:all: --platform manylinux2014_aarch64 \
    --platform manylinux_2_28_aarch64 --python-version 3.11 --implementation cp -d "$cache/wheels" "${reqs[@]}" \
    2> >(grep -v "^WARNING: Location" >&2)
  for w in "$cache"/wheels/*.whl; do python3 -m zipfile -e "$w" "$site"; done
  echo "${reqs[*]}" >"$site/.done"
fi

# 4. this checkout as the installed package (setup.py's layout), and the native library built for aarch64
pkg=$cache/pkg
rm -rf "$pkg" && mkdir -p "$pkg"
cp -r ivit_onnx "$pkg/ivit_onnx"
for sub in passes opset models; do cp -r "$sub" "$pkg/ivit_onnx/$sub"; done
mkdir -p "$pkg/tests/engines" && cp tests/__init__.py "$pkg/tests/" && cp -r tests/opset "$pkg/tests/opset"
cp tests/engines/__init__.py tests/engines/test_patch_quantize.py "$pkg/tests/engines/"
find "$pkg" \( -name "*.so" -o -name __pycache__ \) -prune -exec rm -rf {} +
lib=$cache/_kernels_aarch64.so
# setup.py's own source list (its setup() runs only as __main__)
read -r -a src <<<"$(python3 -c 'import setup; print(" ".join(setup.SOURCES))')"
if [ ! -f "$lib" ] || [ -n "$(find opset/native -newer "$lib" -print -quit)" ] \
   || [ "$(cat "$lib.sources" 2>/dev/null)" != "${src[*]}" ]; then
  # setup.py's flags (portable: no -march on aarch64); every symbol resolved at link time
  aarch64-linux-gnu-g++ -std=c++17 -O3 -fwrapv -pthread -shared -fPIC -Wall -Wl,--no-undefined -o "$lib" \
    "${src[@]}"
  echo "${src[*]}" >"$lib.sources"
fi
t1=$(date +%s)
echo "arm64: setup $((t1 - t0)) s"

# 5. the checks, once per CPU model, each with an arm64 /proc/cpuinfo of that model (QEMU would show the
# host's x86 one, on which onnxruntime's CPU detection crashes)
status=0
# pytest on the guest, its summary lines prefixed with $2: fails where a test fails, or where the QGemm path of
# a feature the model has (HWCAP name in its cpuinfo) was skipped
guest_pytest() {
  local cpu=$1 label=$2 out features
  shift 2
  features=" $(grep -m1 '^Features' "$sysroot/proc/cpuinfo" | cut -d: -f2) "
  out=$(cd "$pkg" && "${guest[@]}" -m pytest -q -p no:cacheprovider -rfEs "$@" 2>&1) || status=1
  grep -E "^(SKIPPED|FAILED|ERROR)|passed|failed|error" <<<"$out" | sed "s/^/[$cpu] $label: /" || true
  for pair in neon:asimd dotprod:asimddp i8mm:i8mm; do
    if [[ $features == *" ${pair#*:} "* ]] && grep -q "lacks the ${pair%%:*} path" <<<"$out"; then
      echo "[$cpu] $label: FAILED: the ${pair%%:*} path was skipped on a core with ${pair#*:}"
      status=1
    fi
  done
}
for cpu in "${models[@]}"; do
  mkdir -p "$sysroot/proc"
  python3 tests/arm/cpuinfo.py "$cpu" >"$sysroot/proc/cpuinfo"
  t=$(date +%s)
  # GLIBC_TUNABLES: QEMU 7.2 loses guest heap pages when the heap grows into a host mapping (tests/qemu.py)
  python=(qemu-aarch64 -cpu "$cpu" -L "$sysroot" "$sysroot/usr/bin/python3.11")
  # IVIT_GUEST_PYTHON: how a test starts Python in a subprocess (the guest runs the host's qemu-aarch64)
  guest=(env PYTHONPATH="$pkg:$site" IVIT_NATIVE_LIB="$lib" GLIBC_TUNABLES=glibc.malloc.top_pad=1073741824
         IVIT_GUEST_PYTHON="${python[*]}" "${python[@]}")
  # the native kernels, QGemm and the fused ops against the numpy references (the project's own test files),
  # then the rest, whose compiled digits model must run its weight GEMMs as QGemm. The fused ops' tests run
  # plain sessions with the library, which refuses to register where onnxruntime's int8 x int8 GEMM wraps
  # (Cortex-A72: the artifact path's ivit.int8_gemms=0, which exactness.py checks, is the way there).
  fused=(tests/opset/test_native_fused.py tests/engines/test_patch_quantize.py)
  [ "$cpu" = cortex-a72 ] && fused=()
  before=$status
  guest_pytest "$cpu" "native kernels" tests/opset/test_native.py tests/opset/test_native_rows.py tests/opset/test_qgemm.py tests/opset/test_qgemm_add.py \
    tests/opset/test_qbatch.py "${fused[@]}"
  if [ "$status" = "$before" ]; then
    out=$("${guest[@]}" tests/arm/exactness.py --samples "${IVIT_ARM_SAMPLES:-32}" 2>&1) || status=1
    grep -v "^  \|^$\|^wrote\|^attach_functions\|^ivit_onnx.validate" <<<"$out" | sed "s/^/[$cpu] /" || true
    if ! grep -q "GEMM + Requantize pairs as the library's QGemm" <<<"$out"; then
      echo "[$cpu] FAIL compile: no weight GEMM ran as QGemm"
      status=1
    fi
  fi
  echo "arm64 $cpu: $(( $(date +%s) - t )) s"
done

# 6. QGemm's smmla path and the self-check's probe of it, on QEMU's max core (i8mm; pointer authentication,
# which only slows the emulation down, off)
if [ "${IVIT_ARM_I8MM:-1}" != 0 ]; then
  python3 tests/arm/cpuinfo.py max >"$sysroot/proc/cpuinfo"
  t=$(date +%s)
  python=(qemu-aarch64 -cpu max,pauth=off -L "$sysroot" "$sysroot/usr/bin/python3.11")
  guest=(env PYTHONPATH="$pkg:$site" IVIT_NATIVE_LIB="$lib" GLIBC_TUNABLES=glibc.malloc.top_pad=1073741824
         IVIT_GUEST_PYTHON="${python[*]}" "${python[@]}")
  guest_pytest max "QGemm i8mm" tests/opset/test_qgemm.py tests/opset/test_qgemm_add.py tests/opset/test_qbatch.py \
    -k "i8mm or self_check"
  echo "arm64 max (i8mm): $(( $(date +%s) - t )) s"
fi
exit $status
