#!/usr/bin/env bash
# Throughput of `deploy image --format tar.zst` against the classic
# reproducible pipeline `tar --sort=name ... | zstd -T0` on the same tree,
# median of 3 runs each (after one warm-up run each, so both read from the
# page cache), side by side; with --rss also the peak RSS of `deploy image`
# (GNU time) for the tree as a directory base and as a .tar.zst base.
#
#   scripts/bench-image.sh [--deploy PATH] [--size-mb N] [--work DIR] [--rss] [--json] [--generate-only]
#
# Defaults: target/release/deploy, a 1024 MB generated tree, /var/tmp/rtdeploy-bench.
# --json: the figures as one JSON object on stdout, the table on stderr.
#
# Both sides archive the same bytes: the image's own additions (the
# release, the configuration, and a small stand-in for the deploy binary)
# are a few KiB. The image would otherwise carry the deploy binary that
# runs the benchmark, 57 MB with debug information, which the reference
# does not archive and which costs more to compress than the whole of a
# 256 MB tree. The archived bytes of both outputs are printed.
# The tree is a root filesystem shape (etc/, usr/...) of large, medium and
# small files, half incompressible (like firmware and compressed assets),
# half text-like.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
deploy="$here/target/release/deploy"
size_mb=1024
work=/var/tmp/rtdeploy-bench
rss=0
json=0
generate_only=0
while [ $# -gt 0 ]; do
    case "$1" in
        --deploy) deploy=$2; shift 2 ;;
        --size-mb) size_mb=$2; shift 2 ;;
        --work) work=$2; shift 2 ;;
        --rss) rss=1; shift ;;
        --json) json=1; shift ;;
        --generate-only) generate_only=1; shift ;;
        *) echo "usage: $0 [--deploy PATH] [--size-mb N] [--work DIR] [--rss] [--json] [--generate-only]" >&2; exit 2 ;;
    esac
done
for tool in tar zstd; do
    command -v "$tool" >/dev/null || { echo "bench-image: $tool not found" >&2; exit 2; }
done

tree="$work/tree-${size_mb}m"
epoch=1700000000
mkdir -p "$work"

