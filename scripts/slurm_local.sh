#!/usr/bin/env bash
# scripts/slurm_local.sh start|stop|status: a single-node Slurm cluster on this machine (slurmctld
# + slurmd on localhost, authenticated by munge), for the e2e tests of ranks started by
# `srun --mpi=pmix`. Needs root and Debian's slurmctld, slurmd, slurm-client and munge
# (scripts/setup.sh installs them). Everything lives in $OASES_SLURM_DIR (default
# /tmp/oases-slurm): the generated slurm.conf (this machine's CPUs and memory, from `slurmd -C`),
# state, spool, logs and pid files; the system's /etc/slurm is not touched.
#
#   start   starts munged (unless one runs), slurmctld and slurmd, and waits until the node takes
#           jobs; prints the line to use it: export SLURM_CONF=$OASES_SLURM_DIR/slurm.conf.
#           Exits 1 with the reason when the cluster cannot start.
#   stop    stops the daemons it started (munged only if it started it).
#
# The configuration kills a job step as soon as one of its tasks exits non-zero or is killed
# (KillOnBadExit=1), so a dead rank stops the job at once, as mpirun does.
set -uo pipefail
DIR=${OASES_SLURM_DIR:-/tmp/oases-slurm}
CONF=$DIR/slurm.conf
WHAT=${1:-start}

die() {
  echo "slurm_local: $*" >&2
  exit 1
}

pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop() {
  # jobs first (their steps would keep slurmd busy), then the daemons: TERM, KILL after 5 s
  if pid_alive "$DIR/slurmctld.pid"; then
    SLURM_CONF=$CONF scancel --quiet --full --signal=KILL --user="$(id -un)" 2>/dev/null
    for _ in $(seq 50); do
      [[ -z $(SLURM_CONF=$CONF squeue -h 2>/dev/null) ]] && break
      sleep 0.1
    done
  fi
  for d in slurmd slurmctld; do
    if pid_alive "$DIR/$d.pid"; then
      local pid
      pid=$(cat "$DIR/$d.pid")
      kill "$pid" 2>/dev/null
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null
    fi
    rm -f "$DIR/$d.pid"
  done
  if [[ -f $DIR/munged.ours ]] && pid_alive "$DIR/munged.pid"; then
    kill "$(cat "$DIR/munged.pid")" 2>/dev/null
  fi
  rm -f "$DIR/munged.ours"
}

node_ready() {
  local state
  state=$(SLURM_CONF=$CONF sinfo -h -N -o %t 2>/dev/null | head -1)
  [[ $state == idle* || $state == mix* || $state == alloc* ]]
}

start() {
  [[ $(id -u) -eq 0 ]] || die "needs root (starts slurmctld, slurmd and munged)"
  for b in slurmctld slurmd srun sinfo munged; do
    command -v "$b" >/dev/null || die "$b is not installed (scripts/setup.sh installs slurmctld slurmd slurm-client munge)"
  done
  if pid_alive "$DIR/slurmctld.pid" && pid_alive "$DIR/slurmd.pid" && node_ready; then
    echo "export SLURM_CONF=$CONF"
    return 0
  fi
  stop
  mkdir -p "$DIR/state" "$DIR/spool"

  # munge: the package's key, or a fresh one; a daemon of our own unless one answers already
  if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    if [[ ! -s /etc/munge/munge.key ]]; then
      mkdir -p /etc/munge
      dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
      chown munge:munge /etc/munge/munge.key 2>/dev/null
      chmod 400 /etc/munge/munge.key
    fi
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    chown munge:munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null
    runuser -u munge -- munged 2>"$DIR/munged.err" || munged --force 2>>"$DIR/munged.err" ||
      die "munged did not start: $(tail -1 "$DIR/munged.err")"
    pgrep -nx munged >"$DIR/munged.pid"
    touch "$DIR/munged.ours"
    for _ in $(seq 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 || die "munge does not answer (see $DIR/munged.err)"
  fi

  local host node
  host=$(hostname -s)
  # "NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=24105"
  node=$(slurmd -C 2>/dev/null | head -1)
  [[ $node == NodeName=* ]] || die "slurmd -C did not describe this machine"
  cat >"$CONF" <<EOF
ClusterName=oases-local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=${OASES_SLURM_PORT:-6817}
SlurmdPort=$((${OASES_SLURM_PORT:-6817} + 1))
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
# no cgroups in containers: processes tracked by their parents, no task binding
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillOnBadExit=1
KillWait=5
InactiveLimit=0
MinJobAge=10
$node
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
  slurmctld -f "$CONF" 2>"$DIR/slurmctld.err" || die "slurmctld did not start: $(tail -1 "$DIR/slurmctld.err") (log $DIR/slurmctld.log)"
  slurmd -f "$CONF" 2>"$DIR/slurmd.err" || die "slurmd did not start: $(tail -1 "$DIR/slurmd.err") (log $DIR/slurmd.log)"
  for _ in $(seq 100); do
    node_ready && break
    sleep 0.2
  done
  if ! node_ready; then
    SLURM_CONF=$CONF scontrol update nodename="${node#NodeName=}" state=resume >/dev/null 2>&1
    node_ready || die "the node does not take jobs: $(SLURM_CONF=$CONF sinfo -h -N -o '%t %E' 2>&1 | head -1) (logs in $DIR)"
  fi
  echo "export SLURM_CONF=$CONF"
}

case $WHAT in
  start) start ;;
  stop) stop ;;
  status)
    node_ready && echo "running: SLURM_CONF=$CONF" && exit 0
    echo "not running"
    exit 1
    ;;
  *) die "usage: $0 start|stop|status" ;;
esac
