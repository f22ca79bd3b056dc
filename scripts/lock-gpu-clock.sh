#!/usr/bin/env bash
# Lock one GPU's SM clock for stable profiling (DESIGN.md, Truth rule 7).
#
#   bash scripts/lock-gpu-clock.sh [--gpu N] [--clock MHZ] [--dry-run]
#
# Enables persistence mode, locks the SM clock to one value (min = max) with
# `nvidia-smi -lgc C,C`, reads the clock back and records the lock in a JSON
# state file that the profiler reads to report whether clocks were locked.
# C is --clock if given, else the driver's default applications graphics clock
# (clocks.default_applications.graphics), else the current applications clock.
# Undo with scripts/reset-gpu-clock.sh.
#
# Environment:
#   GPU              GPU index (default 0; --gpu wins)
#   NVIDIA_SMI       nvidia-smi executable to use (default: nvidia-smi on PATH)
#   APP_CLOCK_STATE  state file (default /tmp/app-kernel-clock-state.json)
#   SMI_TIMEOUT      seconds before a hanging nvidia-smi call is abandoned (default 30)
#
# The lock is recorded in the state file right after it is made; if that cannot
# be written, the clocks are reset again: clocks are never left locked unrecorded.
#
# Exit status: 0 ok, 1 nvidia-smi failed or hung, 2 nvidia-smi not found, 64 bad usage.
set -euo pipefail

readonly PROG="lock-gpu-clock"
readonly BY="scripts/lock-gpu-clock.sh"

