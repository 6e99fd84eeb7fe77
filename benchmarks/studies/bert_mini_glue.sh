#!/usr/bin/env bash
# Foundation evidence: bert-mini pre-trained on English Wikipedia for 30 minutes, then SST-2 and
# CoLA fine-tuned from it and from random initialisation (3 seeds each, same settings).
# Usage: bash benchmarks/studies/bert_mini_glue.sh [RUNS_DIR]   (about 1.5 hours on 2 CPU cores)
set -euo pipefail
RUNS=${1:-runs/evidence}
DATA=${EMBER_DATA:-../shared/data}
mkdir -p "$RUNS"

ember tokenizer train "$DATA/wiki-en" --vocab-size 30522 --out "$RUNS/tok/tokenizer.json"
ember prepare "$DATA/wiki-en" --tokenizer "$RUNS/tok/tokenizer.json" --out "$RUNS/wiki-prep"
ember pretrain --recipe bert-mini --data "$RUNS/wiki-prep" --out "$RUNS/bert-mini-30m" \
  --max-steps 1500 --max-time 30m --set train.eval_every=100 --set train.save_every=100 --no-progress

finetune() {  # task init out extra...
  local task=$1 init=$2 out=$3; shift 3
  ember finetune --task "$task" --init "$init" --out "$out" --lr 1e-4 --seeds 1,2,3 --no-progress "$@"
}
finetune sst2 "$RUNS/bert-mini-30m" "$RUNS/sst2-pretrained" --epochs 1 --train-limit 20000 --max-length 66
finetune sst2 random "$RUNS/sst2-random" --model bert-mini --tokenizer "$RUNS/tok/tokenizer.json" \
  --epochs 1 --train-limit 20000 --max-length 66
finetune cola "$RUNS/bert-mini-30m" "$RUNS/cola-pretrained" --epochs 3 --max-length 64
finetune cola random "$RUNS/cola-random" --model bert-mini --tokenizer "$RUNS/tok/tokenizer.json" \
  --epochs 3 --max-length 64
for f in "$RUNS"/*/summary.json; do echo "$f"; cat "$f"; done
