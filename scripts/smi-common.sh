# Sourced by lock-gpu-clock.sh and reset-gpu-clock.sh (after they set PROG): usage from the
# header comment, the one-line usage error, nvidia-smi called with a timeout (and stopped on
# Ctrl-C, SIGTERM or SIGHUP), the profiling lock, and the clock records.

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
    smi_tmp="$(mktemp "${TMPDIR:-/tmp}/app-smi-out.XXXXXX")"
}

# -- Exit and signals. A script defines on_exit_hook (any exit) and on_interrupt_hook (Ctrl-C,
# SIGTERM, SIGHUP: after the nvidia-smi call in flight is stopped; it prints what was left).
smi_tmp=""
on_exit_hook() { :; }
on_interrupt_hook() { :; }
on_exit() {
    trap '' INT TERM HUP                 # a signal during the exit's own clean-up (a reset) must not stop it
    on_exit_hook || true
    [[ -z "$smi_tmp" ]] || rm -f "$smi_tmp"
}
on_signal() { # NAME STATUS
    trap '' INT TERM HUP                 # the clean-up runs to its end
    smi_stop
    on_interrupt_hook "$1" || true
    exit "$2"
}
trap on_exit EXIT
trap 'on_signal INT 130' INT
trap 'on_signal TERM 143' TERM
trap 'on_signal HUP 129' HUP

# smi_exec ARGS...: run nvidia-smi under timeout; its output in $smi_out, its exit status in
# $smi_rc (124: it hung). It runs in the background and is waited for, so a signal is acted on at
# once (a foreground command would delay the trap until it ends); timeout gives it a process group
# of its own, which a terminal's Ctrl-C does not reach: smi_stop stops it.
smi_out=""
smi_rc=0
smi_pid=""
smi_exec() {
    smi_rc=0
    : >"$smi_tmp"
    timeout "$smi_timeout" "$smi" "$@" >"$smi_tmp" 2>&1 &
    smi_pid=$!
    wait "$smi_pid" || smi_rc=$?
    smi_pid=""
    smi_out="$(cat "$smi_tmp")"
}

# smi_try ARGS...: smi_exec; a hang exits 1.
smi_try() {
    smi_exec "$@"
    if ((smi_rc == 124)); then
        echo "$PROG: 'nvidia-smi $*' did not answer within $smi_timeout s and was stopped; check the driver (is the GPU hung?) or raise SMI_TIMEOUT" >&2
        exit 1
    fi
}

# group_alive PGID: does any process of the group still run (a zombie does not)?
group_alive() {
    cat /proc/[0-9]*/stat 2>/dev/null | awk -v pg="$1" '
        { sub(/^.*\) /, ""); split($0, f, " "); if (f[3] == pg && f[1] != "Z") { found = 1; exit } }
        END { exit !found }'
}

# smi_stop: stop the nvidia-smi call in flight, if any (SIGTERM to its process group, SIGKILL
# after 5 s), and wait until it is gone: a clock change it was making has landed or never will.
smi_stop() {
    local pid="$smi_pid" i
    [[ -n "$pid" ]] || return 0
    smi_pid=""
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        group_alive "$pid" || kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 10 * smi_timeout; i++)); do      # a call stuck in the driver ends when the driver answers
        group_alive "$pid" || break
        sleep 0.1
    done
    wait "$pid" 2>/dev/null || true
}

