# RabbitMQ from Debian's rabbitmq-server package, run as a private node of our own (its own node name,
# ports, data and log folders), so starting and stopping it never touches a system RabbitMQ.
#
# The server runs as user rabbitmq, which may not be able to reach a clone under a private home folder, so
# its data, log and pid file live in a folder it owns under /tmp (named in $STATE/rabbitmq/node-dir); our
# own records (port, the server's pid, whether we started epmd) stay in $STATE/rabbitmq/.
#
# With --tls the node also serves AMQP over TLS on 127.0.0.1:<tls-port> ($STATE/rabbitmq/tls-port): the
# server certificate of tls.sh, client certificates asked for and verified but optional, and the login
# mechanisms PLAIN, AMQPLAIN and EXTERNAL (plugin rabbitmq_auth_mechanism_ssl; the user is the client
# certificate's CN). User event-retry (password amqp.password) gets every permission on vhost /; guest
# keeps working on the plaintext port. The node's config file, plugin list and copies of the PEM files
# (user rabbitmq must read them) go to its own folder; without --tls there is no config file at all.

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

# rabbitmq_host_epmd_pids — the live epmd processes of the machine's own root: RabbitMQ 4 (rabbitmq4.sh)
# runs an epmd of its own, on another port, in a root of its own, which these scripts must not take for
# the 3.10 nodes' or stop.
rabbitmq_host_epmd_pids() {
  local p
  for p in $(pgrep -x epmd 2>/dev/null || true); do
    [ "$(readlink "/proc/$p/root" 2>/dev/null)" = / ] && pid_running "$p" && printf '%s\n' "$p"
  done
  return 0
}