generate() {
    # `yes | head` ends `yes` with SIGPIPE: not a failure here.
    set +o pipefail
    local t="$tree.partial"
    rm -rf "$t"
    mkdir -p "$t/etc" "$t/usr/bin" "$t/usr/lib/firmware" "$t/usr/share/doc" "$t/var/log"
    echo "bench" > "$t/etc/hostname"
    local pool="$work/pool.bin"
    [ -f "$pool" ] || head -c $((64 << 20)) /dev/urandom > "$pool"
    # Budget: 50% large (8 MiB), 40% medium (256 KiB), 10% small (4 KiB).
    local large=$((size_mb * 50 / 100 / 8)) medium=$((size_mb * 40 / 100 * 4)) small=$((size_mb * 10 / 100 * 256))
    local line="Nov 29 12:00:00 tegra kernel: [ 1.234567] tegra-xudc 3550000.usb: EP 1 (type: intr, dir: in) enabled"
    local text=""
    while [ ${#text} -lt 4096 ]; do text+="$line"$'\n'; done
    text=${text:0:4096}
    for i in $(seq 1 "$large"); do
        if [ $((i % 2)) -eq 0 ]; then
            tail -c +$(( (i * 7919) % (56 << 20) + 1 )) "$pool" | head -c $((8 << 20)) > "$t/usr/lib/firmware/blob$i.bin"
        else
            yes "$line $i" | head -c $((8 << 20)) > "$t/var/log/log$i.txt"
        fi
    done
    for i in $(seq 1 "$medium"); do
        d="$t/usr/lib/lib$((i % 64))"
        mkdir -p "$d"
        if [ $((i % 2)) -eq 0 ]; then
            tail -c +$(( (i * 104729) % (60 << 20) + 1 )) "$pool" | head -c $((256 << 10)) > "$d/m$i.so"
        else
            yes "$line $i" | head -c $((256 << 10)) > "$d/m$i.txt"
        fi
    done
    for i in $(seq 1 "$small"); do
        d="$t/usr/share/doc/pkg$((i % 500))"
        [ -d "$d" ] || mkdir -p "$d"
        printf '%s%d\n' "$text" "$i" > "$d/f$i"
    done
    mv "$t" "$tree"
    set -o pipefail
}

if [ ! -d "$tree" ]; then
    echo "generating a ${size_mb} MB tree in $tree ..." >&2
    generate
fi
[ "$generate_only" = 1 ] && exit 0
[ -x "$deploy" ] || { echo "bench-image: $deploy not found (cargo build --release -p deploy)" >&2; exit 2; }
bytes=$(du -sb --apparent-size "$tree" | cut -f1)

# Inputs for deploy image: the QEMU example's release (two programs) and
# a stand-in for the deploy binary the image carries: each a static
# x86_64 ELF header (what deploy image checks of a program) and a name.
elf_x86_64() {
    printf '\177ELF\002\001\001'; printf '\000%.0s' $(seq 9)
    printf '\002\000\076\000\001\000\000\000'; printf '\000%.0s' $(seq 28)
    printf '\100\000'; printf '\000%.0s' $(seq 10)
    printf '%s\n' "$1"
}
rel="$work/release"
mkdir -p "$rel/bin"
for p in talker listener; do elf_x86_64 "$p" > "$rel/bin/$p"; chmod 755 "$rel/bin/$p"; done
standin="$work/deploy-standin"
elf_x86_64 deploy > "$standin"; chmod 755 "$standin"
cfg="$here/examples/qemu.yaml"
# With --json the table goes to stderr: stdout holds the JSON alone.
if [ "$json" = 1 ]; then exec 3>&1 1>&2; fi

now() { date +%s.%N; }
run_ref() {
    tar --sort=name --format=gnu --numeric-owner --mtime=@$epoch --clamp-mtime -C "$tree" -cf - . \
        | zstd -T0 -3 -q -f -o "$work/ref.tar.zst"
}
run_deploy() {
    "$deploy" -q -c "$cfg" image --base "$tree" --release "$rel" --deploy-binary "$standin" \
        --out "$work/deploy.tar.zst" --format tar.zst --force --source-date-epoch $epoch >/dev/null
}
# Wall seconds, and CPU seconds (user + system, children included) in
# $work/cpu: on a shared machine CPU time is the steadier figure.
time_of() {
    local t0 t1 c0 c1
    times > "$work/times"; c0=$(cpu_of "$work/times")
    t0=$(now); "$1"; t1=$(now)
    times > "$work/times"; c1=$(cpu_of "$work/times")
    awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.3f\n", b - a }' >> "$work/cpu.$1"
    echo "$t0 $t1" | awk '{printf "%.3f\n", $2 - $1}'
}
cpu_of() {
    # `times` (run in this shell, not a subshell): shell user/sys, then
    # children user/sys, as XmY.YYYs.
    awk 'NR == 2 { split($1, u, "m"); split($2, s, "m"); printf "%.3f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$1"
}
median() { sort -n | sed -n 2p; }

run_ref; run_deploy  # warm-up: page cache, binaries
rm -f "$work/cpu.run_ref" "$work/cpu.run_deploy"
ref_times=(); dep_times=()
for i in 1 2 3; do
    # Not in $(...): a subshell's `times` would not see the children.
    time_of run_ref > "$work/t"; ref_times+=("$(cat "$work/t")")
    time_of run_deploy > "$work/t"; dep_times+=("$(cat "$work/t")")
done
ref_cpu=$(median < "$work/cpu.run_ref")
dep_cpu=$(median < "$work/cpu.run_deploy")
ref_med=$(printf '%s\n' "${ref_times[@]}" | median)
dep_med=$(printf '%s\n' "${dep_times[@]}" | median)
mbs() { awk -v b="$bytes" -v t="$1" 'BEGIN { printf "%.0f", b / t / 1048576 }'; }

entries=$(find "$tree" | wc -l)
load=$(cut -d' ' -f1-3 /proc/loadavg)
# The reference's zstd version matters: 1.5.7 (deploy's, through the zstd
# crate) splits blocks before compressing them, 1.5.4 (Debian 12's) does
# not, and the splitting costs CPU time at level 3.
zstd_version=$(zstd --version | grep -o 'v[0-9][0-9.]*' | head -1)
echo "tree: $tree, $((bytes >> 20)) MiB, $entries entries, $(nproc) CPUs, load $load, reference zstd $zstd_version"
printf '%-36s %-24s %9s %8s %9s %9s\n' "" "wall runs (s)" "median s" "MiB/s" "CPU s" "MiB/CPU-s"
printf '%-36s %-24s %9s %8s %9s %9s\n' "tar --sort=name ... | zstd -T0 -3" "${ref_times[*]}" "$ref_med" "$(mbs "$ref_med")" "$ref_cpu" "$(mbs "$ref_cpu")"
printf '%-36s %-24s %9s %8s %9s %9s\n' "deploy image --format tar.zst" "${dep_times[*]}" "$dep_med" "$(mbs "$dep_med")" "$dep_cpu" "$(mbs "$dep_cpu")"
# Throughput ratios: the reference's time over ours, wall-clock and CPU
# (so 1.10x per CPU second: we spend 1/1.10 of its CPU time per byte).
ratio_wall=$(awk -v r="$ref_med" -v d="$dep_med" 'BEGIN { printf "%.2f", r / d }')
ratio_cpu=$(awk -v r="$ref_cpu" -v d="$dep_cpu" 'BEGIN { printf "%.2f", r / d }')
echo "deploy image / reference: ${ratio_wall}x wall-clock throughput, ${ratio_cpu}x per CPU second (target >= 1.00x wall-clock)"
ref_size=$(stat -c %s "$work/ref.tar.zst"); dep_size=$(stat -c %s "$work/deploy.tar.zst")
ref_tar=$(zstd -dc "$work/ref.tar.zst" | wc -c); dep_tar=$(zstd -dc "$work/deploy.tar.zst" | wc -c)
printf 'output sizes: reference %s bytes (%s archived), deploy image %s bytes (%s archived)\n' \
    "$ref_size" "$ref_tar" "$dep_size" "$dep_tar"

if [ "$rss" = 1 ]; then
    [ -x /usr/bin/time ] || { echo "bench-image: /usr/bin/time (Debian package time) needed for --rss" >&2; exit 2; }
    peak() { /usr/bin/time -v "$@" 2>&1 >/dev/null | awk -F: '/Maximum resident/ { gsub(/ /, "", $2); print $2 }'; }
    echo "peak RSS of deploy image (KiB), $((bytes >> 20)) MiB base:"
    rss_dir=$(peak "$deploy" -q -c "$cfg" image --base "$tree" --release "$rel" --deploy-binary "$standin" --out "$work/rss.tar.zst" --force --source-date-epoch $epoch)
    echo "  directory base -> tar.zst: $rss_dir"
    [ -f "$work/base.tar.zst" ] || cp "$work/ref.tar.zst" "$work/base.tar.zst"
    rss_tar=$(peak "$deploy" -q -c "$cfg" image --base "$work/base.tar.zst" --release "$rel" --deploy-binary "$standin" --out "$work/rss2.tar.zst" --force --source-date-epoch $epoch)
    echo "  tar.zst base  -> tar.zst: $rss_tar"
    rss_cpio=$(peak "$deploy" -q -c "$cfg" image --base "$tree" --release "$rel" --deploy-binary "$standin" --out "$work/rss3.cpio.gz" --force --source-date-epoch $epoch)
    echo "  directory base -> cpio.gz: $rss_cpio"
    rm -f "$work"/rss*.tar.zst "$work"/rss*.cpio.gz "$work"/rss*.json
fi

if [ "$json" = 1 ]; then
    runs() { local IFS=,; echo "[$*]"; }
    side() {  # runs median cpu size archived
        printf '{"wall_runs_s": %s, "wall_median_s": %s, "mib_per_s": %s, "cpu_median_s": %s, "mib_per_cpu_s": %s, "bytes": %s, "archived_bytes": %s}' \
            "$(runs $1)" "$2" "$(mbs "$2")" "$3" "$(mbs "$3")" "$4" "$5"
    }
    rss_json=null
    [ "$rss" = 1 ] && rss_json=$(printf '{"dir_to_tar_zst": %s, "tar_zst_to_tar_zst": %s, "dir_to_cpio_gz": %s}' "$rss_dir" "$rss_tar" "$rss_cpio")
    printf '{"tree": "%s", "tree_bytes": %s, "entries": %s, "cpus": %s, "load": "%s", "reference_zstd": "%s", "reference": %s, "deploy_image": %s, "ratio_wall": %s, "ratio_cpu": %s, "peak_rss_kib": %s}\n' \
        "$tree" "$bytes" "$entries" "$(nproc)" "$load" "$zstd_version" \
        "$(side "${ref_times[*]}" "$ref_med" "$ref_cpu" "$ref_size" "$ref_tar")" \
        "$(side "${dep_times[*]}" "$dep_med" "$dep_cpu" "$dep_size" "$dep_tar")" \
        "$ratio_wall" "$ratio_cpu" "$rss_json" >&3
fi
