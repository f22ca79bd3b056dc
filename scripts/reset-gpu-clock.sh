#!/usr/bin/env bash
# Undo scripts/lock-gpu-clock.sh: give one GPU's SM and memory clocks back to the driver.
#
#   bash scripts/reset-gpu-clock.sh [--gpu N] [--persistence-off] [--dry-run]
#
# Runs `nvidia-smi -i N -rgc` and `nvidia-smi -i N -rmc` (where the GPU does not
# support memory clock locking there is nothing to reset, and it says so), turns
# persistence mode off only when asked (--persistence-off; lock-gpu-clock.sh
# turned it on), and removes the lock's JSON state file when it records this GPU
# (by UUID; by index when the UUID cannot be read).
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

# smi ARGS...: run nvidia-smi, output in $out and exit status in $rc; a hang exits 1.
out=""
rc=0
smi_call() {
    rc=0
    out="$(timeout "$smi_timeout" "$smi" "$@" 2>&1)" || rc=$?
    if ((rc == 124)); then
        echo "$PROG: 'nvidia-smi $*' did not answer within $smi_timeout s and was stopped; check the driver (is the GPU hung?) or raise SMI_TIMEOUT" >&2
        exit 1
    fi
}

first_line() { printf '%s\n' "$1" | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' | grep -m1 -v '^$' || true; }

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
    smi_call "$@"
    reason="$(first_line "$out")"
    if ((optional)) && { ((rc == 3)) || printf '%s\n' "$out" | grep -qi 'not supported'; }; then
        echo "$PROG: GPU $gpu does not support 'nvidia-smi $*' (${reason:-exit $rc}): nothing to reset there"
        return 0
    fi
    if ((rc != 0)); then
        echo "$PROG: 'nvidia-smi $*' failed (exit $rc): ${reason:-no output}; changing clocks or persistence needs root: run it as root or with sudo (sudo bash $BY)" >&2
        exit 1
    fi
}

# Which GPU this is, to match the state file by UUID (read-only, so also under --dry-run).
smi_call -i "$gpu" --query-gpu=uuid --format=csv,noheader,nounits
gpu_uuid=""
if ((rc == 0)); then
    gpu_uuid="$(first_line "$out" | tr -d '[:space:]')"
fi
[[ "$gpu_uuid" =~ ^GPU-[0-9a-fA-F-]{36}$ ]] || gpu_uuid=""

change -i "$gpu" -rgc
change --optional -i "$gpu" -rmc
if ((persistence_off)); then
    change -i "$gpu" -pm 0
fi

# The state file says clocks are locked; drop it once they are not (for this GPU).
if [[ -e "$state_file" ]]; then
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
fi
if ((!dry_run)); then
    echo "$PROG: GPU $gpu clocks reset$( ((persistence_off)) && echo ', persistence mode off' || true)"
fi
