#!/usr/bin/env bash
# A private one-node SLURM cluster on this machine, for the tests (tests/test_slurm.py) and for trying a
# `hydra/launcher=submitit_slurm` sweep by hand (docs/guides/many-machines.md):
#
#   scripts/slurm_cluster.sh start DIR    start the daemons; wait until the node is idle (again: a no-op)
#   scripts/slurm_cluster.sh status DIR   the daemons and the node's state (exit 0 when the node takes jobs)
#   scripts/slurm_cluster.sh stop DIR     cancel the cluster's jobs, stop the daemons and wait until they have exited
#
# Everything lives under DIR: slurm.conf, the munge key and socket, slurmctld's state, slurmd's spool, the accounting
# database, the logs and the pid files. Client commands (sbatch, squeue, scancel, sacct, sinfo) reach this cluster
# with SLURM_CONF=DIR/slurm.conf, which `start` prints as its last line. Runs as root (SlurmUser=root: no slurm user,
# no systemd, no cgroups, so it works in a container), with Debian's packages:
#
#   apt-get install --no-install-recommends slurm-wlm munge slurmdbd mariadb-server
#
# slurmdbd and mariadb-server give the cluster accounting, so that `sacct` answers: submitit reads a job's state with
# sacct, and without it a job that ends without writing its result (cancelled while pending, killed at its time limit
# or by SIGKILL) is never seen to end: whoever waits for it waits forever. Without those two packages the cluster
# starts without accounting (sacct fails, submitit waits for result files alone), unless SLURM_CLUSTER_ACCOUNTING=yes.
#
# Settings: SLURM_CLUSTER_ACCOUNTING (auto: when slurmdbd and mariadbd are installed, the default; yes; no),
# SLURM_CLUSTER_TIMEOUT (seconds to wait for each daemon and the node, default 60), SLURM_CLUSTER_NAME (nmttest).
set -euo pipefail

usage() { echo "usage: $0 start|stop|status DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
action=$1
mkdir -p "$2"
dir=$(cd "$2" && pwd)
conf=$dir/slurm.conf
timeout=${SLURM_CLUSTER_TIMEOUT:-60}
node=$(hostname -s)
cluster=${SLURM_CLUSTER_NAME:-nmttest}
export SLURM_CONF=$conf  # the client commands' and slurmdbd's (it reads slurmdbd.conf from the same folder)
db_options=(--no-defaults "--datadir=$dir/db/data" --innodb-log-file-size=8M --innodb-buffer-pool-size=32M)

die() { echo "slurm_cluster.sh: $*" >&2; exit 1; }

alive() {  # alive PIDFILE: the process in PIDFILE is running
    [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

node_state() {  # the node's state as sinfo prints it (idle, mix, alloc, down*, ...), or nothing
    timeout 10 sinfo -h -N -n "$node" -o '%T' 2>/dev/null | head -1 || true
}

wait_for() {  # wait_for WHAT LOG COMMAND...: run COMMAND every half second until it succeeds, or fail naming LOG
    local what=$1 log=$2 deadline=$((SECONDS + timeout))
    shift 2
    until timeout 10 "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || die "$what not ready after $timeout s; see $log"
        sleep 0.5
    done
}

free_ports() {  # free_ports N: N distinct free TCP ports of 127.0.0.1, one a line
    python3 -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for sock in socks:
    sock.bind(("127.0.0.1", 0))
print("\n".join(str(sock.getsockname()[1]) for sock in socks))' "$1"
}

with_accounting() {  # whether the cluster keeps accounting (slurmdbd on a private MariaDB)
    local have=yes
    command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null && command -v mariadb-install-db >/dev/null \
        || have=no
    case ${SLURM_CLUSTER_ACCOUNTING:-auto} in
        auto) [ $have = yes ] ;;
        yes) [ $have = yes ] \
                 || die "SLURM_CLUSTER_ACCOUNTING=yes needs slurmdbd and mariadbd: apt-get install slurmdbd mariadb-server" ;;
        no) return 1 ;;
        *) die "SLURM_CLUSTER_ACCOUNTING is auto, yes or no, not '$SLURM_CLUSTER_ACCOUNTING'" ;;
    esac
}

