# Apache Kafka 4.x, one KRaft node in combined broker+controller mode, run from Maven Central jars (the
# Maven project in broker.d/kafka/). Sourced by scripts/brokers after common.sh. State under $STATE/kafka/:
# server.properties, data/ (wiped on every start but a restart), pid, port (the client port),
# controller-port, kafka.log, format.log.
# Readiness and the self-check use Debian's kcat, so nothing else has to run on the JVM.

KAFKA_POM_DIR="$ROOT/scripts/broker.d/kafka"
KAFKA_CHECK_TOPIC=brokers-selfcheck

# kafka_install — idempotent: kcat for the checks, and the broker's classpath (resolved once, then cached
# by common.sh under $CACHE/kafka, so a second call only hashes the pom).
kafka_install() {
  apt_install kcat
  maven_classpath kafka "$KAFKA_POM_DIR" >/dev/null
}

# kafka_cluster_id — a random KRaft cluster id: 16 random bytes as 22 chars of base64url, not starting
# with '-' (as Kafka's own Uuid.randomUuid does); saves starting a JVM for `StorageTool random-uuid`.
kafka_cluster_id() {
  local id
  while :; do
    id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | cut -c1-22)
    [[ $id == -* ]] || { printf '%s' "$id"; return 0; }
  done
}

# kafka_write_config DIR PORT CONTROLLER_PORT [NODE_ID VOTERS REPLICAS MIN_ISR] — server.properties for a
# loopback-only node in combined broker+controller mode, with small thread counts and buffers (a test
# broker on a 2-core machine). Alone (the defaults) it is its own quorum with replication factors of 1;
# kafka-cluster.sh passes each of its nodes' id, the shared voters, and the cluster's replication.
kafka_write_config() {
  local d=$1 port=$2 cport=$3 id=${4:-1} voters=${5:-1@127.0.0.1:$3} replicas=${6:-1} min_isr=${7:-1}
  cat > "$d/server.properties" <<EOF
# Written by scripts/broker.d/kafka*.sh on every start; edits are lost.
process.roles=broker,controller
node.id=$id
controller.quorum.voters=$voters
controller.listener.names=CONTROLLER
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$d/data
num.partitions=1
default.replication.factor=$replicas
min.insync.replicas=$min_isr
auto.create.topics.enable=true
offsets.topic.replication.factor=$replicas
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=$replicas
transaction.state.log.min.isr=$min_isr
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=$replicas
share.coordinator.state.topic.min.isr=$min_isr
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=2
# The log cleaner (for __consumer_offsets) allocates this on the heap at startup; the default is 128 MiB.
log.cleaner.dedupe.buffer.size=16777216
EOF
}

# kafka_format JAVA CP DIR [CLUSTER_ID] — formats fresh KRaft storage in DIR/data with the cluster id (a
# new one by default; the nodes of one cluster share theirs). The static quorum in server.properties
# means no --standalone is needed.
kafka_format() {
  local java=$1 cp=$2 d=$3 cluster=${4:-$(kafka_cluster_id)}
  if ! timeout 120 "$java" -Xmx256m -cp "$cp" kafka.tools.StorageTool format -t "$cluster" \
      -c "$d/server.properties" --ignore-formatted > "$d/format.log" 2>&1; then
    tail_log kafka "$d/format.log"
    die "kafka: formatting the storage failed"
  fi
}

# kafka_roundtrip PORT — produces one message with a header to a throwaway topic (auto-created) and reads
# it back, so "ready" means a client can really use the broker, not just fetch metadata.
kafka_roundtrip() {
  local port=$1 token="ping-$$-$RANDOM$RANDOM" out="" i
  printf '%s\n' "$token" | timeout 30 kcat -b "127.0.0.1:$port" -P -t "$KAFKA_CHECK_TOPIC" \
    -H "check=$token" >/dev/null 2>&1 || return 1
  for i in 1 2 3; do
    out=$(timeout 20 kcat -b "127.0.0.1:$port" -C -t "$KAFKA_CHECK_TOPIC" -e -o beginning -q \
      -f '%h %s\n' 2>/dev/null) || true
    [[ $out == *"check=$token $token"* ]] && return 0
    sleep 1
  done
  return 1
}

# kafka_start — fresh storage, free ports, config, launch, wait until a metadata request answers, then
# a produce/consume round trip. A leftover Kafka of ours (alive but not answering) is stopped first.
kafka_start() {
  local d; d=$(dir kafka)
  local cp java port cport
  cmdline_has "$d/pid" kafka.Kafka && kafka_stop
  cp=$(maven_classpath kafka "$KAFKA_POM_DIR")
  java=$(java_bin)
  port=$(pick_port kafka $(recorded_port "$d/port") 19092 29092 39092)
  cport=$(pick_port kafka $(recorded_port "$d/controller-port") 19093 29093 39093)
  log "kafka: starting on 127.0.0.1:$port (controller 127.0.0.1:$cport)"
  keep_data || rm -rf "$d/data"
  printf '%s\n' "$cport" > "$d/controller-port"
  kafka_write_config "$d" "$port" "$cport"
  # A restart keeps the formatted storage (formatting again would need the same cluster id).
  if ! keep_data || [ ! -s "$d/data/meta.properties" ]; then
    kafka_format "$java" "$cp" "$d"
  fi
  printf '%s\n' "$port" > "$d/port"
  launch_detached kafka "$d" "$d/kafka.log" \
    "$java" -Xms128m -Xmx512m -XX:+UseG1GC -cp "$cp" kafka.Kafka "$d/server.properties"
  serve_or_stop kafka kafka_stop 120 kcat -b "127.0.0.1:$port" -L -m 5
  roundtrip_or_stop kafka kafka_stop "metadata answers but a produce/consume round trip on 127.0.0.1:$port failed" \
    kafka_roundtrip "$port"
  log "kafka: up at kafka://127.0.0.1:$port (pid $(cat "$d/pid"), round trip ok)"
}

# kafka_status — prints kafka://127.0.0.1:PORT if our broker is alive and answers metadata; else 1, silent.
kafka_status() {
  local d="$STATE/kafka" port
  cmdline_has "$d/pid" kafka.Kafka && [ -s "$d/port" ] || return 1
  port=$(cat "$d/port")
  timeout 20 kcat -b "127.0.0.1:$port" -L -m 5 >/dev/null 2>&1 || return 1
  printf 'kafka://127.0.0.1:%s\n' "$port"
}

# kafka_stop — SIGTERM (Kafka shuts down in a controlled way), SIGKILL after 60 s; only our own pid.
kafka_stop() {
  local pidfile="$STATE/kafka/pid"
  if [ -e "$pidfile" ] && ! cmdline_has "$pidfile" kafka.Kafka; then rm -f "$pidfile"; return 0; fi
  stop_pid kafka "$pidfile" 60
}
