#!/usr/bin/env bash
# Undo scripts/lock-gpu-clock.sh: give one GPU's SM clock back to the driver.
#
#   bash scripts/reset-gpu-clock.sh [--gpu N] [--persistence-off] [--dry-run]
#
# Runs `nvidia-smi -i N -rgc`, turns persistence mode off only when asked
# (--persistence-off; lock-gpu-clock.sh turned it on), and removes the lock's
# JSON state file when it records this GPU.
#
# Environment:
#   GPU              GPU index (default 0; --gpu wins)
#   NVIDIA_SMI       nvidia-smi executable to use (default: nvidia-smi on PATH)
#   APP_CLOCK_STATE  state file (default /tmp/app-kernel-clock-state.json)
#   SMI_TIMEOUT      seconds before a hanging nvidia-smi call is abandoned (default 30)
#
# Exit status: 0 ok, 1 nvidia-smi failed or hung, 2 nvidia-smi not found, 64 bad usage.
set -euo pipefail

readonly PROG="reset-gpu-clock"
readonly BY="scripts/reset-gpu-clock.sh"

usage() { # the header comment, without the '# '
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

die_usage() {
    echo "$PROG: $1 (see --help)" >&2
    exit 64
}

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

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

state_file="${APP_CLOCK_STATE:-/tmp/app-kernel-clock-state.json}"
smi="${NVIDIA_SMI:-nvidia-smi}"
if ! command -v "$smi" >/dev/null 2>&1; then
    echo "$PROG: nvidia-smi not found ('$smi'); install the NVIDIA driver or set NVIDIA_SMI to its path" >&2
    exit 2
fi

smi_timeout="${SMI_TIMEOUT:-30}"
is_uint "$smi_timeout" && ((10#$smi_timeout > 0)) || die_usage "SMI_TIMEOUT must be a positive integer, got '$smi_timeout'"

# change ARGS...: a state-changing nvidia-smi call (printed only, under --dry-run);
# on failure print one line (command, exit status, first line of output, fix), exit 1.
change() {
    local out rc=0 reason
    if ((dry_run)); then
        echo "[dry-run] $smi $*"
        return 0
    fi
    out="$(timeout "$smi_timeout" "$smi" "$@" 2>&1)" || rc=$?
    if ((rc == 124)); then
        echo "$PROG: 'nvidia-smi $*' did not answer within $smi_timeout s and was stopped; check the driver (is the GPU hung?) or raise SMI_TIMEOUT" >&2
        exit 1
    fi
    if ((rc != 0)); then
        reason="$(printf '%s\n' "$out" | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' | grep -m1 -v '^$' || true)"
        echo "$PROG: 'nvidia-smi $*' failed (exit $rc): ${reason:-no output}; changing clocks or persistence needs root: run it as root or with sudo (sudo bash $BY)" >&2
        exit 1
    fi
}

change -i "$gpu" -rgc
if ((persistence_off)); then
    change -i "$gpu" -pm 0
fi

# The state file says clocks are locked; drop it once they are not (for this GPU).
if [[ -e "$state_file" ]]; then
    state_gpu="$(sed -n 's/.*"gpu"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$state_file" | head -n1)"
    if [[ -n "$state_gpu" && "$((10#$state_gpu))" != "$gpu" ]]; then
        echo "$PROG: $state_file records GPU $state_gpu, not GPU $gpu: left in place"
    elif ((dry_run)); then
        echo "[dry-run] would remove $state_file"
    else
        rm -f "$state_file"
    fi
fi
if ((!dry_run)); then
    echo "$PROG: GPU $gpu clocks reset$( ((persistence_off)) && echo ', persistence mode off' || true)"
fi
