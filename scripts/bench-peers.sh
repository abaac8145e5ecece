#!/usr/bin/env bash
# Our runtime against iceoryx2 on this machine, in one run whose rounds
# alternate between the two: ping-pong round trip, one-way wake at a fixed
# period, publish cost with no subscriber waiting, throughput with one,
# two and four subscribers, for 8 B, 1 KiB, 64 KiB, 1 MiB and 4 MiB messages.
#
#   scripts/bench-peers.sh [--json] [any option of `peers --help`]
#
# Builds bench/peers (a Cargo workspace of its own: iceoryx2 0.10 needs
# Rust 1.89, newer than the main workspace's) in release mode, then runs
# it with the arguments given. CARGO_TARGET_DIR defaults to
# bench/peers/target. Run as root (or with CAP_SYS_NICE and a memlock
# limit) for SCHED_FIFO and locked memory; without them the run says what
# it fell back to. iceoryx2's build generates POSIX bindings with bindgen,
# which needs libclang (Debian: apt-get install libclang-dev).
#
# Exit status: 0 measured, 2 could not build or run.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
manifest="$here/bench/peers/Cargo.toml"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$here/bench/peers/target}"

if ! ldconfig -p 2>/dev/null | grep -q 'libclang\.so' \
    && ! ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 \
    && [ -z "${LIBCLANG_PATH:-}" ]; then
    echo "bench-peers: libclang not found (iceoryx2's build runs bindgen): apt-get install libclang-dev, or set LIBCLANG_PATH" >&2
    exit 2
fi

# Progress of the build goes to stderr; stdout carries only the results.
if ! cargo build --release --manifest-path "$manifest" >&2; then
    echo "bench-peers: building $manifest failed" >&2
    exit 2
fi
exec "$CARGO_TARGET_DIR/release/peers" "$@"
