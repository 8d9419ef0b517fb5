#!/usr/bin/env bash
# Runs `t5x-lite train GIN_FLAGS...` on every worker of the slice at once, in ~/t5x_lite (put
# there by install.sh), with MODEL_DIR added as --gin.MODEL_DIR='...'. On a Cloud TPU VM the
# train command joins the workers into one JAX run by itself. Each worker's output streams back
# through gcloud and is also appended to ~/t5x_lite/$TRAIN_LOG on that worker.
#
#   MODEL_DIR=gs://my-bucket/runs/d125m launch/tpu/train.sh --gin_file=runs/pretrain.gin ...
#
# Settings (environment):
#   TPU_NAME, ZONE, ACCELERATOR_TYPE  required (ACCELERATOR_TYPE: is the slice multi-host?)
#   MODEL_DIR   required; must be gs://... when the slice has more than one worker (every
#               worker reads and writes it)
#   TRAIN_LOG   the log file, relative to ~/t5x_lite (default logs/train.log)
#   PROJECT     --project when set
#   DRY_RUN=1   print the command, run nothing

set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
usage_if_help "$@"

require ACCELERATOR_TYPE v5litepod-16
gcloud_flags
require MODEL_DIR gs://my-bucket/runs/d125m
TRAIN_LOG=${TRAIN_LOG:-logs/train.log}

if multi_host "$ACCELERATOR_TYPE" && [[ "$MODEL_DIR" != gs://* ]]; then
  die "MODEL_DIR=$MODEL_DIR is not gs://, but $ACCELERATOR_TYPE has several workers and each reads and writes it (for example: export MODEL_DIR=gs://my-bucket/runs/d125m)"
fi
[[ "$MODEL_DIR" != *"'"* ]] || die "MODEL_DIR must not contain a quote (for example: export MODEL_DIR=gs://my-bucket/runs/d125m)"
for arg in "$@"; do
  [[ "$arg" != --gin.MODEL_DIR=* ]] || die "set MODEL_DIR instead of passing $arg (for example: export MODEL_DIR=gs://my-bucket/runs/d125m)"
done

# The worker's login shell runs this line (`set -o pipefail` needs bash, or any shell with
# pipefail); every argument is quoted so that it reaches t5x-lite exactly as given here.
train=$(quote_all .venv/bin/t5x-lite train "$@" "--gin.MODEL_DIR='$MODEL_DIR'")
remote="cd ~/t5x_lite && mkdir -p $(quote "$(dirname "$TRAIN_LOG")") && set -o pipefail"
remote+=" && $train 2>&1 | tee -a $(quote "$TRAIN_LOG")"

run_cmd gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${GCLOUD_FLAGS[@]}" --worker=all --command="$remote"
