# Three Kafka nodes in one KRaft cluster (each a combined broker+controller), for the fault run that
# kills a partition leader: replication factor 3 and min.insync.replicas 2, so the cluster keeps
# accepting acks=all writes with one node down. Started only when named (`scripts/brokers start
# kafka-cluster`), never by default. State under $STATE/kafka-cluster/node-<n>/ (server.properties,
# data/, pid, kafka.log), the shared ports in $STATE/kafka-cluster/ports. Sourced by scripts/brokers.

# shellcheck source=kafka.sh
source "$(dirname "${BASH_SOURCE[0]}")/kafka.sh"

KAFKA_CLUSTER_NODES=(1 2 3)

# kafka-cluster_install — what one Kafka node needs.
kafka-cluster_install() { kafka_install; }

# kafka_cluster_bootstrap — the client ports as host:port,host:port,host:port.
kafka_cluster_bootstrap() {
  local ports; read -r -a ports < "$STATE/kafka-cluster/ports"
  printf '127.0.0.1:%s,127.0.0.1:%s,127.0.0.1:%s' "${ports[0]}" "${ports[1]}" "${ports[2]}"
}

# kafka_cluster_all_brokers BOOTSTRAP — true when the metadata names all three brokers.
kafka_cluster_all_brokers() {
  [ "$(timeout 20 kcat -b "$1" -L -m 5 2>/dev/null | grep -c '^  broker ')" -eq 3 ]
}

# kafka-cluster_start — free ports (or, on a restart, the ones it had), one shared cluster id, three
# nodes, then a produce/consume round trip through the cluster.
kafka-cluster_start() {
  local d; d=$(dir kafka-cluster)
  local cp java n port cport ports=() cports=() voters="" cluster
  kafka-cluster_stop
  cp=$(maven_classpath kafka "$KAFKA_POM_DIR")
  java=$(java_bin)
  if keep_data && [ -s "$d/ports" ] && [ -s "$d/controller-ports" ]; then
    read -r -a ports < "$d/ports"; read -r -a cports < "$d/controller-ports"
  else
    for n in "${KAFKA_CLUSTER_NODES[@]}"; do
      port=$(pick_port kafka-cluster $((19100 + n)) $((29100 + n)) $((39100 + n)))
      cport=$(pick_port kafka-cluster $((19200 + n)) $((29200 + n)) $((39200 + n)))
      ports+=("$port"); cports+=("$cport")
    done
    echo "${ports[*]}" > "$d/ports"; echo "${cports[*]}" > "$d/controller-ports"
  fi
  for n in "${KAFKA_CLUSTER_NODES[@]}"; do
    voters+="${voters:+,}$n@127.0.0.1:${cports[n-1]}"
  done
  keep_data && [ -s "$d/cluster-id" ] || kafka_cluster_id > "$d/cluster-id"
  cluster=$(cat "$d/cluster-id")
  log "kafka-cluster: starting 3 nodes on 127.0.0.1:${ports[*]} (controllers ${cports[*]})"
  for n in "${KAFKA_CLUSTER_NODES[@]}"; do
    local nd="$d/node-$n"
    mkdir -p "$nd"
    keep_data || rm -rf "$nd/data"
    kafka_write_config "$nd" "${ports[n-1]}" "${cports[n-1]}" "$n" "$voters" 3 2
    if ! keep_data || [ ! -s "$nd/data/meta.properties" ]; then
      kafka_format "$java" "$cp" "$nd" "$cluster"
    fi
    launch_detached "kafka-cluster node $n" "$nd" "$nd/kafka.log" \
      "$java" -Xms128m -Xmx512m -XX:+UseG1GC -cp "$cp" kafka.Kafka "$nd/server.properties"
  done
  local bootstrap; bootstrap=$(kafka_cluster_bootstrap)
  if ! (wait_ready kafka-cluster 180 "$d/node-1/pid" "$d/node-1/kafka.log" \
      kafka_cluster_all_brokers "$bootstrap"); then
    kafka-cluster_stop; exit 1
  fi
  if ! kafka_roundtrip "${ports[0]}"; then
    tail_log kafka-cluster "$d/node-1/kafka.log"; kafka-cluster_stop
    die "kafka-cluster: three brokers answer but a produce/consume round trip failed"
  fi
  log "kafka-cluster: up at kafka://$bootstrap (round trip ok)"
}

# kafka-cluster_status — the cluster's URL when all three nodes are ours, alive and in the metadata.
kafka-cluster_status() {
  local d="$STATE/kafka-cluster" n bootstrap
  [ -s "$d/ports" ] || return 1
  for n in "${KAFKA_CLUSTER_NODES[@]}"; do cmdline_has "$d/node-$n/pid" kafka.Kafka || return 1; done
  bootstrap=$(kafka_cluster_bootstrap)
  kafka_cluster_all_brokers "$bootstrap" || return 1
  printf 'kafka://%s\n' "$bootstrap"
}

# kafka-cluster_pid [NODE] — the pid of one node (node 1 by default).
kafka-cluster_pid() {
  local pidfile="$STATE/kafka-cluster/node-${1:-1}/pid"
  cmdline_has "$pidfile" kafka.Kafka || die "kafka-cluster: node ${1:-1} is not running"
  cat "$pidfile"
}

# kafka-cluster_stop — stops every node of ours (SIGTERM, SIGKILL after 60 s).
kafka-cluster_stop() {
  local n pidfile
  for n in "${KAFKA_CLUSTER_NODES[@]}"; do
    pidfile="$STATE/kafka-cluster/node-$n/pid"
    if [ -e "$pidfile" ] && ! cmdline_has "$pidfile" kafka.Kafka; then rm -f "$pidfile"; continue; fi
    stop_pid "kafka-cluster node $n" "$pidfile" 60
  done
}
