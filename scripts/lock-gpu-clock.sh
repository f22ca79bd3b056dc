#!/usr/bin/env bash
# Lock one GPU's SM and memory clocks for stable profiling.
#
#   bash scripts/lock-gpu-clock.sh [--gpu N] [--clock MHZ] [--dry-run]
#
# Enables persistence mode, locks the SM clock to one value (min = max) with
# `nvidia-smi -lgc C,C` and the memory clock with `nvidia-smi -lmc M,M`, reads
# both back and records the lock -- with the GPU's UUID -- in a JSON state file of
# that GPU (one per GPU: locking one GPU leaves another's record alone).
# C is --clock if given, else the driver's default applications graphics clock
# (clocks.default_applications.graphics), else the current applications clock.
# M is the default applications memory clock, else the current applications
# memory clock, else the maximum memory clock. Where the GPU does not support
# locking its memory clock, that is said on stderr and only the SM clock is
# locked (and recorded). Undo with scripts/reset-gpu-clock.sh.
#
# The profiler reports clocks as locked only when this file names the GPU it ran
# on (by UUID) and the clocks the GPU reports then match the ones locked here.
#
# Environment:
#   GPU              GPU index (default 0; --gpu wins)
#   NVIDIA_SMI       nvidia-smi executable to use (default: nvidia-smi on PATH)
#   APP_CLOCK_STATE  state file name (default /tmp/app-kernel-clock-state.json); each GPU's
#                    record is that name with the GPU's UUID before .json, e.g.
#                    /tmp/app-kernel-clock-state.gpu-1904f39e-c822-6777-12c4-cc5de708684c.json
#   SMI_TIMEOUT      seconds before a hanging nvidia-smi call is abandoned (default 30)
#
#   APP_LOCK_DIR     the profiling lock folder, as for the profiler (sudo drops it: sudo APP_LOCK_DIR=...)
#
# No clock change lands in a profile: once the GPU's UUID is known the script takes
# the profiler's lock of that GPU (the file src/app/runtime/lock.py locks, in
# APP_LOCK_DIR or the invoking user's own lock folder -- under sudo, SUDO_USER's) and
# refuses while a profile holds it; a profile that starts meanwhile waits or is refused.
#
# The lock is recorded in the state file right after it is made; if that cannot
# be written, or the memory clock lock fails, the clocks are reset again: clocks
# are never left locked unrecorded. An earlier record of this GPU goes as soon as
# the SM clock is changed. Ctrl-C, SIGTERM or SIGHUP stop the nvidia-smi call in
# flight, wait for it, reset the clocks and remove the record ("interrupted: clocks
# reset"; exit 130, 143 or 129).
#
# Exit status: 0 ok, 1 nvidia-smi failed or hung (or the GPU reports no UUID, or the
# lock was made and recorded but could not be read back), 2 nvidia-smi or flock not
# found, 64 bad usage, 75 the GPU is being profiled (nothing was changed),
# 129/130/143 interrupted.
set -euo pipefail

readonly PROG="lock-gpu-clock"
readonly BY="scripts/lock-gpu-clock.sh"
# shellcheck source=smi-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/smi-common.sh"

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

smi_setup

