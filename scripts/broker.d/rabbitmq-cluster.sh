# Three RabbitMQ nodes in one cluster, for the fault run that kills the node leading a consumer's quorum
# queues (F7). Started only when named (`scripts/brokers start rabbitmq-cluster`), never by default.
# Nodes eventretry-c1@localhost … c3 from the same Debian package as the single node, each with its own
# ports and folder (owned by user rabbitmq, under /tmp, named in $STATE/rabbitmq-cluster/node-dir); nodes
# 2 and 3 join node 1. Quorum queues then get a member on every node. Our records (ports, pids, whether we
# started epmd) stay in $STATE/rabbitmq-cluster/. Sourced by scripts/brokers.

# shellcheck source=rabbitmq.sh
source "$(dirname "${BASH_SOURCE[0]}")/rabbitmq.sh"

RABBITMQ_CLUSTER_NODES=(1 2 3)

# rabbitmq-cluster_install — what one node needs.
rabbitmq-cluster_install() { rabbitmq_install; }

# rabbitmq_cluster_node N — node N's name.
rabbitmq_cluster_node() { printf 'eventretry-c%s@localhost' "$1"; }

# rabbitmq_cluster_ctl N ARGS... — rabbitmqctl against node N.
rabbitmq_cluster_ctl() { local n=$1; shift; rabbitmqctl -q -n "$(rabbitmq_cluster_node "$n")" "$@"; }

# rabbitmq_cluster_dir — the folder user rabbitmq owns for the three nodes (created on first use).
rabbitmq_cluster_dir() {
  local d; d=$(dir rabbitmq-cluster)
  if [ ! -s "$d/node-dir" ] || [ ! -d "$(cat "$d/node-dir")" ]; then
    mktemp -d /tmp/event-retry-rabbitmq-cluster.XXXXXX > "$d/node-dir"
  fi
  cat "$d/node-dir"
}

# rabbitmq_cluster_launch N — starts node N detached on its recorded ports and waits for its boot.
rabbitmq_cluster_launch() {
  local n=$1 d="$STATE/rabbitmq-cluster" base nd ports dists
  base=$(rabbitmq_cluster_dir); nd="$base/node-$n"
  read -r -a ports < "$d/ports"; read -r -a dists < "$d/dist-ports"
  mkdir -p "$nd/mnesia"; rm -f "$nd/pid"; touch "$nd/rabbitmq.log"
  chown -R rabbitmq:rabbitmq "$base" || die "rabbitmq-cluster: cannot give $base to user rabbitmq"
  env RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT="${ports[n-1]}" \
    RABBITMQ_DIST_PORT="${dists[n-1]}" RABBITMQ_NODENAME="$(rabbitmq_cluster_node "$n")" \
    RABBITMQ_MNESIA_BASE="$nd/mnesia" RABBITMQ_LOG_BASE="$nd" RABBITMQ_PID_FILE="$nd/pid" \
    RABBITMQ_CONFIG_FILE="$nd/rabbitmq" RABBITMQ_LOGS="$nd/rabbitmq.log" \
    rabbitmq-server -detached > "$d/detach-$n.out" 2>&1 \
    || { tail_log rabbitmq-cluster "$d/detach-$n.out"; die "rabbitmq-cluster: node $n could not start"; }
  if ! (wait_ready rabbitmq-cluster 90 "" "$nd/rabbitmq.log" \
          rabbitmq_cluster_ctl "$n" await_startup --timeout 15 \
        && wait_ready rabbitmq-cluster 30 "$nd/pid" "$nd/rabbitmq.log" rabbitmq_cluster_ctl "$n" status); then
    rabbitmq-cluster_stop; exit 1
  fi
  cp "$nd/pid" "$d/server-$n.pid"
}

# rabbitmq_cluster_running_nodes — how many nodes node 1 (or, if it is down, node 2) sees running.
rabbitmq_cluster_running_nodes() {
  local n
  for n in 1 2; do
    rabbitmq_cluster_ctl "$n" cluster_status --formatter json 2>/dev/null \
      | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["running_nodes"]))' 2>/dev/null \
      && return 0
  done
  echo 0
}

