# Sourced by lock-gpu-clock.sh and reset-gpu-clock.sh (after they set PROG): usage from the
# header comment, the one-line usage error, and nvidia-smi called with a timeout.

usage() { # the header comment, without the '# '
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

die_usage() {
    echo "$PROG: $1 (see --help)" >&2
    exit 64
}

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

# smi_setup: find nvidia-smi ($NVIDIA_SMI, else PATH; exit 2 without it) and read SMI_TIMEOUT.
smi_setup() {
    smi="${NVIDIA_SMI:-nvidia-smi}"
    if ! command -v "$smi" >/dev/null 2>&1; then
        echo "$PROG: nvidia-smi not found ('$smi'); install the NVIDIA driver or set NVIDIA_SMI to its path" >&2
        exit 2
    fi
    smi_timeout="${SMI_TIMEOUT:-30}"
    is_uint "$smi_timeout" && ((10#$smi_timeout > 0)) || die_usage "SMI_TIMEOUT must be a positive integer, got '$smi_timeout'"
}

# smi_try ARGS...: run nvidia-smi, output in $smi_out and exit status in $smi_rc; a hang exits 1.
smi_out=""
smi_rc=0
smi_try() {
    smi_rc=0
    smi_out="$(timeout "$smi_timeout" "$smi" "$@" 2>&1)" || smi_rc=$?
    if ((smi_rc == 124)); then
        echo "$PROG: 'nvidia-smi $*' did not answer within $smi_timeout s and was stopped; check the driver (is the GPU hung?) or raise SMI_TIMEOUT" >&2
        exit 1
    fi
}

first_line() { printf '%s\n' "$1" | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' | grep -m1 -v '^$' || true; }

# The lock records, one file per GPU named by its UUID: $APP_CLOCK_STATE (default
# /tmp/app-kernel-clock-state.json) with the lower-case UUID before its .json, e.g.
# /tmp/app-kernel-clock-state.gpu-1904f39e-....json, so locking one GPU never erases another's
# record. A file at $APP_CLOCK_STATE itself is an older single record (one GPU): still read.
state_base="${APP_CLOCK_STATE:-/tmp/app-kernel-clock-state.json}"
state_stem="${state_base%.json}"
state_file_for() { printf '%s.%s.json' "$state_stem" "${1,,}"; }
