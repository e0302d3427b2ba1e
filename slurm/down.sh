#!/usr/bin/env bash
# make slurm-down: stop make slurm-up's Slurm (its jobs are cancelled first), its MariaDB, and
# munged if slurm-up started it. Configuration, job records and logs stay: make slurm-up starts
# the same cluster again. Idempotent. (--keep-munge: leave munged running, for slurm-up.)
set -euo pipefail
SCRIPT="make slurm-down"
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=slurm/common.sh
source "$HERE/common.sh"

# stop <name> <pid file>: SIGTERM, then wait up to 30 s for the process to end.
stop() {
    local name=$1 pidfile=$2 pid
    alive "$pidfile" || return 0
    pid=$(cat "$pidfile")
    kill "$pid"
    for ((i = 0; i < 120; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.25
    done
    fail "$name (pid $pid) did not stop within 30 s of SIGTERM"
}

main() {
    need_root
    if ! ours "$CONF/slurm.conf"; then
        echo "no Slurm of make slurm-up here: nothing to stop"
        return 0
    fi
    if alive "$RUN/slurmctld.pid"; then
        local jobs
        jobs=$(squeue -h -o %i 2>/dev/null || true)
        if [[ -n $jobs ]]; then
            echo "cancelling jobs:" $jobs
            # shellcheck disable=SC2086
            scancel $jobs || true
            for ((i = 0; i < 120; i++)); do
                [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break
                sleep 0.25
            done
        fi
    fi
    stop slurmd "$RUN/slurmd.pid"
    stop slurmctld "$RUN/slurmctld.pid"
    stop slurmdbd "$RUN/slurmdbd.pid"
    stop MariaDB "$RUN/mysql/mariadb.pid"
    if [[ ${1:-} != --keep-munge && -f $RUN/munged.ours ]]; then
        stop munged /run/munge/munged.pid
        rm -f "$RUN/munged.ours"
    fi
    echo "Slurm is down (configuration in $CONF, job records in $STATE, logs in $LOGS)"
}

main "$@"