# rabbitmq-cluster_start — free ports (or, on a restart, the ones it had), fresh data unless restarting,
# node 1, then nodes 2 and 3 joining it; up when all three run in one cluster.
rabbitmq-cluster_start() {
  local d n port dist ports=() dists=() base
  d=$(dir rabbitmq-cluster)
  rabbitmq-cluster_stop
  base=$(rabbitmq_cluster_dir)
  if keep_data && [ -s "$d/ports" ] && [ -s "$d/dist-ports" ]; then
    read -r -a ports < "$d/ports"; read -r -a dists < "$d/dist-ports"
  else
    for n in "${RABBITMQ_CLUSTER_NODES[@]}"; do
      port=$(pick_port rabbitmq-cluster $((5680 + n)) $((35680 + n)) $((45680 + n)))
      dist=$(pick_port rabbitmq-cluster-dist $((25680 + n)) $((45690 + n)) $((55690 + n)))
      ports+=("$port"); dists+=("$dist")
    done
    echo "${ports[*]}" > "$d/ports"; echo "${dists[*]}" > "$d/dist-ports"
  fi
  keep_data || rm -rf "$base"/node-*
  if [ -z "$(rabbitmq_host_epmd_pids)" ]; then echo ours > "$d/epmd"; elif [ ! -f "$d/epmd" ]; then echo external > "$d/epmd"; fi
  log "rabbitmq-cluster: starting 3 nodes on 127.0.0.1:${ports[*]} (data $base)"
  local fresh=1
  keep_data && [ -d "$base/node-2/mnesia" ] && fresh=""
  for n in "${RABBITMQ_CLUSTER_NODES[@]}"; do
    rabbitmq_cluster_launch "$n"
    if [ -n "$fresh" ] && [ "$n" -gt 1 ]; then
      rabbitmq_cluster_ctl "$n" stop_app >/dev/null \
        && rabbitmq_cluster_ctl "$n" join_cluster "$(rabbitmq_cluster_node 1)" >/dev/null \
        && rabbitmq_cluster_ctl "$n" start_app >/dev/null \
        || { rabbitmq-cluster_stop; die "rabbitmq-cluster: node $n could not join node 1"; }
    fi
  done
  if ! (wait_ready rabbitmq-cluster 60 "$d/server-1.pid" "$base/node-1/rabbitmq.log" \
        rabbitmq_cluster_all_running); then
    rabbitmq-cluster_stop; die "rabbitmq-cluster: the three nodes do not run as one cluster"
  fi
  ln -sfn "$base/node-1/rabbitmq.log" "$d/rabbitmq-cluster.log"
  log "rabbitmq-cluster: up at $(rabbitmq-cluster_status)"
}

# rabbitmq_cluster_all_running — true when node 1 sees all three nodes running.
rabbitmq_cluster_all_running() { [ "$(rabbitmq_cluster_running_nodes)" -eq 3 ]; }

# rabbitmq-cluster_status — the three nodes' AMQP URLs (node order, space-separated) when all three are
# ours, alive and running as one cluster.
rabbitmq-cluster_status() {
  local d="$STATE/rabbitmq-cluster" n ports urls=()
  [ -s "$d/ports" ] || return 1
  for n in "${RABBITMQ_CLUSTER_NODES[@]}"; do alive "$d/server-$n.pid" || return 1; done
  rabbitmq_cluster_all_running || return 1
  read -r -a ports < "$d/ports"
  for n in "${RABBITMQ_CLUSTER_NODES[@]}"; do
    urls+=("amqp://guest:guest@127.0.0.1:${ports[n-1]}/%2f")
  done
  printf '%s\n' "${urls[*]}"
}

# rabbitmq-cluster_pid [NODE] — the pid of one node (node 1 by default).
rabbitmq-cluster_pid() {
  local pidfile="$STATE/rabbitmq-cluster/server-${1:-1}.pid"
  alive "$pidfile" || die "rabbitmq-cluster: node ${1:-1} is not running"
  cat "$pidfile"
}

# rabbitmq-cluster_stop — stops every node of ours (and epmd, if it was ours).
rabbitmq-cluster_stop() {
  local d="$STATE/rabbitmq-cluster" n pidfile
  for n in "${RABBITMQ_CLUSTER_NODES[@]}"; do
    pidfile="$d/server-$n.pid"
    [ -e "$pidfile" ] || continue
    if alive "$pidfile"; then bounded 60 rabbitmq_cluster_ctl "$n" stop >/dev/null 2>&1 || true; fi
    stop_pid "rabbitmq-cluster node $n" "$pidfile" 30
    rm -f "$pidfile"
  done
  if [ "$(cat "$d/epmd" 2>/dev/null)" = ours ] && ! rabbitmq_server_pid >/dev/null 2>&1; then
    rabbitmq_host_epmd_stop
  fi
  rm -f "$d/epmd"
  # Unless keeping data, the nodes' folder under /tmp goes too, as a single node's does.
  if ! keep_data && [ -s "$d/node-dir" ] && ! rabbitmq_cluster_alive; then
    case "$(cat "$d/node-dir")" in
      /tmp/event-retry-rabbitmq-cluster.*) rm -rf "$(cat "$d/node-dir")" && rm -f "$d/node-dir" ;;
    esac
  fi
}
