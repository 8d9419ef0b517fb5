#!/usr/bin/env bash
# Installs this checkout's committed code on every worker of the slice: `git archive HEAD` as a
# tarball, copied to each worker's home (gcloud ... scp --worker=all), unpacked into ~/t5x_lite,
# then `make install-tpu` there (the locked environment plus requirements/tpu.txt in
# ~/t5x_lite/.venv). Uncommitted changes are NOT installed: commit first.
#
# The lock needs Python 3.11, and Ubuntu 22.04 (tpu-ubuntu2204-base) has 3.10 as python3, so
# each worker first apt-get installs python3.11, python3.11-venv and make (with sudo), and
# make runs with PYTHON=python3.11. Installing again unpacks over ~/t5x_lite (tar -m: the files
# get the current time, so make re-runs the install) and keeps .venv; deleted files stay.
#
#   TPU_NAME=t5x-v5e-16 ZONE=us-west4-a launch/tpu/install.sh
#
# Settings (environment): TPU_NAME, ZONE required; PROJECT (--project) optional;
# DRY_RUN=1 prints the commands and runs nothing.

set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
usage_if_help "$@"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

gcloud_flags

if [[ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no)" ]]; then
  echo "${0##*/}: note: uncommitted changes are not installed (git archive HEAD: $(git -C "$ROOT" rev-parse --short HEAD))" >&2
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tarball=$tmp/t5x_lite.tar.gz

apt="sudo apt-get -o DPkg::Lock::Timeout=600 -qq"
remote="set -e; $apt update && $apt install -y python3.11 python3.11-venv make"
remote+=" && mkdir -p ~/t5x_lite && tar -xzmf ~/t5x_lite.tar.gz -C ~/t5x_lite"
remote+=" && cd ~/t5x_lite && make install-tpu PYTHON=python3.11"

run_cmd git -C "$ROOT" archive --format=tar.gz -o "$tarball" HEAD
run_cmd gcloud compute tpus tpu-vm scp "$tarball" "$TPU_NAME:t5x_lite.tar.gz" "${GCLOUD_FLAGS[@]}" --worker=all
run_cmd gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${GCLOUD_FLAGS[@]}" --worker=all --command="$remote"
