#!/usr/bin/env bash
# Every package the workspace builds for Linux (x86_64 and aarch64, normal,
# build and dev dependencies) must allow the workspace's rust-version, the
# rustc that cross-builds aarch64 (Debian trixie's). Packages that declare no
# rust-version are listed, not failed: nothing can be checked for them.
set -euo pipefail
cd "$(dirname "$0")/.."

msrv=$(sed -n 's/^rust-version *= *"\(.*\)"/\1/p' Cargo.toml | head -1)
[[ -n "$msrv" ]] || { echo "check-msrv: no rust-version in Cargo.toml" >&2; exit 1; }

status=0
# The workspace, and the Python extension beside it (its own workspace:
# controller/python, built by maturin).
for manifest in Cargo.toml controller/python/Cargo.toml; do
for target in x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu; do
    too_new=$(cargo metadata --manifest-path "$manifest" --format-version 1 --locked --filter-platform "$target" |
        jq -r --arg msrv "$msrv" '
            def v: split(".") | map(tonumber? // 0) | . + [0, 0, 0] | .[0:3];
            [.resolve.nodes[].id] as $ids
            | .packages[]
            | select(.id as $i | $ids | index($i))
            | select(.rust_version != null and (.rust_version | v) > ($msrv | v))
            | "\(.name) \(.version) needs Rust \(.rust_version)"')
    if [[ -n "$too_new" ]]; then
        echo "check-msrv: $manifest for $target: these need a newer Rust than $msrv:" >&2
        echo "$too_new" >&2
        status=1
    fi
done
done
((status == 0)) && echo "check-msrv: every dependency allows Rust $msrv (x86_64 and aarch64 Linux)"
exit $status
