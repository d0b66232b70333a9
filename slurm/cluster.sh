#!/bin/bash
# A Slurm cluster of N compute nodes on this one machine, for development and tests.
#
#   slurm/cluster.sh up     (make slurm-up NODES=N)   its last line: export SLURM_CONF=...
#   slurm/cluster.sh down   (make slurm-down)
#   slurm/cluster.sh restart-node I   (node n<I>'s slurmd again, after it was killed)
#
# munged and slurmctld run on the host; node i is a slurmd in its own network, UTS and mount
# namespaces: hostname n<i>, address NET.(10+i) on a bridge (NET.1 on the host side), and a
# private /etc/hosts naming every node, so that gloo (which finds its own address from the
# hostname) advertises the node's address and not loopback.  Every file lives under BASE.
# Settings, from the environment: NODES (2), BASE (out/slurm), NAME (the prefix of the
# namespaces, bridge and veths: jwm), NET (the bridge's /24: 10.231.0), CTLD_PORT and
# SLURMD_PORT (6917, 6918), CPUS per node (2).  Two clusters meet only if they share a NAME,
# a NET or a CTLD_PORT.  Needs root; installs Slurm's Debian packages when one is missing.
set -eu
NODES=${NODES:-2}
BASE=$(realpath -m "${BASE:-out/slurm}")
NAME=${NAME:-jwm}
NET=${NET:-10.231.0}
CTLD_PORT=${CTLD_PORT:-6917}
SLURMD_PORT=${SLURMD_PORT:-6918}
CPUS=${CPUS:-2}
BRIDGE="${NAME}br"
PROGRAMS="slurmctld slurmd sbatch srun squeue scontrol scancel sinfo munged munge nsenter unshare ip"
PACKAGES="slurmctld slurmd slurm-client munge"

say() { echo "slurm-$1: $2" >&2; }

missing() {
  for program in $PROGRAMS; do command -v "$program" >/dev/null || echo "$program"; done
}

install_packages() {
  [ -z "$(missing)" ] && return
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    say up "missing $(missing | tr '\n' ' ')and apt-get cannot run as root here"; exit 1
  fi
  say up "installing $PACKAGES"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PACKAGES >/dev/null
  [ -z "$(missing)" ] || { say up "still missing: $(missing | tr '\n' ' ')"; exit 1; }
}

# Start a daemon in its own session, its output in log/NAME.out, its pid in run/NAME.pid.
spawn() {
  local name=$1; shift
  setsid "$@" > "$BASE/log/$name.out" 2>&1 < /dev/null &
  echo $! > "$BASE/run/$name.pid"
}

