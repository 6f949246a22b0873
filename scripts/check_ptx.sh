#!/usr/bin/env bash
# Assembles every PTX module embedded in the `cadence` binary with ptxas for its target.
# Fails on any ptxas error or on any register spill; prints each kernel's register count.
# usage: scripts/check_ptx.sh PATH/TO/cadence PATH/TO/ptxas
set -euo pipefail
cadence=$1
ptxas=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for pair in sm_90:sm_90 sm_120:sm_120 portable:sm_75; do
    name=${pair%%:*}
    arch=${pair##*:}
    "$cadence" ptx --arch "$name" > "$work/$name.ptx"
    if ! "$ptxas" -arch="$arch" -v "$work/$name.ptx" -o "$work/$name.cubin" > "$work/$name.log" 2>&1; then
        cat "$work/$name.log"
        echo "ptxas: FAILED to assemble the $name PTX"
        status=1
        continue
    fi
    echo "ptxas -arch=$arch ($name): assembled"
    # "Compiling entry function 'X'" is followed by "Used N registers" and a spill line.
    awk -v tgt="$name" '
        /Compiling entry function/ { match($0, /\x27[^\x27]+\x27/); fn = substr($0, RSTART + 1, RLENGTH - 2) }
        /spill stores/ { if ($0 !~ / 0 bytes spill stores, 0 bytes spill loads/) { print "  SPILL in " fn ": " $0; bad = 1 } }
        /Used [0-9]+ registers/ { match($0, /Used [0-9]+ registers/); printf "  %-8s %-18s %s\n", tgt, fn, substr($0, RSTART, RLENGTH) }
        END { exit bad }
    ' "$work/$name.log" || { echo "ptxas: register spills in the $name PTX"; status=1; }
done
exit $status
