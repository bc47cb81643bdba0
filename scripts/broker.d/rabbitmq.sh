# RabbitMQ from Debian's rabbitmq-server package, run as a private node of our own (its own node name,
# ports, data and log folders), so starting and stopping it never touches a system RabbitMQ.
#
# The server runs as user rabbitmq, which may not be able to reach a clone under a private home folder, so
# its data, log and pid file live in a folder it owns under /tmp (named in $STATE/rabbitmq/node-dir); our
# own records (port, the server's pid, whether we started epmd) stay in $STATE/rabbitmq/.

rabbitmq_node() { printf 'eventretry@localhost'; }

# rabbitmq_ctl ARGS... — rabbitmqctl against our node (Debian's wrapper switches to the rabbitmq user).
rabbitmq_ctl() { rabbitmqctl -q -n "$(rabbitmq_node)" "$@"; }

# rabbitmq_install — the server (Erlang comes with it). The package's own start of a system broker is
# prevented while it installs (a policy-rc.d that refuses, unless the machine already has one).
rabbitmq_install() {
  dpkg-query -W -f='${Status}' rabbitmq-server 2>/dev/null | grep -q 'install ok installed' && return 0
  local policy=/usr/sbin/policy-rc.d ours=false
  if [ ! -e "$policy" ] && [ "$(id -u)" -eq 0 ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && ours=true
  fi
  apt_install rabbitmq-server procps
  $ours && rm -f "$policy"
  if command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now rabbitmq-server >/dev/null 2>&1 || true
  fi
}

# rabbitmq_node_dir — the folder user rabbitmq owns for our node (created on first use).
rabbitmq_node_dir() {
  local d; d=$(dir rabbitmq)
  if [ ! -s "$d/node-dir" ] || [ ! -d "$(cat "$d/node-dir")" ]; then
    mktemp -d /tmp/event-retry-rabbitmq.XXXXXX > "$d/node-dir"
  fi
  cat "$d/node-dir"
}

# rabbitmq_server_pid — the pid of our node, from our copy or from the server's own pid file.
rabbitmq_server_pid() {
  local d="$STATE/rabbitmq" f
  for f in "$d/server.pid" "$(cat "$d/node-dir" 2>/dev/null)/pid"; do
    if alive "$f"; then cat "$f"; return 0; fi
  done
  return 1
}

# rabbitmq_pid — the server's pid, for `scripts/brokers pid rabbitmq` (fault runs signal it).
rabbitmq_pid() { rabbitmq_server_pid || die "rabbitmq: not running"; }

# rabbitmq_start — starts the node on loopback with fresh data and waits until it accepts connections.
rabbitmq_start() {
  local d n port dist
  d=$(dir rabbitmq)
  rabbitmq_server_pid >/dev/null && rabbitmq_stop   # a half-started node of ours holds the node name
  n=$(rabbitmq_node_dir)
  port=$(pick_port rabbitmq $(recorded_port "$d/port") 5672 5673 35672)
  dist=$(pick_port rabbitmq-dist $(recorded_port "$d/dist-port") 25673 45673 55673)
  printf '%s' "$port" > "$d/port"
  printf '%s' "$dist" > "$d/dist-port"
  # A stale node from an earlier run must not be reused: fresh data and logs every start (but a restart).
  keep_data || rm -rf "$n/mnesia"
  rm -rf "$n/rabbitmq.log" "$n/pid" "$d/server.pid"
  mkdir -p "$n/mnesia"
  touch "$n/rabbitmq.log"
  chown -R rabbitmq:rabbitmq "$n" || die "rabbitmq: cannot give $n to user rabbitmq"
  runuser -u rabbitmq -- test -w "$n" || die "rabbitmq: user rabbitmq cannot write $n"
  ln -sfn "$n/rabbitmq.log" "$d/rabbitmq.log"
  # epmd (Erlang's port mapper) is shared by every Erlang node; stop it later only if we started it.
  if ! running_named epmd; then echo ours > "$d/epmd"; elif [ ! -f "$d/epmd" ]; then echo external > "$d/epmd"; fi
  log "rabbitmq: starting node $(rabbitmq_node) on 127.0.0.1:$port (data $n)"
  RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$port RABBITMQ_DIST_PORT=$dist \
  RABBITMQ_NODENAME=$(rabbitmq_node) RABBITMQ_MNESIA_BASE=$n/mnesia RABBITMQ_LOG_BASE=$n \
  RABBITMQ_PID_FILE=$n/pid RABBITMQ_CONFIG_FILE=$n/rabbitmq RABBITMQ_LOGS=$n/rabbitmq.log \
    rabbitmq-server -detached > "$d/detach.out" 2>&1 || { tail_log rabbitmq "$d/detach.out"; die "rabbitmq: could not start"; }
  # The pid file appears once the VM is up; await_startup then waits for the boot to finish.
  if ! (wait_ready rabbitmq 90 "" "$n/rabbitmq.log" rabbitmq_ctl await_startup --timeout 15 \
        && wait_ready rabbitmq 30 "$n/pid" "$n/rabbitmq.log" rabbitmq_ctl status); then
    rabbitmq_stop; exit 1
  fi
  port_in_use "$port" || { tail_log rabbitmq "$n/rabbitmq.log"; rabbitmq_stop; die "rabbitmq: nothing listens on $port"; }
  # RabbitMQ deletes its own pid file when it stops; keep our copy to wait for the process itself.
  cp "$n/pid" "$d/server.pid"
  log "rabbitmq: up at amqp://127.0.0.1:$port (pid $(cat "$d/server.pid"))"
}

# rabbitmq_status — prints the AMQP URL and succeeds if our node is up.
rabbitmq_status() {
  local d="$STATE/rabbitmq"
  alive "$d/server.pid" && [ -s "$d/port" ] && port_in_use "$(cat "$d/port")" || return 1
  printf 'amqp://guest:guest@127.0.0.1:%s/%%2f' "$(cat "$d/port")"
}

# rabbitmq_stop — stops our node (and epmd, if it was ours); also a node that never finished starting.
rabbitmq_stop() {
  local d="$STATE/rabbitmq" pid
  if pid=$(rabbitmq_server_pid); then
    bounded 60 rabbitmq_ctl stop >/dev/null 2>&1 || true
    echo "$pid" > "$d/server.pid"
    stop_pid rabbitmq "$d/server.pid" 30
  fi
  rm -f "$d/server.pid"
  if [ "$(cat "$d/epmd" 2>/dev/null)" = ours ]; then
    # `epmd -kill` refuses while a short-lived CLI node is still registered; fall back to a signal.
    epmd -kill >/dev/null 2>&1 || pkill -x epmd || true
  fi
  rm -f "$d/epmd"
  log "rabbitmq: stopped"
}