usage() { # the header comment, without the '# '
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

die_usage() {
    echo "$PROG: $1 (see --help)" >&2
    exit 64
}

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

gpu="${GPU:-0}"
clock=""
dry_run=0
while (($#)); do
    case "$1" in
        --gpu) (($# >= 2)) || die_usage "--gpu needs a value"; gpu="$2"; shift 2 ;;
        --gpu=*) gpu="${1#*=}"; shift ;;
        --clock) (($# >= 2)) || die_usage "--clock needs a value"; clock="$2"; shift 2 ;;
        --clock=*) clock="${1#*=}"; shift ;;
        --dry-run) dry_run=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) die_usage "unknown argument '$1'" ;;
    esac
done
is_uint "$gpu" || die_usage "GPU index must be a non-negative integer, got '$gpu'"
if [[ -n "$clock" ]]; then
    is_uint "$clock" && ((10#$clock > 0)) || die_usage "--clock must be a positive integer (MHz), got '$clock'"
    clock=$((10#$clock))
fi
gpu=$((10#$gpu))

state_file="${APP_CLOCK_STATE:-/tmp/app-kernel-clock-state.json}"
smi="${NVIDIA_SMI:-nvidia-smi}"
if ! command -v "$smi" >/dev/null 2>&1; then
    echo "$PROG: nvidia-smi not found ('$smi'); install the NVIDIA driver or set NVIDIA_SMI to its path" >&2
    exit 2
fi

# smi_run KIND ARGS...: run nvidia-smi, output in $smi_out; on failure print one
# line (the command, its exit status, its first line of output, the fix) and exit 1.
smi_out=""
smi_timeout="${SMI_TIMEOUT:-30}"
is_uint "$smi_timeout" && ((10#$smi_timeout > 0)) || die_usage "SMI_TIMEOUT must be a positive integer, got '$smi_timeout'"
smi_run() {
    local kind="$1" rc=0 reason fix
    shift
    smi_out="$(timeout "$smi_timeout" "$smi" "$@" 2>&1)" || rc=$?
    if ((rc == 124)); then
        echo "$PROG: 'nvidia-smi $*' did not answer within $smi_timeout s and was stopped; check the driver (is the GPU hung?) or raise SMI_TIMEOUT" >&2
        exit 1
    fi
    if ((rc != 0)); then
        reason="$(printf '%s\n' "$smi_out" | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' | grep -m1 -v '^$' || true)"
        if [[ "$kind" == change ]]; then
            fix="changing clocks or persistence needs root: run it as root or with sudo (sudo bash $BY)"
        else
            fix="check the NVIDIA driver and the GPU index (nvidia-smi -L)"
        fi
        echo "$PROG: 'nvidia-smi $*' failed (exit $rc): ${reason:-no output}; $fix" >&2
        exit 1
    fi
}

# change ARGS...: a state-changing nvidia-smi call (printed only, under --dry-run).
change() {
    if ((dry_run)); then
        echo "[dry-run] $smi $*"
    else
        smi_run change "$@"
    fi
}

field_uint() { # a CSV field as an integer, or empty when it is [N/A] etc.
    local v
    v="$(printf '%s' "$1" | tr -d '[:space:]')"
    v="${v%%.*}"
    if is_uint "$v"; then echo "$((10#$v))"; fi
}

json_escape() {
    local s="$1"
    s="${s//\\/\\\\}"
    s="${s//\"/\\\"}"
    printf '%s' "$s" | tr -d '\000-\037'
}

# Name last: it is the only field that could hold a comma.
smi_run query -i "$gpu" \
    --query-gpu=clocks.max.sm,clocks.applications.graphics,clocks.default_applications.graphics,name \
    --format=csv,noheader,nounits
line="$(printf '%s\n' "$smi_out" | head -n1)"
IFS=, read -r f_max f_app f_default name <<<"$line"
name="$(printf '%s' "${name:-}" | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//')"
max_sm="$(field_uint "${f_max:-}")"
app_clock="$(field_uint "${f_app:-}")"
default_app_clock="$(field_uint "${f_default:-}")"

if [[ -n "$clock" ]]; then
    target="$clock"; chosen_from="--clock"
elif [[ -n "$default_app_clock" ]]; then
    target="$default_app_clock"; chosen_from="clocks.default_applications.graphics"
elif [[ -n "$app_clock" ]]; then
    target="$app_clock"; chosen_from="clocks.applications.graphics"
else
    echo "$PROG: GPU $gpu (${name:-unknown}) reports no applications clock; pass --clock MHZ" >&2
    exit 1
fi
if [[ -n "$max_sm" ]] && ((target > max_sm)); then
    echo "$PROG: --clock $target MHz is above GPU $gpu's maximum SM clock ($max_sm MHz)" >&2
    exit 1
fi

echo "$PROG: GPU $gpu (${name:-unknown}): locking SM clock at $target MHz (from $chosen_from; max ${max_sm:-?} MHz)"
change -i "$gpu" -pm 1

if ((dry_run)); then
    change -i "$gpu" -lgc "$target,$target"
    echo "[dry-run] would read back clocks.sm and write $state_file"
    exit 0
fi

# write_state READBACK: record the lock atomically (a private temp file, then rename).
write_state() {
    local tmp
    mkdir -p "$(dirname "$state_file")" && tmp="$(mktemp "$state_file.XXXXXX")" || return 1
    if ! cat >"$tmp" <<JSON
{
  "gpu": $gpu,
  "name": "$(json_escape "$name")",
  "locked_sm_mhz": $target,
  "readback_sm_mhz": ${1:-null},
  "max_sm_mhz": ${max_sm:-null},
  "locked_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "by": "$BY"
}
JSON
    then rm -f "$tmp"; return 1; fi
    chmod 0644 "$tmp" && mv -f "$tmp" "$state_file"
}

# From the lock on, any exit that has not recorded it resets the clocks again.
recorded=0
undo_unrecorded() {
    if ((!recorded)); then
        echo "$PROG: the lock could not be recorded in $state_file; resetting the clocks of GPU $gpu" >&2
        timeout "$smi_timeout" "$smi" -i "$gpu" -rgc >/dev/null 2>&1 || true
    fi
}
change -i "$gpu" -lgc "$target,$target"
trap undo_unrecorded EXIT
write_state "" || exit 1
recorded=1

smi_run query -i "$gpu" --query-gpu=clocks.sm --format=csv,noheader,nounits
readback="$(field_uint "$(printf '%s\n' "$smi_out" | head -n1)")"
if [[ -n "$readback" && "$readback" != "$target" ]]; then
    echo "$PROG: note: clocks.sm reads $readback MHz right after the lock (locked at $target); power or thermal limits may pull it lower under load"
fi
write_state "$readback" || echo "$PROG: note: could not add the read-back clock to $state_file" >&2
trap - EXIT
echo "$PROG: GPU $gpu locked at $target MHz (reads ${readback:-?} MHz); state in $state_file"
