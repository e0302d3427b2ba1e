# Shared by slurm/up.sh and slurm/down.sh (sourced): where make slurm-up's Slurm keeps its
# state, pid files and logs, and how the scripts report.
STATE=/var/lib/accordion-bench-slurm     # slurmctld's state, slurmd's spool, the MariaDB data
RUN=/run/accordion-bench-slurm           # pid files, the MariaDB socket
LOGS=/var/log/accordion-bench-slurm      # every daemon's log, the job completion log
CONF=/etc/slurm                          # where Slurm's commands look for slurm.conf
DB_PORT=${SLURM_DB_PORT:-3307}           # the private MariaDB listens on 127.0.0.1 only
MARKER="written by accordion-bench's make slurm-up (slurm/up.sh): make slurm-down stops it"
PACKAGES=(slurm-wlm slurmdbd munge mariadb-server)
WAIT_S=60                                # for each daemon to answer

# fail <what>: one line on stderr, exit status 1.
fail() {
    echo "${SCRIPT}: $*" >&2
    exit 1
}

# need_root: one line and exit 1 unless this runs as root.
need_root() {
    [[ $(id -u) == 0 ]] || fail "needs root (Slurm's daemons run as root, and make slurm-up" \
        "installs Debian packages): run it as root or with sudo"
}

# alive <pid file>: the process the pid file names is running.
alive() {
    [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

# ours <file>: the file was written by make slurm-up.
ours() {
    grep -qF "$MARKER" "$1" 2>/dev/null
}
