#!/usr/bin/env bash
# Creates the Cloud TPU VM slice: gcloud compute tpus tpu-vm create.
#
#   TPU_NAME=t5x-v5e-16 ZONE=us-west4-a ACCELERATOR_TYPE=v5litepod-16 launch/tpu/create.sh
#
# Settings (environment):
#   TPU_NAME, ZONE, ACCELERATOR_TYPE  required
#   RUNTIME_VERSION  --version; default by family: v5litepod-* v2-alpha-tpuv5-lite,
#                    v5p-* v2-alpha-tpuv5, v6e-* v2-alpha-tpuv6e, v2/v3/v4-* tpu-ubuntu2204-base
#                    (the JAX choices of Google's "TPU software versions" page); other types
#                    need it set
#   PROJECT          --project when set
#   SPOT=1           --spot (a Spot TPU: cheaper, can be preempted)
#   DRY_RUN=1        print the command, run nothing

set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
usage_if_help "$@"

require ACCELERATOR_TYPE v5litepod-16
gcloud_flags
RUNTIME_VERSION=${RUNTIME_VERSION:-$(runtime_default "$ACCELERATOR_TYPE")} ||
  die "RUNTIME_VERSION is not set and has no default for ACCELERATOR_TYPE=$ACCELERATOR_TYPE (for example: export RUNTIME_VERSION=tpu-ubuntu2204-base)"

args=(--accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION")
case "${SPOT:-0}" in
  1) args+=(--spot) ;;
  0 | "") ;;
  *) die "SPOT must be 1 or 0, not '$SPOT' (for example: export SPOT=1)" ;;
esac

run_cmd gcloud compute tpus tpu-vm create "$TPU_NAME" "${GCLOUD_FLAGS[@]}" "${args[@]}"
