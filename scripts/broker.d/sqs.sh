# ElasticMQ (the SQS API) from Maven Central jars (the Maven project in broker.d/sqs/), the local stand-in
# for Amazon SQS. State under $STATE/sqs/: elasticmq.conf, pid, port, sqs.log, and — when started with
# --durable (RETRY_BROKERS_DURABLE=1; the marker file `durable` records it) — messages.mv.db: queues and
# messages in an embedded H2 database, each change written at once (WRITE_DELAY=0), so a restart
# (`scripts/brokers restart sqs`, the fault runs' F2) comes back with what it had, as SQS keeps what it
# acknowledged. What it does not keep: a received message's invisibility (it is visible again after a
# restart). A start (not a restart) begins empty.
#
# Why the store is not on by default: in ElasticMQ 1.7.1 the store's actor serializes the same mutable
# message object the queue's actor goes on changing, and now and then fails with "mutation occurred during
# iteration" (ConcurrentModificationException in DBMessage.from). The queue's actor has already applied the
# request, but waits in vain for the store's answer and never replies: the HTTP request is answered 503
# after 20 s, and the client's SDK sends it again — a SendMessage then stores a second copy (the likely
# cause of a conformance run that once saw an event succeed twice). Without the store nothing waits on
# that actor.

SQS_POM_DIR="$ROOT/scripts/broker.d/sqs"

# sqs_install — the server's classpath (resolved once, then cached) and curl for the checks.
sqs_install() {
  apt_install curl
  maven_classpath sqs "$SQS_POM_DIR" >/dev/null
}

# sqs_list_queues PORT — one real API round trip (ListQueues over the query protocol).
sqs_list_queues() {
  curl -sf -m 5 "http://127.0.0.1:$1/?Action=ListQueues" >/dev/null
}

# sqs_roundtrip PORT — creates a queue of its own, sends a message, receives it back (a client can really
# use it), and deletes the queue: the broker keeps its queues across a restart, and an earlier check's
# message must not answer for this one.
sqs_roundtrip() {
  local base="http://127.0.0.1:$1" q="brokers-selfcheck-$$-$RANDOM" token="ping-$$-$RANDOM" rc=0
  curl -sf -m 5 "$base/?Action=CreateQueue&QueueName=$q" >/dev/null || return 1
  curl -sf -m 5 "$base/000000000000/$q?Action=SendMessage&MessageBody=$token" >/dev/null &&
    curl -sf -m 10 "$base/000000000000/$q?Action=ReceiveMessage&WaitTimeSeconds=2" | grep -q "$token" || rc=1
  curl -sf -m 5 "$base/000000000000/$q?Action=DeleteQueue" >/dev/null || true
  return $rc
}

# sqs_start — config with a free port, launch, wait until ListQueues answers, then a send/receive.
sqs_start() {
  local d; d=$(dir sqs)
  local cp java port
  cmdline_has "$d/pid" org.elasticmq.server.Main && sqs_stop
  cp=$(maven_classpath sqs "$SQS_POM_DIR")
  java=$(java_bin)
  port=$(pick_port sqs $(recorded_port "$d/port") 9324 19324 29324)
  # A restart keeps what the broker had, the store's choice with it; a start takes RETRY_BROKERS_DURABLE.
  if [ -z "${RETRY_BROKERS_KEEP_DATA:-}" ]; then
    rm -f "$d"/messages.*.db
    if [ -n "${RETRY_BROKERS_DURABLE:-}" ]; then : > "$d/durable"; else rm -f "$d/durable"; fi
  elif ! sqs_durable; then
    log "sqs: held its queues in memory: it comes back empty (scripts/brokers start --durable sqs keeps them)"
  fi
  local store=false
  if sqs_durable; then store=true; fi
  sed -e "s/@PORT@/$port/g" -e "s|@DATA@|$d/messages|g" -e "s/@STORE@/$store/g" \
    "$SQS_POM_DIR/elasticmq.conf.in" > "$d/elasticmq.conf"
  printf '%s\n' "$port" > "$d/port"
  log "sqs: starting ElasticMQ on 127.0.0.1:$port ($([ "$store" = true ] && echo "durable: messages in H2" || echo "messages in memory"))"
  # ElasticMQ holds every message on its heap: 100,000 waiting retries with their attributes take about
  # 200 MB, and a heap near its ceiling spends its time collecting (RETRY_BROKERS_SQS_HEAP, default 1g).
  launch_detached sqs "$d" "$d/sqs.log" \
    "$java" -Xms64m "-Xmx${RETRY_BROKERS_SQS_HEAP:-1g}" -Dconfig.file="$d/elasticmq.conf" -cp "$cp" org.elasticmq.server.Main
  serve_or_stop sqs sqs_stop 60 sqs_list_queues "$port"
  roundtrip_or_stop sqs sqs_stop "ListQueues answers but a send/receive round trip on 127.0.0.1:$port failed" \
    sqs_roundtrip "$port"
  log "sqs: up at http://127.0.0.1:$port (pid $(cat "$d/pid"), round trip ok)"
}

# sqs_status — prints the endpoint URL if our ElasticMQ is alive and answers; else 1, silent.
sqs_status() {
  local d="$STATE/sqs" port
  cmdline_has "$d/pid" org.elasticmq.server.Main && [ -s "$d/port" ] || return 1
  port=$(cat "$d/port")
  sqs_list_queues "$port" || return 1
  printf 'http://127.0.0.1:%s\n' "$port"
}

# sqs_stop — SIGTERM, SIGKILL after 30 s; only our own pid.
sqs_stop() {
  local pidfile="$STATE/sqs/pid"
  if [ -e "$pidfile" ] && ! cmdline_has "$pidfile" org.elasticmq.server.Main; then rm -f "$pidfile"; return 0; fi
  stop_pid sqs "$pidfile" 30
}

# sqs_durable — whether our ElasticMQ keeps its messages across a restart (started with --durable).
sqs_durable() { [ -f "$STATE/sqs/durable" ]; }
