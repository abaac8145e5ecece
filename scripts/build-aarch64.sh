#!/usr/bin/env bash
# Cross-builds `deploy` and the example controllers (talker, listener) for
# aarch64-unknown-linux-gnu, the Jetson's target, with Debian trixie's
# rustc 1.85 (the workspace's rust-version), its `libstd-rust-dev:arm64`
# and `gcc-aarch64-linux-gnu` as the linker, offline from a `cargo vendor`
# tree. Nothing comes from outside the Debian archive and crates.io.
#
# Usage: scripts/build-aarch64.sh [--tests] [--bridge]   (as root on Debian 12)
#   --tests   also build the controller crate's test binaries
#             (channel and event-loop suites) for aarch64 and list them
#             in <out>/tests.txt
#   --bridge  also build rtdeploy-bridge (robot.yaml `bridge:`), which
#             images install beside deploy: Zenoh and its runtime, about
#             220 more crates, ring's C and assembly through
#             aarch64-linux-gnu-gcc (12 minutes cold on 2 cores)
#
# Cache ($RTDEPLOY_CACHE, default /var/cache/rtdeploy: outside the clone,
# which the chroot bind-mounts), each part keyed by content so a warm run
# reuses it and a change rebuilds only what it must:
#   aarch64-chroot-<key>/   the trixie build chroot (key: the package list
#                           and the suite)
#   vendor-<key>/           `cargo vendor` of Cargo.lock (key: Cargo.lock)
#   aarch64-target/         cargo's target directory (cargo decides what a
#                           source change rebuilds)
# Output: $RTDEPLOY_AARCH64_OUT (default <repo>/target-aarch64): deploy,
# talker, listener (stripped), with --bridge rtdeploy-bridge, and with
# --tests the test binaries.
#
# Exit status: 0 built, 2 a step failed (its output is printed).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${RTDEPLOY_CACHE:-/var/cache/rtdeploy}
case $CACHE/ in "$REPO"/*) die_early=1 ;; *) die_early=0 ;; esac
OUT=${RTDEPLOY_AARCH64_OUT:-$REPO/target-aarch64}
SUITE=trixie
MIRROR=${RTDEPLOY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
TRIPLE=aarch64-unknown-linux-gnu
WITH_TESTS=0
WITH_BRIDGE=0
for arg in "$@"; do
    case $arg in
    --tests) WITH_TESTS=1 ;;
    --bridge) WITH_BRIDGE=1 ;;
    *)
        echo "usage: $0 [--tests] [--bridge]" >&2
        exit 2
        ;;
    esac
done

log() { printf '[build-aarch64 %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() {
    log "$*"
    exit 2
}

# Everything the chroot builds with. `libc6-dev:arm64` comes with
# libstd-rust-dev:arm64's dependencies; it is named so the key says so.
PACKAGES=(rustc cargo libstd-rust-dev:arm64 libc6-dev:arm64 gcc-aarch64-linux-gnu ca-certificates)
key() { sha256sum | cut -c1-16; }
CHROOT_KEY=$(printf '%s\n' "$SUITE" "${PACKAGES[@]}" | key)
CHROOT=$CACHE/aarch64-chroot-$CHROOT_KEY
VENDOR_KEY=$(key <"$REPO/Cargo.lock")
VENDOR=$CACHE/vendor-$VENDOR_KEY
TARGET=$CACHE/aarch64-target
[ "$die_early" = 0 ] || die "RTDEPLOY_CACHE=$CACHE is inside the sources, which the build chroot bind-mounts: choose a directory outside them"
mkdir -p "$CACHE" "$OUT"

# 1. The build chroot (amd64 with arm64 as a foreign architecture: the
#    arm64 packages are libraries and are unpacked, not run, so no
#    emulation is needed).
if [ ! -e "$CHROOT/.complete" ]; then
    command -v mmdebstrap >/dev/null || {
        log "installing mmdebstrap"
        apt-get update -qq && apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
    } || die "cannot install mmdebstrap"
    log "making the $SUITE build chroot (${PACKAGES[*]})"
    rm -rf "$CHROOT" "$CHROOT.tmp"
    inc=$(IFS=,; echo "${PACKAGES[*]}")
    timeout 1800 mmdebstrap --quiet --variant=apt --architectures=amd64,arm64 \
        --include="$inc" "$SUITE" "$CHROOT.tmp" "$MIRROR" ||
        die "mmdebstrap failed"
    mv "$CHROOT.tmp" "$CHROOT"
    touch "$CHROOT/.complete"
    # Older chroots of another key are left for `rm -rf .cache` to take.
fi
chroot "$CHROOT" rustc --version >/dev/null || die "the chroot's rustc does not run"
log "$(chroot "$CHROOT" rustc --version)"

# 2. The vendored crates, with the host's cargo (network: crates.io).
if [ ! -e "$VENDOR/.complete" ]; then
    log "vendoring the crates of Cargo.lock"
    rm -rf "$VENDOR" "$VENDOR.tmp"
    (cd "$REPO" && cargo vendor --locked --versioned-dirs "$VENDOR.tmp" >/dev/null) ||
        die "cargo vendor failed"
    mv "$VENDOR.tmp" "$VENDOR"
    touch "$VENDOR/.complete"
fi

# 3. The build, in the chroot, offline. The sources, the vendor tree and the
#    target directory are bind-mounted; /proc for rustc.
mkdir -p "$CHROOT/src" "$CHROOT/vendor" "$CHROOT/target" "$CHROOT/proc" "$TARGET"
mounts=()
cleanup() {
    local m
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
        m=${mounts[i]}
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
}
trap cleanup EXIT
bind() {
    mount --bind "$1" "$2" && mounts+=("$2")
}
bind "$REPO" "$CHROOT/src" || die "cannot bind-mount the sources"
bind "$VENDOR" "$CHROOT/vendor" || die "cannot bind-mount the vendor tree"
bind "$TARGET" "$CHROOT/target" || die "cannot bind-mount the target directory"
mount -t proc proc "$CHROOT/proc" && mounts+=("$CHROOT/proc")

cat >"$CHROOT/cargo-config.toml" <<EOF
[source.crates-io]
replace-with = "vendored"
[source.vendored]
directory = "/vendor"
[target.$TRIPLE]
linker = "aarch64-linux-gnu-gcc"
[net]
offline = true
EOF

build() {
    chroot "$CHROOT" env -i PATH=/usr/bin:/bin HOME=/root \
        CARGO_HOME=/root/.cargo CARGO_TARGET_DIR=/target CARGO_TERM_COLOR=never \
        sh -c "mkdir -p /root/.cargo && cp /cargo-config.toml /root/.cargo/config.toml && cd /src && $*"
}
log "building deploy, talker and listener for $TRIPLE"
build "cargo build --release --locked --target $TRIPLE -p deploy --bin deploy && cargo build --release --locked --target $TRIPLE -p controller --example talker --example listener" ||
    die "the aarch64 build failed"
# Stripped (debug info off), as they go into images and bundles; the
# unstripped ones stay in the target directory.
build "mkdir -p /target/stripped && for f in deploy examples/talker examples/listener; do aarch64-linux-gnu-strip -o /target/stripped/\${f##*/} /target/$TRIPLE/release/\$f || exit 1; done" ||
    die "aarch64-linux-gnu-strip failed"
