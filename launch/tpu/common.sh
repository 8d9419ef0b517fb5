# shellcheck shell=bash
# Sourced by launch/tpu/{create,install,train,delete}.sh: the settings check, shell quoting and
# run_cmd. Settings come from the environment:
#
#   TPU_NAME          required  the TPU VM (slice) name              e.g. t5x-v5e-16
#   ZONE              required  --zone                               e.g. us-west4-a
#   ACCELERATOR_TYPE  create.sh and train.sh: --accelerator-type     e.g. v5litepod-16, v4-32
#   RUNTIME_VERSION   create.sh: --version; default by accelerator family (runtime_default below)
#   PROJECT           optional  --project; unset: gcloud's configured project
#   SPOT              optional  SPOT=1: create a Spot TPU (--spot)
#   DRY_RUN           optional  DRY_RUN=1: print each command, run nothing

die() { echo "${0##*/}: $*" >&2; exit 2; }

# -h / --help: print the calling script's header comment.
usage_if_help() {
  case "${1:-}" in
    -h | --help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; exit 0 ;;
  esac
}

# require NAME EXAMPLE: refuse (one line) when the variable NAME is unset or empty.
require() {
  [[ -n "${!1:-}" ]] || die "$1 is not set (for example: export $1=$2)"
}

# quote WORD: WORD as one shell word that any POSIX shell reads back exactly: as it is when
# safe; in "..." when it holds a ' but none of " $ ` \ !; else in '...' (each ' as '\'').
quote() {
  local sq="'" esc="'\\''" dq_special='["$`\\!]'
  if [[ "$1" =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
    printf '%s' "$1"
  elif [[ "$1" == *"'"* && ! "$1" =~ $dq_special ]]; then
    printf '"%s"' "$1"
  else
    printf "'%s'" "${1//$sq/$esc}"
  fi
}

# quote_all WORDS...: the words quoted, separated by spaces.
quote_all() {
  local out=() w
  for w in "$@"; do out+=("$(quote "$w")"); done
  printf '%s' "${out[*]}"
}

# run_cmd CMD ARGS...: print the command (quoted, on stderr), then run it unless DRY_RUN=1.
run_cmd() {
  echo "+ $(quote_all "$@")" >&2
  [[ "${DRY_RUN:-0}" == 1 ]] || "$@"
}

# Checks TPU_NAME and ZONE; the flags every gcloud tpu-vm command gets: --zone, and --project
# when PROJECT is set.
gcloud_flags() {
  require TPU_NAME t5x-v5e-16
  require ZONE us-west4-a
  GCLOUD_FLAGS=(--zone="$ZONE")
  if [[ -n "${PROJECT:-}" ]]; then GCLOUD_FLAGS+=(--project="$PROJECT"); fi
}

# The TPU software version Google's "TPU software versions" page lists for JAX on each family.
runtime_default() {
  case "$1" in
    v6e-*) echo v2-alpha-tpuv6e ;;
    v5p-*) echo v2-alpha-tpuv5 ;;
    v5litepod-*) echo v2-alpha-tpuv5-lite ;;
    v2-* | v3-* | v4-*) echo tpu-ubuntu2204-base ;;
    *) return 1 ;;
  esac
}

# multi_host TYPE: true when a slice of TYPE has more than one worker (VM). The number after the
# last '-' counts TensorCores (v2, v3, v4, v5p) or chips (v5litepod, v6e); one VM holds at most
# 8 of either, so more than 8 means several workers. A type it cannot read counts as multi-host.
multi_host() {
  local n=${1##*-}
  [[ ! "$n" =~ ^[0-9]+$ ]] || ((n > 8))
}