write_conf() {
    local cpus mem_kb ctld_port slurmd_port dbd_port db_port accounting=accounting_storage/none
    cpus=$(nproc)
    mem_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
    { read -r ctld_port; read -r slurmd_port; read -r dbd_port; read -r db_port; } < <(free_ports 4)
    rm -f "$dir/slurmdbd.conf"
    if with_accounting; then
        accounting=accounting_storage/slurmdbd
        echo "$db_port" >"$dir/db/port"
        cat >"$dir/slurmdbd.conf" <<EOF
# Written by scripts/slurm_cluster.sh: the accounting daemon of the cluster in $dir, on a private MariaDB
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
DbdHost=$node
DbdAddr=127.0.0.1
DbdPort=$dbd_port
SlurmUser=root
LogFile=$dir/log/slurmdbd.log
PidFile=$dir/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=root
StorageLoc=slurm_acct_db
EOF
        chmod 0600 "$dir/slurmdbd.conf"  # slurmdbd refuses a readable one
    fi
    cat >"$conf" <<EOF
# Written by scripts/slurm_cluster.sh: a one-node cluster whose files all live in $dir
ClusterName=$cluster
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups, no systemd: processes are tracked by their parent, tasks are not bound to cores
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
AccountingStorageType=$accounting
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$dbd_port
AccountingStoragePass=$dir/munge/munge.socket
MpiDefault=none
MailProg=/bin/true
SwitchType=switch/none
# one job per core: two one-CPU jobs run at once on two cores
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$((mem_kb / 1024)) State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
}

start_munge() {
    alive "$dir/run/munged.pid" && return 0
    local key=$dir/munge/munge.key socket=$dir/munge/munge.socket
    [ ${#socket} -lt 100 ] || die "DIR is too long for munge's socket path ($socket): use a shorter one"
    if [ ! -s "$key" ]; then
        mungekey --create --keyfile="$key" 2>/dev/null || dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
    fi
    chmod 0600 "$key"
    # -f: munged refuses root-owned files and sockets otherwise
    munged -f --socket="$socket" --key-file="$key" --pid-file="$dir/run/munged.pid" \
        --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munged.seed" 2>>"$dir/log/munged.log" \
        || die "munged did not start; see $dir/log/munged.log"
    wait_for "munged" "$dir/log/munged.log" test -S "$socket"
}

start_accounting() {
    local db_port
    db_port=$(cat "$dir/db/port")
    if ! alive "$dir/run/mariadbd.pid"; then
        if [ ! -d "$dir/db/data/mysql" ]; then
            mkdir -p "$dir/db/data"
            mariadb-install-db "${db_options[@]}" --user=root --auth-root-authentication-method=normal \
                --skip-test-db >"$dir/log/mariadb-install.log" 2>&1 \
                || die "mariadb-install-db failed; see $dir/log/mariadb-install.log"
        fi
        # root without a password, from 127.0.0.1 only
        mariadbd "${db_options[@]}" --user=root --bind-address=127.0.0.1 --port="$db_port" \
            --socket="$dir/db/mysql.sock" --pid-file="$dir/run/mariadbd.pid" --log-error="$dir/log/mariadbd.log" \
            --skip-name-resolve >/dev/null 2>&1 &
        wait_for "MariaDB" "$dir/log/mariadbd.log" \
            mariadb --no-defaults -h 127.0.0.1 -P "$db_port" -u root -e 'SELECT 1'
    fi
    if ! alive "$dir/run/slurmdbd.pid"; then
        slurmdbd 2>>"$dir/log/slurmdbd.log" || die "slurmdbd did not start; see $dir/log/slurmdbd.log"
    fi
    wait_for "slurmdbd" "$dir/log/slurmdbd.log" sacctmgr -n list cluster
    # the cluster (and with it the root account and user) before slurmctld registers with slurmdbd
    if [ -z "$(sacctmgr -n -P list cluster "$cluster" format=cluster 2>/dev/null)" ]; then
        sacctmgr -i add cluster "$cluster" >>"$dir/log/slurmdbd.log" 2>&1 \
            || die "sacctmgr could not add the cluster; see $dir/log/slurmdbd.log"
    fi
}

start() {
    command -v slurmctld >/dev/null && command -v munged >/dev/null \
        || die "slurmctld or munged is missing: apt-get install slurm-wlm munge"
    mkdir -p "$dir"/{munge,state,spool,run,log,db}
    chmod 0711 "$dir/munge"  # the socket is reachable, the key (0600) is not
    if alive "$dir/run/slurmctld.pid" && alive "$dir/run/slurmd.pid"; then
        case $(node_state) in idle*|mix*|alloc*) echo "slurm_cluster.sh: already running in $dir"
                                                  echo "export SLURM_CONF=$conf"; return 0 ;; esac
    fi
    local name running=no
    for name in munged mariadbd slurmdbd slurmctld slurmd; do
        ! alive "$dir/run/$name.pid" || running=yes
    done
    [ $running = yes ] || write_conf  # fresh ports at each cold start; a half-running cluster keeps its files
    start_munge
    [ ! -f "$dir/slurmdbd.conf" ] || start_accounting
    alive "$dir/run/slurmctld.pid" || slurmctld -f "$conf" -i 2>>"$dir/log/slurmctld.log" \
        || die "slurmctld did not start; see $dir/log/slurmctld.log"
    alive "$dir/run/slurmd.pid" || slurmd -f "$conf" -N "$node" 2>>"$dir/log/slurmd.log" \
        || die "slurmd did not start; see $dir/log/slurmd.log"
    local deadline=$((SECONDS + timeout)) state=
    while [ $SECONDS -lt $deadline ]; do
        state=$(node_state)
        case $state in
            idle*|mix*|alloc*) echo "slurm_cluster.sh: node $node is $state (partition debug) in $dir"
                               echo "export SLURM_CONF=$conf"; return 0 ;;
            down*|drain*) scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true ;;
        esac
        sleep 0.5
    done
    die "node $node not idle after $timeout s (state: ${state:-no answer from slurmctld}); see $dir/log/slurmctld.log and $dir/log/slurmd.log"
}

