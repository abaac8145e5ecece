#!/usr/bin/env bash
# Runs the README's commands, so that the README stays true: every fenced
# block whose info string is `sh` and a mark, in the order they appear, in
# one bash (`set -euo pipefail`; a directory or variable one block makes
# is there for the next), from the clone's top directory.
#
# Marks (after `sh`, which GitHub shows as the language):
#   tour   run, as whoever runs this script
#   ci     a command CI runs as a step of its own (the test commands):
#          run only with --ci
#   root   run only as root (CI's root step); listed as not run otherwise
#   board  needs a Jetson board or a network download: never run, listed
# A block without a mark (`sh` alone) is an example inside prose and is
# not run; --list shows what would run.
#
# Usage: scripts/readme-commands.sh [--ci] [--list] [README]
# Exit status: 0 every block run passed; 1 one failed (named, with its
# output); 2 the README has no tour block or a mark this script does not
# know.
set -euo pipefail
cd "$(dirname "$0")/.."

with_ci=0
list=0
readme=README.md
for a in "$@"; do
    case $a in
        --ci) with_ci=1 ;;
        --list) list=1 ;;
        -*) echo "readme-commands: unknown option $a" >&2; exit 2 ;;
        *) readme=$a ;;
    esac
done
root=0
[[ $(id -u) == 0 ]] && root=1

# Split the README into blocks: blocks/NNN.<mark>.sh, with the line each
# starts on.
work=$(mktemp -d "${TMPDIR:-/tmp}/rtdeploy-readme.XXXXXX")
trap 'rm -rf "$work"' EXIT
awk -v dir="$work" '
    /^```sh( |$)/ && !inside {
        inside = 1
        mark = $2
        if (mark == "") mark = "prose"
        n++
        file = sprintf("%s/%03d.%s.sh", dir, n, mark)
        printf "# README.md line %d\n", NR > file
        next
    }
    /^```/ && inside { inside = 0; close(file); next }
    inside { print > file }
' "$readme"

shopt -s nullglob
blocks=("$work"/*.sh)
tour=0
for b in "${blocks[@]}"; do
    mark=${b##*/}; mark=${mark#*.}; mark=${mark%.sh}
    case $mark in
        tour) tour=$((tour + 1)) ;;
        ci | root | board | prose) ;;
        *) echo "readme-commands: $(head -n1 "$b" | cut -c3-): unknown mark \`$mark\`" >&2; exit 2 ;;
    esac
done
((tour > 0)) || { echo "readme-commands: $readme has no \`sh tour\` block" >&2; exit 2; }

# One script of every block that runs here, each block in a function so
# that its failure names it.
run=$work/run.sh
{
    echo 'set -euo pipefail'
    echo 'readme_block() { printf "\n==== readme-commands: %s\n" "$1"; }'
} >"$run"
ran=0
notrun=()
for b in "${blocks[@]}"; do
    mark=${b##*/}; mark=${mark#*.}; mark=${mark%.sh}
    where=$(head -n1 "$b" | cut -c3-)
    case $mark in
        prose) continue ;;
        board) notrun+=("$where (board: needs a Jetson or a download)"); continue ;;
        root) if ((!root)); then notrun+=("$where (root: run as root)"); continue; fi ;;
        ci) if ((!with_ci)); then notrun+=("$where (ci: a step of CI's own; --ci runs it)"); continue; fi ;;
    esac
    ran=$((ran + 1))
    if ((list)); then
        printf '\n# %s (%s)\n' "$where" "$mark"
        tail -n +2 "$b"
        continue
    fi
    {
        printf 'readme_block %q\n' "$where ($mark)"
        tail -n +2 "$b"
    } >>"$run"
done
if ((list)); then
    echo
    for n in "${notrun[@]}"; do printf 'not run here: %s\n' "$n"; done
    exit 0
fi

start=$SECONDS
if bash "$run"; then
    status=0
else
    status=1
fi
printf '\nreadme-commands: %d block(s) run in %ds%s\n' "$ran" $((SECONDS - start)) \
    "$( ((status)) && echo ", the last one named above FAILED")"
for n in "${notrun[@]}"; do printf 'readme-commands: not run: %s\n' "$n"; done
exit $status
