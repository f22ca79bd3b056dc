#!/usr/bin/env bash
# Undo scripts/lock-gpu-clock.sh: give one GPU's SM and memory clocks back to the driver.
#
#   bash scripts/reset-gpu-clock.sh [--gpu N] [--persistence-off] [--dry-run]
#
# Runs `nvidia-smi -i N -rgc` and `nvidia-smi -i N -rmc` (where the GPU does not
# support memory clock locking there is nothing to reset, and it says so), turns
# persistence mode off only when asked (--persistence-off; lock-gpu-clock.sh
# turned it on), and removes the lock records (this GPU's per-GPU file, or an older
# single-record file) that record this GPU (by UUID; by index when the UUID cannot
# be read) as soon as -rgc has run: from then on they would claim a lock that is
# gone, even where a later step fails. Other GPUs' records are left alone. A GPU
# index that does not exist stops it at once ("no GPU N").
#
# Like lock-gpu-clock.sh it takes the profiler's lock of the GPU first and refuses
# while a profile holds it (where the UUID cannot be read: every GPU's lock).
# Ctrl-C, SIGTERM or SIGHUP stop the nvidia-smi call in flight and say what may be
# left locked (exit 130, 143 or 129).
#
# Environment:
#   GPU              GPU index (default 0; --gpu wins)
#   NVIDIA_SMI       nvidia-smi executable to use (default: nvidia-smi on PATH)
#   APP_CLOCK_STATE  state file name (default /tmp/app-kernel-clock-state.json): see lock-gpu-clock.sh
#   SMI_TIMEOUT      seconds before a hanging nvidia-smi call is abandoned (default 30)
#   APP_LOCK_DIR     the profiling lock folder, as for the profiler (sudo drops it: sudo APP_LOCK_DIR=...)
#
# Exit status: 0 ok, 1 nvidia-smi failed or hung (or there is no GPU N), 2 nvidia-smi
# or flock not found, 64 bad usage, 75 the GPU is being profiled (nothing was
# changed), 129/130/143 interrupted.
set -euo pipefail

readonly PROG="reset-gpu-clock"
readonly BY="scripts/reset-gpu-clock.sh"
# shellcheck source=smi-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/smi-common.sh"

gpu="${GPU:-0}"
persistence_off=0
dry_run=0
while (($#)); do
    case "$1" in
        --gpu) (($# >= 2)) || die_usage "--gpu needs a value"; gpu="$2"; shift 2 ;;
        --gpu=*) gpu="${1#*=}"; shift ;;
        --persistence-off) persistence_off=1; shift ;;
        --dry-run) dry_run=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) die_usage "unknown argument '$1'" ;;
    esac
done
is_uint "$gpu" || die_usage "GPU index must be a non-negative integer, got '$gpu'"
gpu=$((10#$gpu))

smi_setup

# change [--optional] ARGS...: a state-changing nvidia-smi call (printed only, under --dry-run);
# on failure print one line (command, exit status, first line of output, fix), exit 1.
# --optional: a GPU that does not support the call is told on stdout, not an error.
change() {
    local reason optional=0
    if [[ "$1" == --optional ]]; then optional=1; shift; fi
    if ((dry_run)); then
        echo "[dry-run] $smi $*"
        return 0
    fi
    smi_try "$@"
    reason="$(first_line "$smi_out")"
    if ((optional)) && { ((smi_rc == 3)) || printf '%s\n' "$smi_out" | grep -qi 'not supported'; }; then
        echo "$PROG: GPU $gpu does not support 'nvidia-smi $*' (${reason:-exit $smi_rc}): nothing to reset there"
        return 0
    fi
    if ((smi_rc != 0)); then
        smi_failure change "$@"
        exit 1
    fi
}

step=""            # the reset step in flight, for an interrupt's message
on_interrupt_hook() {
    case "$step" in
        "") echo "$PROG: interrupted: nothing was changed" >&2 ;;
        rgc) echo "$PROG: interrupted while resetting GPU $gpu's SM clock: it may still be locked; run it again" >&2 ;;
        rmc) echo "$PROG: interrupted while resetting GPU $gpu's memory clock: the SM clock is reset, the memory clock may still be locked; run it again" >&2 ;;
        pm) echo "$PROG: interrupted: GPU $gpu's clocks are reset; persistence mode may still be on" >&2 ;;
    esac
}

# Which GPU this is, to match the state file by UUID (read-only, so also under --dry-run).
smi_try -i "$gpu" --query-gpu=uuid --format=csv,noheader,nounits
if ((smi_rc != 0)) && smi_no_gpu; then
    echo "$PROG: no GPU $gpu ('nvidia-smi -i $gpu' exit $smi_rc: $(first_line "$smi_out")); nvidia-smi -L lists the GPUs; nothing was changed" >&2
    exit 1
fi
gpu_uuid=""
if ((smi_rc == 0)); then
    gpu_uuid="$(first_line "$smi_out" | tr -d '[:space:]')"
fi
[[ "$gpu_uuid" =~ ^GPU-[0-9a-fA-F-]{36}$ ]] || gpu_uuid=""

profile_lock_take "$gpu_uuid"       # no profile on this GPU (any GPU, where its UUID is unknown) meanwhile

step=rgc
change -i "$gpu" -rgc
# The SM lock is gone: a record of this GPU would claim one from here on, whatever fails next.
drop_records "$gpu_uuid" "$gpu"
step=rmc
change --optional -i "$gpu" -rmc
if ((persistence_off)); then
    step=pm
    change -i "$gpu" -pm 0
fi
trap '' INT TERM HUP
if ((!dry_run)); then
    echo "$PROG: GPU $gpu clocks reset$( ((persistence_off)) && echo ', persistence mode off' || true)"
fi