stop_pid() {  # stop_pid PIDFILE: SIGTERM, SIGKILL after 15 s; waits until the process has exited
    alive "$1" || { rm -f "$1"; return 0; }
    local pid waited=0
    pid=$(cat "$1")
    kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do
        if [ $waited -eq 30 ]; then kill -KILL "$pid" 2>/dev/null || true; fi
        [ $waited -lt 40 ] || die "process $pid ($1) did not exit"
        sleep 0.5; waited=$((waited + 1))
    done
    rm -f "$1"
}

stop() {
    [ -f "$conf" ] || { echo "slurm_cluster.sh: no cluster in $dir"; return 0; }
    if alive "$dir/run/slurmctld.pid"; then  # the jobs first, so that no job outlives its cluster
        timeout 10 scancel --full --user="$(id -un)" 2>/dev/null || true
        local waited=0
        while [ -n "$(timeout 10 squeue -h -o %i 2>/dev/null || true)" ] && [ $waited -lt 30 ]; do
            sleep 0.5; waited=$((waited + 1))
        done
    fi
    local name
    for name in slurmd slurmctld slurmdbd mariadbd munged; do
        stop_pid "$dir/run/$name.pid"
    done
    echo "slurm_cluster.sh: stopped the cluster in $dir"
}

status() {
    local name names=(munged slurmctld slurmd) ok=0 state
    [ ! -f "$dir/slurmdbd.conf" ] || names=(munged mariadbd slurmdbd slurmctld slurmd)
    for name in "${names[@]}"; do
        if alive "$dir/run/$name.pid"; then echo "$name: running (pid $(cat "$dir/run/$name.pid"))"
        else echo "$name: not running"; ok=1; fi
    done
    state=$(node_state)
    echo "node $node: ${state:-no answer from slurmctld}"
    case $state in idle*|mix*|alloc*) ;; *) ok=1 ;; esac
    [ $ok -ne 0 ] || echo "export SLURM_CONF=$conf"
    return $ok
}

case $action in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) usage ;;
esac