first_line() { printf '%s\n' "$1" | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' | grep -m1 -v '^$' || true; }

# smi_no_gpu: did the last call fail because there is no GPU of that index?
smi_no_gpu() {
    ((smi_rc == 6)) || printf '%s\n' "$smi_out" | grep -qiE 'no devices were found|invalid (device|gpu)|not a valid (gpu|index)'
}

# smi_needs_root: did the last call fail for want of privileges?
smi_needs_root() {
    ((smi_rc == 4)) || printf '%s\n' "$smi_out" | grep -qi 'insufficient permissions'
}

# smi_failure KIND ARGS...: the one line for a failed call: the command, its exit status, its
# first line of output, and the fix that fits (KIND: query or change).
smi_failure() {
    local kind="$1" reason fix
    shift
    reason="$(first_line "$smi_out")"
    if smi_no_gpu; then
        fix="there is no GPU $gpu: nvidia-smi -L lists the GPUs"
    elif [[ "$kind" == change ]] && smi_needs_root; then
        fix="changing clocks or persistence needs root: run it as root or with sudo (sudo bash $BY)"
    elif [[ "$kind" == query ]]; then
        fix="check the NVIDIA driver and the GPU index (nvidia-smi -L)"
    else
        fix="check the NVIDIA driver (nvidia-smi -q -d CLOCK shows what the GPU supports)"
    fi
    echo "$PROG: 'nvidia-smi $*' failed (exit $smi_rc): ${reason:-no output}; $fix" >&2
}

# -- The profiling lock (truth rule 7: one profiling at a time per GPU), taken so that no clock
# change lands in someone's profile. The same file src/app/runtime/lock.py locks:
# app-kernel-profile-gpu-<UUID>.lock in $APP_LOCK_DIR where that is set, else in the user's own
# folder: $XDG_RUNTIME_DIR/app-kernel where that runtime folder is the user's and private, else
# ~/.cache/app-kernel/locks. A script run with sudo checks the folders of the user who ran sudo
# ($SUDO_UID: /run/user/UID and the home folder) as well as its own; all that exist are locked.
# (sudo drops APP_LOCK_DIR: keep it with sudo APP_LOCK_DIR=... bash scripts/....)

# private_dir_of DIR UID: a folder owned by UID without group or other access (lock.py's _private).
private_dir_of() {
    local st
    [[ -d "$1" ]] || return 1
    st="$(stat -L -c '%u %a' -- "$1" 2>/dev/null)" || return 1
    [[ "${st% *}" == "$2" ]] && (((8#${st#* } & 8#077) == 0))
}

# profile_lock_dirs: the lock folders this host's profiles of these users may use, one a line.
profile_lock_dirs() {
    if [[ -n "${APP_LOCK_DIR:-}" ]]; then
        printf '%s\n' "$APP_LOCK_DIR"
        return 0
    fi
    local uid runtime home
    for uid in "$(id -u)" ${SUDO_UID:+"$SUDO_UID"}; do
        for runtime in "${XDG_RUNTIME_DIR:-}" "/run/user/$uid"; do
            if [[ -n "$runtime" ]] && private_dir_of "$runtime" "$uid"; then
                printf '%s\n' "$runtime/app-kernel"
            fi
        done
        if [[ "$uid" == "$(id -u)" && -n "${HOME:-}" ]]; then
            printf '%s\n' "$HOME/.cache/app-kernel/locks"
        fi
        home="$(getent passwd "$uid" 2>/dev/null | cut -d: -f6)" || true
        [[ -z "$home" ]] || printf '%s\n' "$home/.cache/app-kernel/locks"
    done | awk '!seen[$0]++'
}

# lock_key UUID: the tool's key for this GPU (lock.py's device_key: gpu-GPU-<lower-case hex>).
lock_key() { printf 'gpu-GPU-%s' "$(printf '%s' "${1#GPU-}" | tr 'A-F' 'a-f')"; }

# lock_holder FD: the pid holding the flock of the file open at FD (/proc/locks, else the pid
# written in the file; a live one first), else '?'.
lock_holder() {
    local st ino dev key pid
    st="$(stat -L -c '%i %d' "/proc/$$/fd/$1" 2>/dev/null)" || { echo "?"; return 0; }
    ino="${st% *}"
    dev="${st#* }"
    key="$(printf '%02x:%02x:%s' $(((dev >> 8) & 0xfff)) $(((dev & 0xff) | ((dev >> 12) & 0xfff00))) "$ino")"
    for pid in $(awk -v k="$key" -v i="$ino" '$2 == "FLOCK" && ($6 == k || $6 ~ (":" i "$")) { print $5 }' /proc/locks 2>/dev/null) \
               $(head -c 64 "/proc/$$/fd/$1" 2>/dev/null | tr -cd '0-9\n' | head -n1); do
        if [[ "$pid" =~ ^[1-9][0-9]*$ && -d "/proc/$pid" ]]; then
            echo "$pid"
            return 0
        fi
    done
    echo "?"
}

# open_lock FILE: an fd of the lock FILE in $lock_fd (1: no usable file). A missing one is made
# (not under --dry-run) as lock.py would make it, so that a profile starting now waits for us:
# in $APP_LOCK_DIR mode 0666, else the folder owner's and 0600. Made with O_EXCL and changed
# through our own fd: nothing is followed or replaced.
lock_fd=""
open_lock() {
    local file="$1" owner
    lock_fd=""
    if ((!dry_run)) && [[ ! -e "$file" && ! -L "$file" ]]; then
        set -o noclobber
        if { exec {lock_fd}>"$file"; } 2>/dev/null; then
            set +o noclobber
            if [[ -n "${APP_LOCK_DIR:-}" ]]; then
                chmod 0666 "/proc/$$/fd/$lock_fd" 2>/dev/null || true
            else
                owner="$(stat -c '%u:%g' -- "$(dirname -- "$file")")" && chown "$owner" "/proc/$$/fd/$lock_fd" 2>/dev/null || true
                chmod 0600 "/proc/$$/fd/$lock_fd" 2>/dev/null || true
            fi
            return 0
        fi
        set +o noclobber
    fi
    [[ -f "$file" && ! -L "$file" ]] || return 1            # none, or not one a profile can hold (lock.py refuses it)
    { exec {lock_fd}<"$file"; } 2>/dev/null || { lock_fd=""; return 1; }
    if [[ ! -f "/proc/$$/fd/$lock_fd" ]]; then                # swapped for something else meanwhile
        exec {lock_fd}<&-
        lock_fd=""
        return 1
    fi
}

# profile_lock_take UUID: hold this GPU's profiling lock in every folder profile_lock_dirs names
# (UUID empty: every GPU's lock there) until the script exits; exit 75 where a profile holds one.
profile_lock_take() {
    local uuid="$1" dir file pid uid_text
    local -a files=()
    if ! command -v flock >/dev/null 2>&1; then
        echo "$PROG: flock not found (util-linux); without it no profile on GPU $gpu can be protected from this clock change: install util-linux" >&2
        exit 2
    fi
    while IFS= read -r dir; do
        [[ -d "$dir" && ! -L "$dir" ]] || continue         # no folder: no profile uses it
        if [[ -n "$uuid" ]]; then
            files+=("$dir/app-kernel-profile-$(lock_key "$uuid").lock")
        else
            shopt -s nullglob
            files+=("$dir"/app-kernel-profile-gpu-*.lock)
            shopt -u nullglob
        fi
    done < <(profile_lock_dirs)
    for file in ${files[@]+"${files[@]}"}; do
        open_lock "$file" || continue
        if ! flock -n "$lock_fd"; then
            pid="$(lock_holder "$lock_fd")"
            uid_text=""
            [[ "$pid" == "?" ]] || uid_text=" (uid $(stat -c %u "/proc/$pid" 2>/dev/null || echo '?'))"
            echo "$PROG: GPU $gpu is being profiled by pid $pid$uid_text; wait for it or stop it (nothing was changed; its lock: $file)" >&2
            exit 75
        fi
    done
}

# -- The lock records, one file per GPU named by its UUID: $APP_CLOCK_STATE (default
# /tmp/app-kernel-clock-state.json) with the lower-case UUID before its .json, e.g.
# /tmp/app-kernel-clock-state.gpu-1904f39e-....json, so locking one GPU never erases another's
# record. A file at $APP_CLOCK_STATE itself is an older single record (one GPU): still read.
state_base="${APP_CLOCK_STATE:-/tmp/app-kernel-clock-state.json}"
state_stem="${state_base%.json}"
state_file_for() { printf '%s.%s.json' "$state_stem" "${1,,}"; }

# drop_records UUID INDEX [quiet]: remove the records of this GPU (by UUID; by index where the
# UUID is unknown), saying which others are left (not when quiet); under --dry-run only say so.
# A record says the clocks are locked: it goes as soon as they are not (or no longer as recorded).
drop_records() {
    local gpu_uuid="$1" index="$2" quiet="${3:-}" record state_gpu state_uuid other state_desc this_desc
    local -a records
    shopt -s nullglob
    records=("$state_base" "$state_stem".gpu-*.json)
    shopt -u nullglob
    for record in "${records[@]}"; do
        [[ -e "$record" ]] || continue
        state_gpu="$(sed -n 's/.*"gpu"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$record" | head -n1)"
        state_uuid="$(sed -n 's/.*"uuid"[[:space:]]*:[[:space:]]*"\(GPU-[0-9a-fA-F-]*\)".*/\1/p' "$record" | head -n1)"
        if [[ -n "$state_uuid" && -n "$gpu_uuid" ]]; then
            other=$([[ "${state_uuid,,}" != "${gpu_uuid,,}" ]] && echo 1 || echo 0)
            state_desc="$state_uuid"; this_desc="GPU $index ($gpu_uuid)"
        else
            other=$([[ -n "$state_gpu" && "$((10#$state_gpu))" != "$index" ]] && echo 1 || echo 0)
            state_desc="GPU $state_gpu"; this_desc="GPU $index"
        fi
        if ((other)); then
            [[ -n "$quiet" ]] || echo "$PROG: $record records $state_desc, not $this_desc: left in place"
        elif ((dry_run)); then
            echo "[dry-run] would remove $record"
        else
            rm -f "$record"
        fi
    done
}
