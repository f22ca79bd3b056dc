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
# be read). Other GPUs' records are left alone.
#
# Environment:
#   GPU              GPU index (default 0; --gpu wins)
#   NVIDIA_SMI       nvidia-smi executable to use (default: nvidia-smi on PATH)
#   APP_CLOCK_STATE  state file name (default /tmp/app-kernel-clock-state.json): see lock-gpu-clock.sh
#   SMI_TIMEOUT      seconds before a hanging nvidia-smi call is abandoned (default 30)
#
# Exit status: 0 ok, 1 nvidia-smi failed or hung, 2 nvidia-smi not found, 64 bad usage.
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
        echo "$PROG: 'nvidia-smi $*' failed (exit $smi_rc): ${reason:-no output}; changing clocks or persistence needs root: run it as root or with sudo (sudo bash $BY)" >&2
        exit 1
    fi
}

# Which GPU this is, to match the state file by UUID (read-only, so also under --dry-run).
smi_try -i "$gpu" --query-gpu=uuid --format=csv,noheader,nounits
gpu_uuid=""
if ((smi_rc == 0)); then
    gpu_uuid="$(first_line "$smi_out" | tr -d '[:space:]')"
fi
[[ "$gpu_uuid" =~ ^GPU-[0-9a-fA-F-]{36}$ ]] || gpu_uuid=""

change -i "$gpu" -rgc
change --optional -i "$gpu" -rmc
if ((persistence_off)); then
    change -i "$gpu" -pm 0
fi

# A record says clocks are locked; drop this GPU's once they are not. The records: an older
# single-record file at $APP_CLOCK_STATE and one file per GPU (state_file_for), each checked.
shopt -s nullglob
records=("$state_base" "$state_stem".gpu-*.json)
shopt -u nullglob
for state_file in "${records[@]}"; do
    [[ -e "$state_file" ]] || continue
    state_gpu="$(sed -n 's/.*"gpu"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$state_file" | head -n1)"
    state_uuid="$(sed -n 's/.*"uuid"[[:space:]]*:[[:space:]]*"\(GPU-[0-9a-fA-F-]*\)".*/\1/p' "$state_file" | head -n1)"
    if [[ -n "$state_uuid" && -n "$gpu_uuid" ]]; then
        other=$([[ "${state_uuid,,}" != "${gpu_uuid,,}" ]] && echo 1 || echo 0)
        state_desc="$state_uuid"; this_desc="GPU $gpu ($gpu_uuid)"
    else
        other=$([[ -n "$state_gpu" && "$((10#$state_gpu))" != "$gpu" ]] && echo 1 || echo 0)
        state_desc="GPU $state_gpu"; this_desc="GPU $gpu"
    fi
    if ((other)); then
        echo "$PROG: $state_file records $state_desc, not $this_desc: left in place"
    elif ((dry_run)); then
        echo "[dry-run] would remove $state_file"
    else
        rm -f "$state_file"
    fi
done
if ((!dry_run)); then
    echo "$PROG: GPU $gpu clocks reset$( ((persistence_off)) && echo ', persistence mode off' || true)"
fi