# Wait up to $1 tenths of a second for the command after it to succeed.
wait_for() {
  local tenths=$1; shift
  for _ in $(seq "$tenths"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}

all_idle() { [ "$(sinfo -h -o '%D %T' | tr -d '\n')" = "$NODES idle" ]; }

network() {
  ip link add "$BRIDGE" type bridge
  ip addr add "$NET.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for i in $(seq 1 "$NODES"); do
    local ns="${NAME}n$i"
    ip netns add "$ns"
    ip link add "${NAME}v${i}h" type veth peer name "${NAME}v${i}n"
    ip link set "${NAME}v${i}n" netns "$ns"
    ip link set "${NAME}v${i}h" master "$BRIDGE" up
    ip -n "$ns" addr add "$NET.$((10 + i))/24" dev "${NAME}v${i}n"
    ip -n "$ns" link set "${NAME}v${i}n" up
    ip -n "$ns" link set lo up
  done
}

config() {
  local host nodes=""
  host=$(hostname -s)
  printf '127.0.0.1 localhost\n%s.1 %s\n' "$NET" "$host" > "$BASE/etc/hosts"
  for i in $(seq 1 "$NODES"); do
    echo "$NET.$((10 + i)) n$i" >> "$BASE/etc/hosts"
    nodes="${nodes}NodeName=n$i NodeAddr=$NET.$((10 + i)) CPUs=$CPUS RealMemory=1000 State=UNKNOWN
"
  done
  # The settings of the suite's one-node cluster (tests/slurm/slurm.conf.in, where each is
  # explained), with the controller on the bridge and one slurmd per node.  SlurmctldHost must
  # be this host's own short name, else slurmctld exits "not a valid controller".
  cat > "$BASE/etc/slurm.conf" <<CONF
ClusterName=$NAME
SlurmctldHost=$host($NET.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$BASE/munge/munge.socket,cred_expire=5
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/%n
SlurmctldPidFile=$BASE/run/slurmctld.own.pid
SlurmdPidFile=$BASE/run/slurmd-%n.own.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$BASE/log/jobcomp.log
JobContainerType=job_container/none
SwitchType=switch/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
KillWait=5
SlurmdTimeout=10
${nodes}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
}

# slurmd of node n$1 in its namespaces.  nsenter changes only the network: `ip netns exec`
# would remount /sys without /sys/fs/cgroup, and slurmd then exits ("Unable to initialize
# cgroup plugin").
start_node() {
  spawn "slurmd-n$1" nsenter --net="/var/run/netns/${NAME}n$1" \
    unshare --uts --mount --propagation private \
    sh -c "hostname n$1 && mount --bind '$BASE/etc/hosts' /etc/hosts && exec slurmd -D -N n$1 -f '$SLURM_CONF'"
}

# Start node n$1's slurmd again (after a test killed every process of its namespace) and
# wait until Slurm has it back (ReturnToService=2) and idle.
restart_node() {
  export SLURM_CONF="$BASE/etc/slurm.conf"
  start_node "$1"
  wait_for 300 all_idle || { say node "n$1 not idle: $(sinfo -h -o '%N %T' | tr '\n' ' ')"; exit 1; }
}

up() {
  install_packages
  down 2>/dev/null
  mkdir -p "$BASE"/{etc,run,log,state,spool,munge}
  chmod 755 "$BASE" "$BASE/munge"  # munged refuses a socket folder closed to others
  network
  config
  head -c 1024 /dev/urandom > "$BASE/munge/munge.key"
  chmod 600 "$BASE/munge/munge.key"
  spawn munged munged --foreground --key-file="$BASE/munge/munge.key" \
    --socket="$BASE/munge/munge.socket" --pid-file="$BASE/munge/munged.own.pid" \
    --log-file="$BASE/log/munged.log" --seed-file="$BASE/munge/seed"
  wait_for 50 munge -n -S "$BASE/munge/munge.socket" || { say up "munged did not start"; exit 1; }
  export SLURM_CONF="$BASE/etc/slurm.conf"
  spawn slurmctld slurmctld -D -f "$SLURM_CONF"
  wait_for 150 scontrol ping || { say up "slurmctld did not answer"; tail "$BASE"/log/slurmctld.*; exit 1; }
  for i in $(seq 1 "$NODES"); do start_node "$i"; done
  wait_for 300 all_idle || { say up "nodes not idle: $(sinfo -h -o '%N %T' | tr '\n' ' ')"; exit 1; }
  sinfo
  echo "export SLURM_CONF=$SLURM_CONF"
}

# Stop each daemon by its pid (SIGTERM, up to 10 s, SIGKILL), then every process still in a
# node's namespaces (a job step's), then the namespaces, veths and bridge.
down() {
  local pids=""
  for file in "$BASE"/run/slurmd-*.pid "$BASE"/run/slurmctld.pid "$BASE"/run/munged.pid; do
    [ -f "$file" ] || continue
    case "$file" in *.own.pid) continue ;; esac
    pids="$pids $(cat "$file")"
    rm -f "$file"
  done
  for pid in $pids; do kill "$pid" 2>/dev/null || true; done
  for _ in $(seq 100); do
    alive=""
    for pid in $pids; do kill -0 "$pid" 2>/dev/null && alive="$alive $pid"; done
    [ -z "$alive" ] && break
    sleep 0.1
  done
  for pid in ${alive:-}; do kill -9 "$pid" 2>/dev/null || true; done
  for ns in $(ip netns list | awk -v prefix="${NAME}n" 'index($1, prefix) == 1 {print $1}'); do
    for pid in $(ip netns pids "$ns"); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns"
  done
  for link in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1); do
    case "$link" in "${NAME}v"*h) ip link del "$link" 2>/dev/null || true ;; esac
  done
  ip link del "$BRIDGE" 2>/dev/null || true
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  restart-node) restart_node "${2:?which node: 1..N}" ;;
  *) echo "usage: $0 up|down|restart-node I" >&2; exit 2 ;;
esac