# rabbitmq_host_epmd_stop — stops the machine's own epmd: `epmd -kill`, which refuses while a
# short-lived CLI node is still registered, then a signal.
rabbitmq_host_epmd_stop() {
  local pids
  epmd -kill >/dev/null 2>&1 && return 0
  pids=$(rabbitmq_host_epmd_pids)
  # shellcheck disable=SC2086 # one pid per word
  [ -z "$pids" ] || kill $pids 2>/dev/null || true
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

# rabbitmq_tls_files NODE_DIR TLS_PORT [SEEN_AS] — the node's config file and plugin list for the TLS
# listener, and the PEM files it names, copied into NODE_DIR/tls (given to user rabbitmq by the caller).
# SEEN_AS is NODE_DIR as the node sees it (RabbitMQ 4 runs in a root of its own); NODE_DIR by default.
rabbitmq_tls_files() {
  local n=$1 seen=${3:-$1} f
  mkdir -p "$n/tls"
  for f in ca.pem server.pem server.key; do
    ( umask 077; cat "$TLS_DIR/$f" > "$n/tls/$f" )
  done
  cat > "$n/rabbitmq.conf" <<EOF
# Written by scripts/broker.d/rabbitmq.sh when started with --tls; edits are lost.
listeners.ssl.default = 127.0.0.1:$2
ssl_options.cacertfile = $seen/tls/ca.pem
ssl_options.certfile = $seen/tls/server.pem
ssl_options.keyfile = $seen/tls/server.key
# A client certificate is asked for and, when sent, must be signed by the CA; none is needed.
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = false
auth_mechanisms.1 = PLAIN
auth_mechanisms.2 = AMQPLAIN
auth_mechanisms.3 = EXTERNAL
# EXTERNAL logs in as the client certificate's CN.
ssl_cert_login_from = common_name
EOF
  printf '[rabbitmq_auth_mechanism_ssl].\n' > "$n/enabled_plugins"
}

# rabbitmq_tls_user — makes (or, on a restart's kept data, updates) user event-retry with the password of
# tls.sh and every permission on vhost /. The password goes through stdin, never a command line.
rabbitmq_tls_user() {
  if rabbitmq_ctl list_users | awk '{print $1}' | grep -qx "$TLS_USER"; then
    rabbitmq_ctl change_password "$TLS_USER" < "$TLS_DIR/amqp.password" >/dev/null
  else
    rabbitmq_ctl add_user "$TLS_USER" < "$TLS_DIR/amqp.password" >/dev/null
  fi && rabbitmq_ctl set_permissions -p / "$TLS_USER" '.*' '.*' '.*' >/dev/null
}

# rabbitmq_hex TEXT — TEXT's bytes in hex.
rabbitmq_hex() { printf '%s' "$1" | od -An -tx1 -v | tr -d ' \n'; }

# rabbitmq_unhex HEX — writes the bytes spelled in HEX (NUL bytes included).
rabbitmq_unhex() { printf '%b' "$(printf '%s' "$1" | sed 's/../\\x&/g')"; }

# rabbitmq_amqp_opening MECHANISM RESPONSE_HEX — in hex, the client's opening of an AMQP 0-9-1 connection:
# the protocol header, then a connection.start-ok frame with no client properties, MECHANISM, its
# response (given in hex) and locale en_US.
rabbitmq_amqp_opening() {
  local mech resp=$2 payload
  mech=$(rabbitmq_hex "$1")
  payload="000a000b00000000$(printf %02x $((${#mech} / 2)))$mech$(printf %08x $((${#resp} / 2)))${resp}05$(rabbitmq_hex en_US)"
  printf '414d515000000901010000%08x%sce' $((${#payload} / 2)) "$payload"
}

# rabbitmq_tls_login PORT MECHANISM — logs in over TLS on 127.0.0.1:PORT, verifying the server's
# certificate (our CA, IP address 127.0.0.1) and presenting the client certificate: PLAIN as event-retry
# with its password, or EXTERNAL (as the certificate's CN). True when the server answers connection.tune,
# i.e. took the login. Needs nothing but openssl; the password never leaves the shell.
rabbitmq_tls_login() {
  local port=$1 mech=$2 resp="" answer
  if [ "$mech" = PLAIN ]; then
    resp=00$(rabbitmq_hex "$TLS_USER")00$(rabbitmq_hex "$(tls_secret amqp.password)")
  fi
  # The frames go out at once (the server reads start-ok after sending connection.start); the pause
  # leaves time for the answer before the end of input closes the connection.
  answer=$( { rabbitmq_unhex "$(rabbitmq_amqp_opening "$mech" "$resp")"; sleep 2; } \
    | timeout 15 openssl s_client -quiet -no_ign_eof -connect "127.0.0.1:$port" \
        -CAfile "$TLS_DIR/ca.pem" -verify_return_error -verify_ip 127.0.0.1 \
        -cert "$TLS_DIR/client.pem" -key "$TLS_DIR/client.key" 2>/dev/null \
    | od -An -tx1 -v | tr -d ' \n')
  # connection.tune: frame type 1, channel 0, size 12, class 10, method 30.
  [[ $answer == *0100000000000c000a001e* ]]
}

# rabbitmq_tls_logins NAME STOP_FN PIDFILE LOG PORT — waits until the TLS listener on 127.0.0.1:PORT takes
# a PLAIN login as event-retry, then checks an EXTERNAL (client certificate) one; on a failure stops the
# node NAME with STOP_FN and fails. PIDFILE and LOG are the node's (wait_ready).
rabbitmq_tls_logins() {
  local name=$1 stop=$2 pidfile=$3 logfile=$4 port=$5
  if ! (wait_ready "$name" 30 "$pidfile" "$logfile" rabbitmq_tls_login "$port" PLAIN); then
    "$stop"; die "$name: no PLAIN login as $TLS_USER over TLS on 127.0.0.1:$port"
  fi
  rabbitmq_tls_login "$port" EXTERNAL \
    || { tail_log "$name" "$logfile"; "$stop"; die "$name: no EXTERNAL (client certificate) login over TLS on 127.0.0.1:$port"; }
}

# rabbitmq_tls_url PORT — prints the URL of the TLS listener on 127.0.0.1:PORT (user event-retry, its
# password file and the CA named) when a TLS handshake with it verifies; else 1, silent.
rabbitmq_tls_url() {
  rabbitmq_tls_handshake "$1" || return 1
  printf 'amqps://%s@127.0.0.1:%s/%%2f?password_file=%s&tls_ca=%s\n' \
    "$TLS_USER" "$1" "$TLS_DIR/amqp.password" "$TLS_DIR/ca.pem"
}

# rabbitmq_tls_handshake PORT [CA_FILE] — true when a TLS handshake with 127.0.0.1:PORT succeeds and the
# server's certificate verifies against CA_FILE (default: our CA) for IP 127.0.0.1.
rabbitmq_tls_handshake() {
  timeout 10 openssl s_client -connect "127.0.0.1:$1" -CAfile "${2:-$TLS_DIR/ca.pem}" \
    -verify_return_error -verify_ip 127.0.0.1 < /dev/null >/dev/null 2>&1
}

# rabbitmq_start — starts the node on loopback with fresh data and waits until it accepts connections;
# with TLS (tls_wanted) also the TLS listener, checked with a PLAIN and an EXTERNAL login through it.
rabbitmq_start() {
  local d n port dist tls="" tls_env=()
  d=$(dir rabbitmq)
  rabbitmq_server_pid >/dev/null && rabbitmq_stop   # a half-started node of ours holds the node name
  n=$(rabbitmq_node_dir)
  port=$(pick_port rabbitmq $(recorded_port "$d/port") 5672 5673 35672)
  dist=$(pick_port rabbitmq-dist $(recorded_port "$d/dist-port") 25673 45673 55673)
  if tls_wanted; then
    tls_material
    tls=$(pick_port rabbitmq $(recorded_port "$d/tls-port") 5671 15671 25671)
  fi
  tls_mark "$d"
  printf '%s' "$port" > "$d/port"
  printf '%s' "$dist" > "$d/dist-port"
  # A stale node from an earlier run must not be reused: fresh data and logs every start (but a restart).
  keep_data || rm -rf "$n/mnesia"
  rm -rf "$n/rabbitmq.log" "$n/pid" "$d/server.pid" "$n/rabbitmq.conf" "$n/enabled_plugins" "$n/tls"
  mkdir -p "$n/mnesia"
  touch "$n/rabbitmq.log"
  if [ -n "$tls" ]; then
    printf '%s' "$tls" > "$d/tls-port"
    rabbitmq_tls_files "$n" "$tls"
    tls_env=(RABBITMQ_ENABLED_PLUGINS_FILE="$n/enabled_plugins")
  fi
  chown -R rabbitmq:rabbitmq "$n" || die "rabbitmq: cannot give $n to user rabbitmq"
  runuser -u rabbitmq -- test -w "$n" || die "rabbitmq: user rabbitmq cannot write $n"
  ln -sfn "$n/rabbitmq.log" "$d/rabbitmq.log"
  # epmd (Erlang's port mapper) is shared by every Erlang node; stop it later only if we started it.
  if [ -z "$(rabbitmq_host_epmd_pids)" ]; then echo ours > "$d/epmd"; elif [ ! -f "$d/epmd" ]; then echo external > "$d/epmd"; fi
  log "rabbitmq: starting node $(rabbitmq_node) on 127.0.0.1:$port${tls:+ (TLS 127.0.0.1:$tls)} (data $n)"
  env RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT="$port" RABBITMQ_DIST_PORT="$dist" \
  RABBITMQ_NODENAME="$(rabbitmq_node)" RABBITMQ_MNESIA_BASE="$n/mnesia" RABBITMQ_LOG_BASE="$n" \
  RABBITMQ_PID_FILE="$n/pid" RABBITMQ_CONFIG_FILE="$n/rabbitmq" RABBITMQ_LOGS="$n/rabbitmq.log" "${tls_env[@]}" \
    rabbitmq-server -detached > "$d/detach.out" 2>&1 || { tail_log rabbitmq "$d/detach.out"; die "rabbitmq: could not start"; }
  # The pid file appears once the VM is up; await_startup then waits for the boot to finish.
  if ! (wait_ready rabbitmq 90 "" "$n/rabbitmq.log" rabbitmq_ctl await_startup --timeout 15 \
        && wait_ready rabbitmq 30 "$n/pid" "$n/rabbitmq.log" rabbitmq_ctl status); then
    rabbitmq_stop; exit 1
  fi
  port_in_use "$port" || { tail_log rabbitmq "$n/rabbitmq.log"; rabbitmq_stop; die "rabbitmq: nothing listens on $port"; }
  # RabbitMQ deletes its own pid file when it stops; keep our copy to wait for the process itself.
  cp "$n/pid" "$d/server.pid"
  if [ -n "$tls" ]; then
    rabbitmq_tls_user || { rabbitmq_stop; die "rabbitmq: could not set up user $TLS_USER"; }
    rabbitmq_tls_logins rabbitmq rabbitmq_stop "$d/server.pid" "$n/rabbitmq.log" "$tls"
  fi
  log "rabbitmq: up at amqp://127.0.0.1:$port${tls:+ and amqps://127.0.0.1:$tls} (pid $(cat "$d/server.pid"))"
}

# rabbitmq_tls_status — prints the RETRY_TEST_AMQP_TLS URL when our node runs with its TLS listener and a
# TLS handshake with it verifies; else 1, silent.
rabbitmq_tls_status() {
  local d="$STATE/rabbitmq"
  tls_on rabbitmq && alive "$d/server.pid" && [ -s "$d/tls-port" ] || return 1
  rabbitmq_tls_url "$(cat "$d/tls-port")"
}

# rabbitmq_status — prints the AMQP URL and succeeds if our node is up.
rabbitmq_status() {
  local d="$STATE/rabbitmq"
  alive "$d/server.pid" && [ -s "$d/port" ] && port_in_use "$(cat "$d/port")" || return 1
  printf 'amqp://guest:guest@127.0.0.1:%s/%%2f' "$(cat "$d/port")"
}

# rabbitmq_cluster_alive — true while a node of the 3-node cluster (rabbitmq-cluster.sh) runs: they share
# epmd with this node.
rabbitmq_cluster_alive() {
  local f
  for f in "$STATE"/rabbitmq-cluster/server-*.pid; do alive "$f" && return 0; done
  return 1
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
  if [ "$(cat "$d/epmd" 2>/dev/null)" = ours ] && ! rabbitmq_cluster_alive; then
    rabbitmq_host_epmd_stop
  fi
  rm -f "$d/epmd"
  # Unless keeping data, the node's folder under /tmp goes too (the next start makes a fresh one): a
  # clone deleted after a run leaves nothing behind.
  if ! keep_data && [ -s "$d/node-dir" ] && ! rabbitmq_server_pid >/dev/null; then
    case "$(cat "$d/node-dir")" in
      /tmp/event-retry-rabbitmq.*) rm -rf "$(cat "$d/node-dir")" && rm -f "$d/node-dir" ;;
    esac
  fi
}
