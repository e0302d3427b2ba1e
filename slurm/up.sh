#!/usr/bin/env bash
# make slurm-up: a single-node Slurm on this machine from Debian's packages, for launcher=slurm
# and make test-slurm (docs/slurm.md). As root: installs slurm-wlm, slurmdbd, munge and
# mariadb-server if missing; writes /etc/slurm/slurm.conf and slurmdbd.conf from the templates
# beside this script with this machine's CPUs and memory (`slurmd -C`); starts munged, a MariaDB
# of its own (127.0.0.1 only), slurmdbd (accounting: sacct answers), slurmctld and slurmd, and
# waits until each answers. Idempotent: what already runs is left running. Logs in $LOGS.
set -euo pipefail
SCRIPT="make slurm-up"
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=slurm/common.sh
source "$HERE/common.sh"

# wait_for <seconds> <what> <log> <command...>: until the command succeeds, or fail.
wait_for() {
    local seconds=$1 what=$2 log=$3
    shift 3
    for ((i = 0; i < seconds * 4; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.25
    done
    fail "$what did not answer within ${seconds} s; see $log"
}

install_packages() {
    local missing=0
    for cmd in slurmctld slurmd slurmdbd sacct munged mariadbd mariadb-install-db; do
        command -v "$cmd" >/dev/null || missing=1
    done
    ((missing)) || return 0
    command -v apt-get >/dev/null || fail "needs Debian's packages ${PACKAGES[*]}, and" \
        "apt-get is not here: install them (Slurm 22.05 or later) and rerun"
    local log=/tmp/accordion-bench-slurm-apt.log
    echo "installing ${PACKAGES[*]} (log: $log)"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y --no-install-recommends "${PACKAGES[@]}" >"$log" 2>&1; then
        apt-get update >>"$log" 2>&1 && apt-get install -y --no-install-recommends \
            "${PACKAGES[@]}" >>"$log" 2>&1 || fail "could not install ${PACKAGES[*]} with" \
            "apt-get: $(grep -E '^E:' "$log" | tail -1) (log: $log)"
    fi
}

# render <template> <destination>: the template with this machine's values, written only if
# the destination is absent or ours (never over a Slurm configuration of someone else).
render() {
    local template=$1 destination=$2
    if [[ -e $destination ]] && ! ours "$destination"; then
        fail "$destination exists and was not written by make slurm-up: this machine has a" \
            "Slurm of its own; use it (docs/slurm.md, 'On a real cluster') or move the file away"
    fi
    sed -e "s|@MARKER@|$MARKER|" -e "s|@NODE_LINE@|$NODE_LINE|" -e "s|@STATE@|$STATE|g" \
        -e "s|@RUN@|$RUN|g" -e "s|@LOGS@|$LOGS|g" -e "s|@DB_PORT@|$DB_PORT|g" \
        -e "s|@DB_PASS@|$DB_PASS|g" -e "s|@NAME@|$NAME|g" "$HERE/$template" >"$destination.new"
    chmod 600 "$destination.new"
    if cmp -s "$destination.new" "$destination"; then
        rm "$destination.new"
    else
        mv "$destination.new" "$destination"
        CHANGED=1
    fi
}

start_munge() {
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        return 0
    fi
    [[ -s /etc/munge/munge.key ]] || {
        mungekey --create --keyfile /etc/munge/munge.key
        chown munge:munge /etc/munge/munge.key
    }
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- munged
    touch "$RUN/munged.ours" # make slurm-down stops only a munged it started
    wait_for "$WAIT_S" munged /var/log/munge/munged.log \
        bash -c 'munge -n | unmunge'
}

start_mariadb() {
    local sock="$RUN/mysql/mysqld.sock"
    if [[ ! -d $STATE/mysql/mysql ]]; then
        mariadb-install-db --no-defaults --user=mysql --datadir="$STATE/mysql" \
            --auth-root-authentication-method=socket --skip-test-db \
            >"$LOGS/mariadb-install.log" 2>&1 || fail "could not create the accounting" \
            "database in $STATE/mysql; see $LOGS/mariadb-install.log"
    fi
    install -d -o mysql -g mysql "$RUN/mysql"
    if ! alive "$RUN/mysql/mariadb.pid"; then
        setsid mariadbd --no-defaults --user=mysql --datadir="$STATE/mysql" --socket="$sock" \
            --port="$DB_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
            --pid-file="$RUN/mysql/mariadb.pid" --log-error="$LOGS/mariadb.log" \
            --innodb-buffer-pool-size=16M </dev/null >/dev/null 2>&1 &
    fi
    wait_for "$WAIT_S" "MariaDB (127.0.0.1:$DB_PORT)" "$LOGS/mariadb.log" \
        mariadb-admin --no-defaults --socket="$sock" ping
    mariadb --no-defaults --socket="$sock" -u root -e "
        CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
        ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" \
        || fail "could not give slurmdbd its database user; see $LOGS/mariadb.log"
}

start_slurm() {
    alive "$RUN/slurmdbd.pid" || slurmdbd
    wait_for "$WAIT_S" slurmdbd "$LOGS/slurmdbd.log" sacctmgr -n show cluster
    if ! sacctmgr -n -P show cluster format=cluster | grep -qx accordion; then
        sacctmgr -i add cluster accordion >/dev/null
    fi
    alive "$RUN/slurmctld.pid" || slurmctld
    wait_for "$WAIT_S" slurmctld "$LOGS/slurmctld.log" bash -c 'scontrol ping | grep -q UP'
    alive "$RUN/slurmd.pid" || slurmd
    # ReturnToService=2: a node that was down comes back as soon as its slurmd registers.
    wait_for "$WAIT_S" "slurmd ($NAME)" "$LOGS/slurmd.log" \
        bash -c "sinfo -h -N -n $NAME -o %t | grep -Eq '^(idle|mix|alloc)'"
    wait_for "$WAIT_S" sacct "$LOGS/slurmdbd.log" sacct -n -X -o JobID
}

main() {
    need_root
    install_packages
    install -d -m 0755 "$STATE" "$STATE/slurmctld" "$STATE/slurmd" "$RUN" "$LOGS" "$CONF"
    NODE_LINE=$(slurmd -C | head -1)
    NAME=$(sed -E 's/^NodeName=([^ ]+).*/\1/' <<<"$NODE_LINE")
    [[ -s $STATE/db.pass ]] || (umask 077 && head -c 18 /dev/urandom | base64 | tr -d '/+=' \
        >"$STATE/db.pass")
    DB_PASS=$(cat "$STATE/db.pass")
    CHANGED=0
    render slurm.conf.in "$CONF/slurm.conf"
    chmod 644 "$CONF/slurm.conf" # read by every Slurm command
    render slurmdbd.conf.in "$CONF/slurmdbd.conf"
    if ((CHANGED)) && alive "$RUN/slurmctld.pid"; then
        echo "the configuration changed: restarting Slurm's daemons"
        "$HERE/down.sh" --keep-munge
    fi
    start_munge
    start_mariadb
    start_slurm
    echo "Slurm is up: cluster accordion, node ${NODE_LINE#NodeName=}, partition debug;" \
        "sacct answers; logs in $LOGS; make slurm-down stops it"
}

main "$@"
