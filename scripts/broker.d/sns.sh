# moto's server from PyPI in a virtual environment: one endpoint that speaks SNS and SQS, the local
# stand-in for consumer groups through SNS (the SQS adapter's `sns` setting; ElasticMQ has no SNS). The
# environment is built once per requirements hash under $CACHE/sns/ (pip's own cache keeps the wheels);
# state under $STATE/sns/: pid, port, sns.log. It keeps everything in memory, so every start is fresh.

SNS_DIR="$ROOT/scripts/broker.d/sns"

# sns_venv — the virtual environment's folder for the pinned requirements.
sns_venv() {
  local hash; hash=$(cat "$SNS_DIR/requirements.txt" "$SNS_DIR/constraints.txt" | sha256sum | cut -c1-16)
  printf '%s' "$CACHE/sns/venv-$hash"
}

# sns_install — Python's venv module and the environment with moto's server (built once, then reused).
sns_install() {
  apt_install curl python3 python3-venv
  local venv; venv=$(sns_venv)
  [ -x "$venv/bin/moto_server" ] && [ -e "$venv/.complete" ] && return 0
  log "sns: installing moto's server into $venv (first run downloads from PyPI)"
  rm -rf "$venv"; mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv" || die "sns: python3 -m venv failed"
  timeout 900 "$venv/bin/pip" install -q --disable-pip-version-check \
    -r "$SNS_DIR/requirements.txt" -c "$SNS_DIR/constraints.txt" > "$CACHE/sns/pip.log" 2>&1 \
    || { tail -n 30 "$CACHE/sns/pip.log" >&2; die "sns: pip could not install moto's server"; }
  touch "$venv/.complete"
}

# sns_answers PORT — moto's own API answers on the port.
sns_answers() {
  curl -sf -m 5 "http://127.0.0.1:$1/moto-api/" >/dev/null
}

# sns_roundtrip PORT — a publish to a topic arrives in a queue subscribed to it (selfcheck.py).
sns_roundtrip() {
  timeout 60 "$(sns_venv)/bin/python" "$SNS_DIR/selfcheck.py" "http://127.0.0.1:$1"
}

# sns_start — launch on a free port, wait until it answers, then a publish/receive round trip.
sns_start() {
  local d; d=$(dir sns)
  local port venv
  cmdline_has "$d/pid" moto_server && sns_stop
  venv=$(sns_venv)
  port=$(pick_port sns $(recorded_port "$d/port") 9911 19911 29911)
  printf '%s\n' "$port" > "$d/port"
  log "sns: starting moto's server (SNS and SQS) on 127.0.0.1:$port"
  launch_detached sns "$d" "$d/sns.log" "$venv/bin/python" "$venv/bin/moto_server" -H 127.0.0.1 -p "$port"
  serve_or_stop sns sns_stop 60 sns_answers "$port"
  roundtrip_or_stop sns sns_stop "the server answers but a publish did not reach a subscribed queue" \
    sns_roundtrip "$port"
  log "sns: up at http://127.0.0.1:$port (pid $(cat "$d/pid"), round trip ok)"
}

# sns_status — prints the endpoint URL if our server is alive and answers; else 1, silent.
sns_status() {
  local d="$STATE/sns" port
  cmdline_has "$d/pid" moto_server && [ -s "$d/port" ] || return 1
  port=$(cat "$d/port")
  sns_answers "$port" || return 1
  printf 'http://127.0.0.1:%s\n' "$port"
}

# sns_stop — SIGTERM, SIGKILL after 10 s; only our own pid.
sns_stop() {
  local pidfile="$STATE/sns/pid"
  if [ -e "$pidfile" ] && ! cmdline_has "$pidfile" moto_server; then rm -f "$pidfile"; return 0; fi
  stop_pid sns "$pidfile" 10
}
