#!/usr/bin/env bash
# The workspace's tests as a user with no privilege at all, the way a new user
# runs the README's `cargo test --workspace`: uid and gid 65534 (nobody), no
# supplementary groups, no capabilities, RLIMIT_RTPRIO 0 and RLIMIT_MEMLOCK
# 8 MiB (a Debian login's defaults), under the nice value this script runs
# at. The tests that need a privilege or a tool are #[ignore]d with their
# reason and stay ignored here; everything else must pass.
#
# Run as root (setpriv needs it to drop to 65534). The toolchain may live
# under root's home, out of nobody's reach, so the tests are built once here
# as the caller and only the built test executables run as nobody, each as
# `cargo test` would run it: from its package directory, with
# CARGO_MANIFEST_DIR and CARGO_PKG_NAME set. Paths the tests take from env!()
# (CARGO_MANIFEST_DIR, CARGO_BIN_EXE_deploy) are absolute paths into this
# clone, fixed at compile time: the clone's parent directories are made
# traversable (o+x, restored on exit) rather than the executables copied.
# Doc tests need rustdoc and are left to the root run.
#
# Arguments are passed to every test binary (a name filters; the counts
# of passed, failed and ignored tests are summed at the end).
#
# Exit status: 0 when every test binary passed, 1 when one failed (each
# failing binary is named at the end), 2 when the tests cannot be built or
# run.
set -euo pipefail
cd "$(dirname "$0")/.."
ws=$(pwd -P)

uid=65534
gid=65534

[[ $(id -u) == 0 ]] || { echo "test-unprivileged: run as root (setpriv drops to uid $uid)" >&2; exit 2; }
for tool in setpriv prlimit jq; do
    command -v "$tool" >/dev/null || { echo "test-unprivileged: $tool is missing" >&2; exit 2; }
done

# Under /tmp, which every user may traverse (root's TMPDIR need not be).
work=$(mktemp -d /tmp/rtdeploy-unprivileged.XXXXXX)
opened=()
cleanup() {
    for d in "${opened[@]}"; do chmod o-x "$d"; done
    rm -rf "$work"
}
trap cleanup EXIT

# HOME and TMPDIR: a writable directory of nobody's own (nobody's home in
# /etc/passwd does not exist).
mkdir -p "$work/home" "$work/tmp"
chown -R "$uid:$gid" "$work"
chmod 0755 "$work"

as_nobody() {
    prlimit --rtprio=0:0 --memlock=$((8 << 20)):$((8 << 20)) -- \
        setpriv --reuid="$uid" --regid="$gid" --clear-groups --inh-caps=-all --reset-env -- \
        env HOME="$work/home" TMPDIR="$work/tmp" "$@"
}

# Build once, no run; the JSON messages name every test executable and its
# package.
if ! cargo test --workspace --locked --no-run --message-format=json >"$work/build.json"; then
    # The compiler's messages went into the JSON.
    jq -r 'select(.reason == "compiler-message") | .message.rendered' "$work/build.json" >&2
    echo "test-unprivileged: the build failed" >&2
    exit 2
fi
jq -r 'select(.reason == "compiler-artifact" and .profile.test and .executable != null)
       | [.manifest_path, .package_id, .target.name, .target.kind[0], .executable] | @tsv' \
    "$work/build.json" | sort -u >"$work/tests.tsv"
[[ -s $work/tests.tsv ]] || { echo "test-unprivileged: the build named no test executable" >&2; exit 2; }

# Let nobody reach the clone: o+x on each parent directory that lacks it.
d=$ws
while [[ $d != / ]]; do
    if ! (($(stat -c '0%a' "$d") & 1)); then
        chmod o+x "$d"
        opened+=("$d")
        echo "test-unprivileged: opened $d to traversal for this run"
    fi
    d=$(dirname "$d")
done
first_exe=$(head -n1 "$work/tests.tsv" | cut -f5)
if ! as_nobody test -r "$ws/Cargo.toml" -a -x "$first_exe"; then
    echo "test-unprivileged: uid $uid cannot read $ws or run its test executables:" \
        "the clone needs o+rX (was it made under umask 077?)" >&2
    exit 2
fi

failed=()
count=0
tests=0
ignored=0
start=$SECONDS
while IFS=$'\t' read -r manifest package_id name kind exe; do
    pkg_dir=$(dirname "$manifest")
    pkg_name=$(basename "$pkg_dir")
    # package_id is `path+file:///…/<dir>#<name>@<version>` (or `…#<version>`
    # when the name is the directory's).
    if [[ $package_id =~ \#([A-Za-z0-9_-]+)@ ]]; then pkg_name=${BASH_REMATCH[1]}; fi
    printf '\n     Running %s %s (%s) as uid %s\n' "$kind" "$name" "${exe#"$ws"/}" "$uid"
    count=$((count + 1))
    # Counted from the listings (a test that runs this binary again for a
    # child process prints a summary line of its own).
    all=$("$exe" --list "$@" 2>/dev/null | grep -c ': test$' || true)
    ign=$("$exe" --list --ignored "$@" 2>/dev/null | grep -c ': test$' || true)
    tests=$((tests + all)); ignored=$((ignored + ign))
    if ! (cd "$pkg_dir" && as_nobody CARGO_MANIFEST_DIR="$pkg_dir" CARGO_PKG_NAME="$pkg_name" "$exe" "$@" </dev/null); then
        failed+=("$pkg_name $kind $name")
    fi
done <"$work/tests.tsv"

printf '\ntest-unprivileged: %d test executables as uid %s in %ds: %d tests, %d run, %d ignored\n' \
    "$count" "$uid" $((SECONDS - start)) "$tests" $((tests - ignored)) "$ignored"
if ((${#failed[@]})); then
    printf 'test-unprivileged: failed: %s\n' "${failed[@]}" >&2
    exit 1
fi
