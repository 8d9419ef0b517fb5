#!/usr/bin/env bash
# Deletes the Cloud TPU VM slice (without asking: --quiet). Whatever is on the workers' disks
# (~/t5x_lite, logs, a local MODEL_DIR) is deleted with it; gs:// model directories stay.
#
#   TPU_NAME=t5x-v5e-16 ZONE=us-west4-a launch/tpu/delete.sh
#
# Settings (environment): TPU_NAME, ZONE required; PROJECT (--project) optional;
# DRY_RUN=1 prints the command and runs nothing.

set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
usage_if_help "$@"

gcloud_flags

run_cmd gcloud compute tpus tpu-vm delete "$TPU_NAME" "${GCLOUD_FLAGS[@]}" --quiet
