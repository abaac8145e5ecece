#!/bin/sh
# Field-update figures, each the median of 3 runs:
#  1. bytes on the wire for a one-binary change in a ten-binary release,
#     against that binary's zstd size (target: at most 1.1x);
#  2. `deploy install` + switch time for a 100 MB release on local disk
#     (target: under 2 s).
# The wire figure uses `deploy update` with a stand-in for ssh that runs the
# remote command locally, so it counts the update protocol's own bytes
# (ssh adds its framing and encryption on top).
#
# Usage: scripts/bench-update.sh [WORKDIR]   (needs cargo, zstd)
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
work=${1:-$(mktemp -d /var/tmp/rtdeploy-bench-update.XXXXXX)}
mkdir -p "$work"
cargo build --release -q -p deploy --manifest-path "$root/Cargo.toml"
deploy=$target/release/deploy
echo "deploy: $deploy"
echo "work:   $work"

median() { sort -n | sed -n 2p; }
now_ns() { date +%s%N; }
field() { sed -n "s/.*\"$1\": *\([0-9.]*\).*/\1/p" | head -n 1; }

rm -f "$work/key" "$work/key.pub"
"$deploy" -q keygen --out "$work/key" >/dev/null
robot_yaml=$root/examples/dev.yaml

# A robot under a prefix, trusting the key, with its robot.yaml.
robot() {
    rm -rf "$1"
    mkdir -p "$1/etc/rtdeploy/keys"
    cp "$work/key.pub" "$1/etc/rtdeploy/keys/bench.pub"
    cp "$robot_yaml" "$1/etc/rtdeploy/robot.yaml"
}

# ssh stand-in: skip the options up to `--`, drop the destination, run the
# (quoted) remote command with sh, as sshd would.
cat >"$work/local-ssh" <<'SH'
#!/bin/sh
while [ "$1" != "--" ]; do shift; done
shift 2
exec sh -c "$1"
SH
chmod +x "$work/local-ssh"

# ---------------------------------------------------------------- 1. wire
# Ten real ELF programs from /usr/bin (200 KB - 4 MB, by name); the change
# replaces bin/b3 with another program: the 11th such program (small), then
# the deploy binary itself (large).
elves=$(find /usr/bin -maxdepth 1 -type f -size +200k -size -4M | sort | while read -r f; do
    [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = "177ELF" ] && echo "$f"
done | head -n 11)
bins=$(echo "$elves" | head -n 10)
eleventh=$(echo "$elves" | sed -n 11p)
[ -n "$eleventh" ] || { echo "need 11 ELF programs in /usr/bin" >&2; exit 2; }
rm -rf "$work/rel-a"
mkdir -p "$work/rel-a/bin"
i=0
for f in $bins; do cp "$f" "$work/rel-a/bin/b$i"; i=$((i + 1)); done
cp "$robot_yaml" "$work/rel-a/robot.yaml"
"$deploy" -q bundle --release "$work/rel-a" --version a --key "$work/key" --out "$work/a.bundle" >/dev/null
for new in "$eleventh" "$deploy"; do
    rm -rf "$work/rel-b"
    cp -a "$work/rel-a" "$work/rel-b"
    cp "$new" "$work/rel-b/bin/b3"
    "$deploy" -q bundle --release "$work/rel-b" --version b --key "$work/key" --out "$work/b.bundle" >/dev/null
    changed=$(stat -c %s "$work/rel-b/bin/b3")
    z3=$(zstd -q -3 -c "$work/rel-b/bin/b3" | wc -c)
    z9=$(zstd -q -9 -c "$work/rel-b/bin/b3" | wc -c)
    release_bytes=$(du -cb "$work/rel-b/bin" | tail -n 1 | cut -f1)
    wires=""
    for run in 1 2 3; do
        robot "$work/wire-robot"
        "$deploy" -q --json update --ssh "$work/local-ssh" --host bench --remote-deploy "$deploy" \
            --remote-prefix "$work/wire-robot" "$work/a.bundle" >/dev/null
        w=$("$deploy" -q --json update --ssh "$work/local-ssh" --host bench --remote-deploy "$deploy" \
            --remote-prefix "$work/wire-robot" "$work/b.bundle" | field bytes_on_wire)
        echo "  run $run: $w bytes on the wire"
        wires="$wires $w"
    done
    wire=$(echo "$wires" | tr ' ' '\n' | grep . | median)
    echo "one-binary change in a ten-binary release ($release_bytes bytes of binaries), b3 <- $new:"
    echo "  changed binary $changed bytes; zstd -3 $z3 bytes, zstd -9 $z9 bytes"
    echo "  bytes on the wire (median of 3): $wire"
    awk -v w="$wire" -v a="$z3" -v b="$z9" 'BEGIN { printf "  ratio: %.3fx of zstd -3, %.3fx of zstd -9 (target <= 1.1x)\n", w / a, w / b }'
done

# ---------------------------------------------------------------- 2. install
# 100 MB in ten 10 MB files cut from a stream of real programs (compresses
# like machine code); release d differs in every file.
mk100() {
    rm -rf "$1"
    mkdir -p "$1/bin"
    cp "$robot_yaml" "$1/robot.yaml"
    i=0
    while [ $i -lt 10 ]; do
        # shellcheck disable=SC2086
        { echo "$2 $i"; cat $bins $bins $bins $bins $bins; } | head -c 10000000 >"$1/bin/p$i"
        chmod 755 "$1/bin/p$i"
        i=$((i + 1))
    done
}
mk100 "$work/rel-c" c
mk100 "$work/rel-d" d
"$deploy" -q bundle --release "$work/rel-c" --version c --key "$work/key" --out "$work/c.bundle" >/dev/null
"$deploy" -q bundle --release "$work/rel-d" --version d --key "$work/key" --out "$work/d.bundle" >/dev/null
times=""
for run in 1 2 3; do
    robot "$work/disk-robot"
    "$deploy" -q --prefix "$work/disk-robot" install "$work/c.bundle" >/dev/null
    sync
    t0=$(now_ns)
    "$deploy" -q --prefix "$work/disk-robot" install "$work/d.bundle" >/dev/null
    t1=$(now_ns)
    ms=$(( (t1 - t0) / 1000000 ))
    echo "  run $run: $ms ms"
    times="$times $ms"
done
t=$(echo "$times" | tr ' ' '\n' | grep . | median)
echo "install + switch of a 100 MB release ($(stat -c %s "$work/d.bundle") byte bundle), median of 3: $t ms (target < 2000 ms)"
df -T "$work" | tail -n 1 | awk '{ print "  filesystem: " $2 " (" $1 ")" }'
