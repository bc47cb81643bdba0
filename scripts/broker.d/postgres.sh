# PostgreSQL 15 from Debian's packages, run as a private cluster of our own (its own data folder, port and
# socket folder) for the outbox's tests; it never touches a system cluster.
#
# The server refuses to run as root, so it runs as user postgres, which may not be able to reach a clone
# under a private home folder: its data lives in a folder that user owns under /tmp (named in
# $STATE/postgres/data-dir). Local connections are trusted (loopback only, a throwaway cluster).
#
# With TLS (tls_wanted) the same port also takes TLS connections, with the throwaway CA's server
# certificate (tls.sh): postgres_tls_status answers with a sslmode=verify-full URL. The settings are in
# the cluster's postgresql.conf, so a test can turn TLS off for a while (ALTER SYSTEM, then a reload)
# to meet a server without it.

postgres_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

# postgres_as_owner CMD... — runs CMD as the cluster's owner (user postgres when we are root).
postgres_as_owner() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# postgres_install — the server and client packages (no system cluster is started by them here).
postgres_install() {
  local policy=/usr/sbin/policy-rc.d ours=false
  if ! dpkg-query -W -f='${Status}' postgresql-15 2>/dev/null | grep -q 'install ok installed'; then
    if [ ! -e "$policy" ] && [ "$(id -u)" -eq 0 ]; then
      printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && ours=true
    fi
    apt_install postgresql-15 postgresql-client-15
    $ours && rm -f "$policy"
  fi
  [ -n "$(postgres_bin)" ] || die "postgres: no server binaries under /usr/lib/postgresql"
}

# postgres_data_dir — the cluster folder (owned by the server's user; created on first use).
postgres_data_dir() {
  local d; d=$(dir postgres)
  if [ ! -s "$d/data-dir" ] || [ ! -d "$(cat "$d/data-dir")" ]; then
    mktemp -d /tmp/event-retry-postgres.XXXXXX > "$d/data-dir"
  fi
  cat "$d/data-dir"
}

# postgres_ready PORT — a real query answers.
postgres_ready() {
  psql -h 127.0.0.1 -p "$1" -U postgres -d postgres -Atc 'SELECT 1' 2>/dev/null | grep -q '^1$'
}

# postgres_start — a fresh cluster (unless restarting) on a free loopback port; waits for a query.
postgres_start() {
  local d n bin port
  d=$(dir postgres)
  n=$(postgres_data_dir)
  bin=$(postgres_bin)
  port=$(recorded_port "$d/port")
  [ -n "$port" ] || port=$(pick_port postgres 5432 15432 25432)
  printf '%s' "$port" > "$d/port"
  if ! keep_data; then
    rm -rf "$n/data"
  fi
  [ "$(id -u)" -eq 0 ] && chown postgres "$n"
  if [ ! -s "$n/data/PG_VERSION" ]; then
    postgres_as_owner "$bin/initdb" -D "$n/data" -U postgres -A trust -E UTF8 > "$d/initdb.log" 2>&1 \
      || { cat "$d/initdb.log" >&2; die "postgres: initdb failed"; }
  fi
  postgres_tls_settings "$n"
  tls_mark "$d"
  log "postgres: starting on 127.0.0.1:$port"
  rm -f "$d/pid"
  launch_detached postgres "$d" "$d/postgres.log" \
    runuser -u postgres -- "$bin/postgres" -D "$n/data" -p "$port" -c listen_addresses=127.0.0.1 \
      -c unix_socket_directories="$n" -c max_connections=200 -c fsync=on
  # launch_detached records the runuser wrapper's pid; the server's own pid is in its postmaster.pid.
  local i
  for i in $(seq 100); do
    [ -s "$n/data/postmaster.pid" ] && break; sleep 0.1
  done
  head -n 1 "$n/data/postmaster.pid" > "$d/pid" 2>/dev/null || true
  serve_or_stop postgres postgres_stop 60 postgres_ready "$port"
  log "postgres: up at postgres://postgres@127.0.0.1:$port/postgres (pid $(cat "$d/pid"))"
}

# postgres_tls_settings DIR — with TLS, the server's certificate and key in DIR (the key readable by the
# server's user alone, as it requires) and ssl on in the cluster's configuration; without, ssl off.
postgres_tls_settings() {
  local n=$1 conf="$1/data/postgresql.conf"
  sed -i '/^# event-retry tls$/,$d' "$conf"
  tls_wanted || return 0
  tls_material
  cp "$TLS_DIR/server.pem" "$n/server.pem"
  cp "$TLS_DIR/server.key" "$n/server.key"
  chmod 600 "$n/server.key"
  [ "$(id -u)" -eq 0 ] && chown postgres "$n/server.pem" "$n/server.key"
  printf "# event-retry tls\nssl = on\nssl_cert_file = '%s'\nssl_key_file = '%s'\n" \
    "$n/server.pem" "$n/server.key" >> "$conf"
}

# postgres_tls_status — prints the verify-full URL if our cluster was started with TLS and a query over
# TLS, checking the certificate and the host, answers; else 1, silent.
postgres_tls_status() {
  local d="$STATE/postgres" port url
  tls_on postgres && postgres_status >/dev/null || return 1
  port=$(cat "$d/port")
  url="postgres://postgres@127.0.0.1:$port/postgres?sslmode=verify-full&sslrootcert=$TLS_DIR/ca.pem"
  psql "$url" -Atc 'SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()' 2>/dev/null \
    | grep -q '^t$' || return 1
  printf '%s\n' "$url"
}

# postgres_status — prints the URL if our cluster is alive and answers; else 1, silent.
postgres_status() {
  local d="$STATE/postgres" port
  cmdline_has "$d/pid" "postgres" && [ -s "$d/port" ] || return 1
  port=$(cat "$d/port")
  postgres_ready "$port" || return 1
  printf 'postgres://postgres@127.0.0.1:%s/postgres\n' "$port"
}

# postgres_stop — a fast shutdown (SIGINT: roll back and stop), SIGKILL after 30 s; only our own pid.
# Unless keeping data, the cluster's folder under /tmp goes too (the next start makes a fresh one
# anyway): a clone deleted after a run leaves nothing behind.
postgres_stop() {
  local pidfile="$STATE/postgres/pid" pointer="$STATE/postgres/data-dir"
  if [ -e "$pidfile" ] && ! cmdline_has "$pidfile" postgres; then rm -f "$pidfile"; return 0; fi
  alive "$pidfile" && kill -INT "$(cat "$pidfile")" 2>/dev/null
  stop_pid postgres "$pidfile" 30 || return 1
  if ! keep_data && [ -s "$pointer" ]; then
    case "$(cat "$pointer")" in
      /tmp/event-retry-postgres.*) rm -rf "$(cat "$pointer")" && rm -f "$pointer" ;;
    esac
  fi
}