cp "$TARGET/stripped/deploy" "$TARGET/stripped/talker" "$TARGET/stripped/listener" "$OUT/"
BUILT=(deploy talker listener)
if [ "$WITH_BRIDGE" = 1 ]; then
    log "building rtdeploy-bridge for $TRIPLE"
    build "cargo build --release --locked --target $TRIPLE -p bridge --bin rtdeploy-bridge && aarch64-linux-gnu-strip -o /target/stripped/rtdeploy-bridge /target/$TRIPLE/release/rtdeploy-bridge" ||
        die "the aarch64 bridge build failed"
    cp "$TARGET/stripped/rtdeploy-bridge" "$OUT/"
    BUILT+=(rtdeploy-bridge)
fi

if [ "$WITH_TESTS" = 1 ]; then
    command -v jq >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends jq >/dev/null; } ||
        die "cannot install jq (it reads cargo's list of test binaries)"
    log "building the controller's test binaries for $TRIPLE"
    build "cargo test --release --locked --target $TRIPLE -p controller --features fault-injection --no-run --message-format=json" \
        >"$OUT/tests.json" || die "the aarch64 test build failed"
    rm -rf "$OUT/tests"
    mkdir -p "$OUT/tests"
    : >"$OUT/tests.txt"
    # The test targets' executables (cargo also lists the examples it
    # built for them).
    jq -r 'select(.reason == "compiler-artifact" and .profile.test and .executable != null) | .executable' \
        "$OUT/tests.json" | while read -r exe; do
        [ -n "$exe" ] || continue
        host=$TARGET${exe#/target}
        cp "$host" "$OUT/tests/"
        echo "${exe##*/}" >>"$OUT/tests.txt"
    done
fi

# An ELF of class 64 whose e_machine (bytes 18-19) is EM_AARCH64 (183).
for f in "${BUILT[@]}"; do
    [ "$(od -An -tx1 -N5 "$OUT/$f" | tr -d ' \n')" = 7f454c4602 ] &&
        [ "$(od -An -tu2 -j18 -N2 "$OUT/$f" | tr -d ' \n')" = 183 ] ||
        die "$OUT/$f is not an aarch64 ELF"
done
log "built: $(cd "$OUT" && ls -l "${BUILT[@]}" | awk '{print $5, $9}' | tr '\n' ' ')"