# smi_run KIND ARGS...: run nvidia-smi, output in $smi_out; on failure print one
# line (the command, its exit status, its first line of output, the fix) and exit 1.
smi_run() {
    local kind="$1"
    shift
    smi_try "$@"
    if ((smi_rc != 0)); then
        smi_failure "$kind" "$@"
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


# From the SM lock on, any exit that has not recorded it resets the clocks again (undo_reason says why).
sm_tried=0          # an -lgc was started: it may have landed
mem_tried=0         # an -lmc was started and the GPU may support it
mem_locked=""
recorded=0
undone=0
undo_reason=""
# reset_clocks: -rmc where the memory clock was tried, -rgc; then this GPU's record goes. 1: a reset failed.
reset_clocks() {
    local failed=0
    if ((mem_tried)); then
        smi_exec -i "$gpu" -rmc
        if ((smi_rc != 0)) && ! { ((smi_rc == 3)) || printf '%s\n' "$smi_out" | grep -qi 'not supported'; }; then
            failed=1
            reset_error="nvidia-smi -i $gpu -rmc: exit $smi_rc, $(first_line "$smi_out")"
        fi
    fi
    if ((sm_tried)); then
        smi_exec -i "$gpu" -rgc
        if ((smi_rc != 0)); then
            failed=1
            reset_error="nvidia-smi -i $gpu -rgc: exit $smi_rc, $(first_line "$smi_out")"
        fi
    fi
    drop_records "$uuid" "$gpu" quiet >/dev/null 2>&1 || true     # the locks it recorded are undone
    undone=1                          # only now: an interrupted reset is not one that ran
    return "$failed"
}
reset_error=""
reset_failed_line() {
    echo "$PROG: resetting the clocks of GPU $gpu failed ($reset_error); they may still be locked, with no record: run sudo bash scripts/reset-gpu-clock.sh --gpu $gpu" >&2
}
on_exit_hook() {
    if ((sm_tried && !recorded && !undone)); then
        echo "$PROG: ${undo_reason:-the lock was not completed}; resetting the clocks of GPU $gpu" >&2
        reset_clocks || reset_failed_line
    fi
}
on_interrupt_hook() {
    if ((sm_tried && !undone)); then
        if reset_clocks; then
            echo "$PROG: interrupted: clocks reset (GPU $gpu: nothing is locked, no record is left)" >&2
        else
            echo "$PROG: interrupted" >&2
            reset_failed_line
        fi
    else
        echo "$PROG: interrupted: no clock was changed" >&2
    fi
}

# Name last: it is the only field that could hold a comma.
smi_run query -i "$gpu" \
    --query-gpu=uuid,clocks.max.sm,clocks.max.mem,clocks.applications.graphics,clocks.default_applications.graphics,clocks.applications.memory,clocks.default_applications.memory,name \
    --format=csv,noheader,nounits
line="$(printf '%s\n' "$smi_out" | head -n1)"
IFS=, read -r f_uuid f_max f_max_mem f_app f_default f_app_mem f_default_mem name <<<"$line"
name="$(printf '%s' "${name:-}" | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//')"
uuid="$(printf '%s' "${f_uuid:-}" | tr -d '[:space:]')"
max_sm="$(field_uint "${f_max:-}")"
max_mem="$(field_uint "${f_max_mem:-}")"
app_clock="$(field_uint "${f_app:-}")"
default_app_clock="$(field_uint "${f_default:-}")"
app_mem="$(field_uint "${f_app_mem:-}")"
default_app_mem="$(field_uint "${f_default_mem:-}")"
mem_target="${default_app_mem:-${app_mem:-$max_mem}}"

if [[ ! "$uuid" =~ ^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$ ]]; then
    echo "$PROG: GPU $gpu (${name:-unknown}) reports no UUID ('${uuid}'); the lock could not be tied to this GPU, so nothing was changed" >&2
    exit 1
fi
state_file="$(state_file_for "$uuid")"     # this GPU's record
profile_lock_take "$uuid"                  # no profile on this GPU until the script ends

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

echo "$PROG: GPU $gpu $uuid (${name:-unknown}): locking SM clock at $target MHz (from $chosen_from; max ${max_sm:-?} MHz), memory clock at ${mem_target:-?} MHz"
change -i "$gpu" -pm 1

if ((dry_run)); then
    change -i "$gpu" -lgc "$target,$target"
    if [[ -n "$mem_target" ]]; then
        change -i "$gpu" -lmc "$mem_target,$mem_target"
    else
        echo "[dry-run] would not lock the memory clock: GPU $gpu reports no memory clock"
    fi
    echo "[dry-run] would read back clocks.sm, clocks.mem and write $state_file"
    exit 0
fi

# write_state READBACK_SM READBACK_MEM: record the lock atomically (a private temp file, then rename).
write_state() {
    local tmp
    mkdir -p "$(dirname "$state_file")" && tmp="$(mktemp "$state_file.XXXXXX")" || return 1
    if ! cat >"$tmp" <<JSON
{
  "gpu": $gpu,
  "uuid": "$uuid",
  "name": "$(json_escape "$name")",
  "locked_sm_mhz": $target,
  "readback_sm_mhz": ${1:-null},
  "locked_mem_mhz": ${mem_locked:-null},
  "readback_mem_mhz": ${2:-null},
  "max_sm_mhz": ${max_sm:-null},
  "max_mem_mhz": ${max_mem:-null},
  "locked_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "by": "$BY"
}
JSON
    then rm -f "$tmp"; return 1; fi
    chmod 0644 "$tmp" && mv -f "$tmp" "$state_file"
}

sm_tried=1
smi_try -i "$gpu" -lgc "$target,$target"
if ((smi_rc != 0)); then
    sm_tried=0                     # refused: nothing was changed
    smi_failure change -i "$gpu" -lgc "$target,$target"
    exit 1
fi
drop_records "$uuid" "$gpu" quiet >/dev/null     # an earlier lock's record no longer holds

# The memory clock: locked where the GPU supports it; where it does not, the SM lock stands alone.
if [[ -z "$mem_target" ]]; then
    echo "$PROG: note: GPU $gpu reports no memory clock; only the SM clock is locked" >&2
else
    mem_tried=1
    smi_try -i "$gpu" -lmc "$mem_target,$mem_target"
    reason="$(first_line "$smi_out")"
    if printf '%s\n' "$smi_out" | grep -qi 'not supported' || ((smi_rc == 3)); then
        mem_tried=0
        echo "$PROG: note: GPU $gpu does not support locking its memory clock (nvidia-smi -lmc: ${reason:-exit $smi_rc}); only the SM clock is locked" >&2
    elif ((smi_rc != 0)); then
        smi_failure change -i "$gpu" -lmc "$mem_target,$mem_target"
        undo_reason="locking the memory clock failed, so the SM clock lock is undone"
        exit 1
    else
        mem_locked="$mem_target"
    fi
fi
undo_reason="the lock could not be recorded in $state_file"
write_state "" "" || exit 1
recorded=1

smi_try -i "$gpu" --query-gpu=clocks.sm,clocks.mem --format=csv,noheader,nounits
if ((smi_rc != 0)); then
    mem_text="memory clock not locked"
    [[ -z "$mem_locked" ]] || mem_text="memory at $mem_locked MHz"
    echo "$PROG: GPU $gpu ($uuid) is locked (SM at $target MHz, $mem_text) and recorded in $state_file, but reading the clocks back failed ('nvidia-smi -i $gpu --query-gpu=clocks.sm,clocks.mem' exit $smi_rc: $(first_line "$smi_out")); check the NVIDIA driver; undo the lock with scripts/reset-gpu-clock.sh --gpu $gpu" >&2
    exit 1
fi
IFS=, read -r f_rb_sm f_rb_mem <<<"$(printf '%s\n' "$smi_out" | head -n1)"
readback="$(field_uint "${f_rb_sm:-}")"
readback_mem="$(field_uint "${f_rb_mem:-}")"
if [[ -n "$readback" && "$readback" != "$target" ]]; then
    echo "$PROG: note: clocks.sm reads $readback MHz right after the lock (locked at $target); power or thermal limits may pull it lower under load"
fi
if [[ -n "$mem_locked" && -n "$readback_mem" && "$readback_mem" != "$mem_locked" ]]; then
    echo "$PROG: note: clocks.mem reads $readback_mem MHz right after the lock (locked at $mem_locked)"
fi
write_state "$readback" "$readback_mem" || echo "$PROG: note: could not add the read-back clocks to $state_file" >&2
trap '' INT TERM HUP               # done: the lock stands, recorded
mem_text="memory clock not locked"
[[ -z "$mem_locked" ]] || mem_text="memory at $mem_locked MHz (reads ${readback_mem:-?} MHz)"
echo "$PROG: GPU $gpu ($uuid) locked: SM at $target MHz (reads ${readback:-?} MHz), $mem_text; state in $state_file"
