# Apache Kafka 4.x, one KRaft node in combined broker+controller mode, run from Maven Central jars (the
# Maven project in broker.d/kafka/). Sourced by scripts/brokers after common.sh. State under $STATE/kafka/:
# server.properties, data/ (wiped on every start but a restart), pid, port (the client port),
# controller-port, kafka.log, format.log; with --tls also tls (the marker), tls-port, keystore.pem,
# kcat-tls.conf and client-tls.properties (kcat's and Kafka's Java tools' settings for the secured
# listener, password included; mode 0600).
# Readiness and the self-check use Debian's kcat, so nothing else has to run on the JVM; but for SCRAM,
# checked with Kafka's own ConfigCommand: Debian's kcat (librdkafka 2.0) fails every SCRAM login against
# Kafka 4 (a client bug, fixed in librdkafka 2.6.1), so kcat uses PLAIN on the secured listener.
#
# With --tls the broker also serves SASL_SSL://127.0.0.1:<tls-port> (the PEM files of tls.sh; no client
# certificate asked for) with the SASL mechanisms PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 and OAUTHBEARER
# for user event-retry; the PLAINTEXT listener, the controller and the inter-broker traffic stay as they
# are.

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

# kafka_write_config DIR PORT CONTROLLER_PORT [NODE_ID VOTERS REPLICAS MIN_ISR TLS_PORT] — server.properties
# for a loopback-only node in combined broker+controller mode, with small thread counts and buffers (a
# test broker on a 2-core machine). Alone (the defaults) it is its own quorum with replication factors of
# 1; kafka-cluster.sh passes each of its nodes' id, the shared voters, and the cluster's replication.
# With TLS_PORT, the secured listener too (kafka_tls_config). Empty arguments take the defaults.
kafka_write_config() {
  local d=$1 port=$2 cport=$3 id=${4:-1} voters=${5:-1@127.0.0.1:$3} replicas=${6:-1} min_isr=${7:-1}
  local tls=${8:-}
  : > "$d/server.properties"
  chmod 600 "$d/server.properties"   # with TLS it holds the PLAIN password
  cat > "$d/server.properties" <<EOF
# Written by scripts/broker.d/kafka*.sh on every start; edits are lost.
process.roles=broker,controller
node.id=$id
controller.quorum.voters=$voters
controller.listener.names=CONTROLLER
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport${tls:+,SASL_SSL://127.0.0.1:$tls}
advertised.listeners=PLAINTEXT://127.0.0.1:$port${tls:+,SASL_SSL://127.0.0.1:$tls}
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT${tls:+,SASL_SSL:SASL_SSL}
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
  [ -z "$tls" ] || kafka_tls_config "$d" >> "$d/server.properties"
}

# kafka_tls_config DIR — the server.properties lines of the SASL_SSL listener: TLS from PEM files (the
# server key and certificate joined into DIR/keystore.pem, as Kafka's PEM key store wants them in one
# file) and the four SASL mechanisms, each with its own JAAS config on this listener only.
kafka_tls_config() {
  local d=$1 pw jaas=org.apache.kafka.common.security
  ( umask 077; cat "$TLS_DIR/server.key" "$TLS_DIR/server.pem" > "$d/keystore.pem" )
  pw=$(tls_secret kafka.password)
  cat <<EOF
# The secured listener (scripts/brokers start --tls): TLS with the throwaway CA's server certificate.
listener.name.sasl_ssl.ssl.keystore.type=PEM
listener.name.sasl_ssl.ssl.keystore.location=$d/keystore.pem
listener.name.sasl_ssl.ssl.truststore.type=PEM
listener.name.sasl_ssl.ssl.truststore.location=$TLS_DIR/ca.pem
listener.name.sasl_ssl.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER
# PLAIN: the user and password are listed here.
listener.name.sasl_ssl.plain.sasl.jaas.config=$jaas.plain.PlainLoginModule required user_$TLS_USER="$pw";
# SCRAM: the credentials live in the cluster metadata, added when the storage is formatted (kafka_format).
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=$jaas.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=$jaas.scram.ScramLoginModule required;
# OAUTHBEARER: no server callback handler configured means Kafka's built-in UNSECURED validator, which
# accepts any unsigned JWT ("alg":"none") with a subject. A test-only validator: never use it in production.
listener.name.sasl_ssl.oauthbearer.sasl.jaas.config=$jaas.oauthbearer.OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="$TLS_USER";
EOF
}

# kafka_scram_args — the StorageTool arguments, one a line, that add user event-retry's SCRAM-SHA-256 and
# -512 credentials (with the kafka.password of tls.sh) to freshly formatted storage.
kafka_scram_args() {
  local pw; pw=$(tls_secret kafka.password)
  printf '%s\n' --add-scram "SCRAM-SHA-256=[name=$TLS_USER,password=$pw]" \
    --add-scram "SCRAM-SHA-512=[name=$TLS_USER,password=$pw]"
}

# kafka_tls_client_configs DIR TLS_PORT — writes the client settings of the secured listener, so the
# password never shows on a command line (both mode 0600): DIR/kcat-tls.conf for kcat (-F), with PLAIN
# (see the top of this file), and DIR/client-tls.properties for Kafka's Java tools (--command-config),
# with SCRAM-SHA-512.
kafka_tls_client_configs() {
  local pw; pw=$(tls_secret kafka.password)
  ( umask 077
    cat > "$1/kcat-tls.conf" <<EOF
bootstrap.servers=127.0.0.1:$2
security.protocol=SASL_SSL
sasl.mechanisms=PLAIN
sasl.username=$TLS_USER
sasl.password=$pw
ssl.ca.location=$TLS_DIR/ca.pem
EOF
    cat > "$1/client-tls.properties" <<EOF
bootstrap.servers=127.0.0.1:$2
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="$TLS_USER" password="$pw";
ssl.truststore.type=PEM
ssl.truststore.location=$TLS_DIR/ca.pem
EOF
  )
}

# kafka_scram_check JAVA CP DIR TLS_PORT — logs in on the secured listener with SCRAM-SHA-512 (Kafka's
# ConfigCommand, DIR/client-tls.properties) and checks that user event-retry has both SCRAM credentials.
# Output in DIR/scram-check.log.
kafka_scram_check() {
  local java=$1 cp=$2 d=$3 port=$4
  timeout 60 "$java" -Xmx128m -cp "$cp" kafka.admin.ConfigCommand --bootstrap-server "127.0.0.1:$port" \
    --command-config "$d/client-tls.properties" --describe --entity-type users --entity-name "$TLS_USER" \
    > "$d/scram-check.log" 2>&1 || return 1
  grep "^SCRAM credential configs for user-principal '$TLS_USER'" "$d/scram-check.log" \
    | grep "SCRAM-SHA-256=" | grep -q "SCRAM-SHA-512="
}

# kafka_format JAVA CP DIR [CLUSTER_ID [ARGS...]] — formats fresh KRaft storage in DIR/data with the
# cluster id (a new one when empty or missing; the nodes of one cluster share theirs) and any further
# StorageTool ARGS (kafka_scram_args). The static quorum in server.properties means no --standalone is
# needed.
kafka_format() {
  local java=$1 cp=$2 d=$3 cluster=${4:-$(kafka_cluster_id)}
  shift $(( $# < 4 ? $# : 4 ))
  if ! timeout 120 "$java" -Xmx256m -cp "$cp" kafka.tools.StorageTool format -t "$cluster" \
      -c "$d/server.properties" --ignore-formatted "$@" > "$d/format.log" 2>&1; then
    tail_log kafka "$d/format.log"
    die "kafka: formatting the storage failed"
  fi
}

# kafka_roundtrip PORT [KCAT_ARGS...] — produces one message with a header to a throwaway topic
# (auto-created) and reads it back, so "ready" means a client can really use the broker, not just fetch
# metadata. KCAT_ARGS go to every kcat call (e.g. -F kcat-tls.conf for the secured listener).
kafka_roundtrip() {
  local port=$1 token="ping-$$-$RANDOM$RANDOM" out="" i
  shift
  printf '%s\n' "$token" | timeout 30 kcat "$@" -b "127.0.0.1:$port" -P -t "$KAFKA_CHECK_TOPIC" \
    -H "check=$token" >/dev/null 2>&1 || return 1
  for i in 1 2 3; do
    out=$(timeout 20 kcat "$@" -b "127.0.0.1:$port" -C -t "$KAFKA_CHECK_TOPIC" -e -o beginning -q \
      -f '%h %s\n' 2>/dev/null) || true
    [[ $out == *"check=$token $token"* ]] && return 0
    sleep 1
  done
  return 1
}

# kafka_start — fresh storage, free ports, config, launch, wait until a metadata request answers, then
# a produce/consume round trip. A leftover Kafka of ours (alive but not answering) is stopped first.
# With TLS (tls_wanted), the secured listener too, its SCRAM users added when the storage is formatted
# (a restart keeps the storage and with it the users), and a second round trip through it.
kafka_start() {
  local d; d=$(dir kafka)
  local cp java port cport tls="" scram=()
  cmdline_has "$d/pid" kafka.Kafka && kafka_stop
  cp=$(maven_classpath kafka "$KAFKA_POM_DIR")
  java=$(java_bin)
  port=$(pick_port kafka $(recorded_port "$d/port") 19092 29092 39092)
  cport=$(pick_port kafka $(recorded_port "$d/controller-port") 19093 29093 39093)
  if tls_wanted; then
    tls_material
    tls=$(pick_port kafka $(recorded_port "$d/tls-port") 19094 29094 39094)
    mapfile -t scram < <(kafka_scram_args)
  fi
  tls_mark "$d"
  log "kafka: starting on 127.0.0.1:$port (controller 127.0.0.1:$cport${tls:+, SASL_SSL 127.0.0.1:$tls})"
  keep_data || rm -rf "$d/data"
  printf '%s\n' "$cport" > "$d/controller-port"
  kafka_write_config "$d" "$port" "$cport" "" "" "" "" "$tls"
  # A restart keeps the formatted storage (formatting again would need the same cluster id), and with it
  # the SCRAM users.
  if ! keep_data || [ ! -s "$d/data/meta.properties" ]; then
    kafka_format "$java" "$cp" "$d" "" "${scram[@]}"
  fi
  printf '%s\n' "$port" > "$d/port"
  if [ -n "$tls" ]; then
    printf '%s\n' "$tls" > "$d/tls-port"
    kafka_tls_client_configs "$d" "$tls"
  fi
  launch_detached kafka "$d" "$d/kafka.log" \
    "$java" -Xms128m -Xmx512m -XX:+UseG1GC -cp "$cp" kafka.Kafka "$d/server.properties"
  serve_or_stop kafka kafka_stop 120 kcat -b "127.0.0.1:$port" -L -m 5
  roundtrip_or_stop kafka kafka_stop "metadata answers but a produce/consume round trip on 127.0.0.1:$port failed" \
    kafka_roundtrip "$port"
  if [ -n "$tls" ]; then
    serve_or_stop kafka kafka_stop 60 kcat -F "$d/kcat-tls.conf" -L -m 5
    roundtrip_or_stop kafka kafka_stop "the SASL_SSL listener 127.0.0.1:$tls answers, but a round trip through it failed" \
      kafka_roundtrip "$tls" -F "$d/kcat-tls.conf"
    roundtrip_or_stop kafka kafka_stop "no SCRAM-SHA-512 login as $TLS_USER on 127.0.0.1:$tls (see $d/scram-check.log)" \
      kafka_scram_check "$java" "$cp" "$d" "$tls"
  fi
  log "kafka: up at kafka://127.0.0.1:$port${tls:+ and SASL_SSL 127.0.0.1:$tls} (pid $(cat "$d/pid"), round trip ok)"
}

# kafka_tls_status — prints the RETRY_TEST_KAFKA_TLS URL when our broker runs with its secured listener
# and a client (kcat, PLAIN) gets metadata through it; else 1, silent.
kafka_tls_status() {
  local d="$STATE/kafka"
  tls_on kafka && cmdline_has "$d/pid" kafka.Kafka && [ -s "$d/tls-port" ] && [ -s "$d/kcat-tls.conf" ] || return 1
  timeout 20 kcat -F "$d/kcat-tls.conf" -L -m 5 >/dev/null 2>&1 || return 1
  printf 'kafka://127.0.0.1:%s?security.protocol=SASL_SSL&sasl.mechanism=SCRAM-SHA-512&sasl.username=%s' \
    "$(cat "$d/tls-port")" "$TLS_USER"
  printf '&sasl.password_file=%s&ssl.ca.location=%s\n' "$TLS_DIR/kafka.password" "$TLS_DIR/ca.pem"
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
