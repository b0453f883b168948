#!/usr/bin/env bash
# A round of students (deep encoder, shallow decoder) trained side by side on one GPU, in one
# command, for a machine lent for minutes (the device tool: at most 10 minutes a command, 8
# files of 16 MiB back). On 2 CPU cores one student takes hours; on a GPU, minutes.
#
#   here:   make distill DISTILLED=build/distilled/fr-en && cp -r ../shared/data/multi30k build/
#   there:  bash export/student_round.sh          (carry build/distilled and build/multi30k)
#   here:   bash export/student_round.sh unpack DIR   (DIR: where the returned files lie)
#
# Each student trains on the teacher's beam-4 translations of Multi30k's training sources
# (make distill) and validates on the real val set; its final model (the best epoch or the
# average of the last, by val BLEU: nmt train --out) comes back as student-<shape>.tar.xz
# pieces, its weights in fp16 to fit (unpack makes them fp32 again; fp16 rounding moves a
# weight by at most 2^-11 of itself). Export, BLEU on the test sets and speed are measured
# here afterwards, on the product's path (nmt export, nmt eval, bench).
set -euo pipefail

OUT=${OUT:-build/student-round}
MULTI30K=${MULTI30K:-build/multi30k}
DISTILLED=${DISTILLED:-build/distilled/fr-en}
SHAPES=${SHAPES:-"6x2 6x1 8x2"}  # encoder x decoder layers
# The recipe (README of docs/quality.md): pre-norm, the committed model's schedule and width.
TRAIN_ARGS=${TRAIN_ARGS:-"--pre-norm --warmup-steps 400 --dropout 0.1 --max-epochs 40 --patience 6"}
SECONDS_FOR_TRAINING=${SECONDS_FOR_TRAINING:-480}  # then the best epoch so far is kept
PYTHON=${PYTHON:-python3}

if [[ ${1:-} == unpack ]]; then
    from=${2:?unpack needs the folder the pieces came back to}
    for archive in $(ls "$from" | sed -n 's/\.tar\.xz\.part.*//p' | sort -u); do
        cat "$from/$archive".tar.xz.part* | tar -xJ -C build
        NMT_WEIGHTS="build/$archive/model.safetensors" "$PYTHON" -c '
import os, torch
from safetensors.torch import load_file, save_file
path = os.environ["NMT_WEIGHTS"]
save_file({name: weight.float() for name, weight in load_file(path).items()}, path)'
        echo "build/$archive"
    done
    exit 0
fi

mkdir -p "$OUT" build/runs build/students
export NMT_DATA_DIR=$MULTI30K
for shape in $SHAPES; do
    encoder=${shape%x*} decoder=${shape#*x}
    # shellcheck disable=SC2086
    timeout "$SECONDS_FOR_TRAINING" "$PYTHON" nmt_cli.py train --run-dir "build/runs/student-$shape" \
        --out "build/students/student-$shape" --data-dir "$DISTILLED" \
        --encoder-layers "$encoder" --decoder-layers "$decoder" $TRAIN_ARGS \
        > "build/runs/student-$shape.log" 2>&1 &
done
wait || true  # a run stopped by the timeout keeps its best epoch

for shape in $SHAPES; do
    model=build/students/student-$shape
    if [[ ! -f $model/model.safetensors ]]; then  # stopped before the end: its best epoch
        rm -rf "$model" && cp -r "build/runs/student-$shape/best" "$model"
        cp "build/runs/student-$shape/history.jsonl" "$model/"
    fi
    NMT_WEIGHTS="$model/model.safetensors" "$PYTHON" -c '
import os
from safetensors.torch import load_file, save_file
path = os.environ["NMT_WEIGHTS"]
save_file({name: weight.half() for name, weight in load_file(path).items()}, path)'
    tar -cJ -C build/students "student-$shape" | split -b 15M -d - "$OUT/student-$shape.tar.xz.part"
done
tar -czf "$OUT/logs.tar.gz" build/runs/*.log build/runs/*/history.jsonl
ls -l "$OUT"
