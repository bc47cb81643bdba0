# RabbitMQ from Debian's rabbitmq-server package, run as a private node of our own (its own node name,
# ports, data and log folders), so starting and stopping it never touches a system RabbitMQ.

rabbitmq_node() { printf 'eventretry@localhost'; }

# rabbitmq_ctl ARGS... — rabbitmqctl against our node (Debian's wrapper switches to the rabbitmq user).
rabbitmq_ctl() { rabbitmqctl -q -n "$(rabbitmq_node)" "$@"; }

# Installs the server (Erlang comes with it).
rabbitmq_install() {
  apt_install rabbitmq-server
}

# Starts the node on loopback with fresh data, and waits until it accepts AMQP connections.
rabbitmq_start() {
  local d; d=$(dir rabbitmq)
  local port dist
  port=$(pick_port rabbitmq 5672 5673 35672)
  dist=$(pick_port rabbitmq-dist 25673 45673 55673)
  printf '%s' "$port" > "$d/port"
  # A stale node from an earlier run must not be reused: fresh data and logs every start. The server runs
  # as user rabbitmq, so it must own them.
  rm -rf "$d/mnesia" "$d/log" "$d/rabbitmq.log" "$d/detach.out"
  mkdir -p "$d/mnesia" "$d/log"
  touch "$d/rabbitmq.log"
  chown -R rabbitmq:rabbitmq "$d" 2>/dev/null || true
  # epmd (Erlang's port mapper) is shared by every Erlang node; stop it later only if we started it.
  if ! running_named epmd; then echo ours > "$d/epmd"; elif [ ! -f "$d/epmd" ]; then echo external > "$d/epmd"; fi
  RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$port RABBITMQ_DIST_PORT=$dist \
  RABBITMQ_NODENAME=$(rabbitmq_node) RABBITMQ_MNESIA_BASE=$d/mnesia RABBITMQ_LOG_BASE=$d/log \
  RABBITMQ_PID_FILE=$d/pid RABBITMQ_CONFIG_FILE=$d/rabbitmq RABBITMQ_LOGS=$d/rabbitmq.log \
    rabbitmq-server -detached > "$d/detach.out" 2>&1 || { tail_log rabbitmq "$d/detach.out"; die "rabbitmq: could not start"; }
  # The pid file appears once the VM is up; await_startup then waits for the boot to finish.
  wait_ready rabbitmq 90 "" "$d/rabbitmq.log" rabbitmq_ctl await_startup --timeout 15
  wait_ready rabbitmq 30 "$d/pid" "$d/rabbitmq.log" rabbitmq_ctl status
  port_in_use "$port" || { tail_log rabbitmq "$d/rabbitmq.log"; die "rabbitmq: nothing listens on $port"; }
  # RabbitMQ deletes its own pid file when it stops; keep our copy to wait for the process itself.
  cp "$d/pid" "$d/server.pid"
}

# Prints the AMQP URL and succeeds if our node is up.
rabbitmq_status() {
  local d="$STATE/rabbitmq"
  alive "$d/server.pid" && [ -s "$d/port" ] && port_in_use "$(cat "$d/port")" || return 1
  printf 'amqp://guest:guest@127.0.0.1:%s/%%2f' "$(cat "$d/port")"
}

# Stops our node (and epmd, if it was ours).
rabbitmq_stop() {
  local d="$STATE/rabbitmq"
  if alive "$d/server.pid"; then
    timeout 60 rabbitmqctl -q -n "$(rabbitmq_node)" stop >/dev/null 2>&1 || true
    stop_pid rabbitmq "$d/server.pid" 30
  fi
  rm -f "$d/pid" "$d/server.pid"
  if [ "$(cat "$d/epmd" 2>/dev/null)" = ours ]; then
    # `epmd -kill` refuses while a short-lived CLI node is still registered; fall back to a signal.
    epmd -kill >/dev/null 2>&1 || pkill -x epmd || true
  fi
  rm -f "$d/epmd"
  log "rabbitmq: stopped"
}
