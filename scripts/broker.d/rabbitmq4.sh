# RabbitMQ 4.0 beside Debian 12's 3.10: Debian 13's rabbitmq-server package (4.0 on Erlang/OTP 27), whose
# Erlang needs a newer C library than Debian 12's, so it runs in a Debian 13 root. The root is made once
# with debootstrap from the machine's own Debian mirror and kept under $CACHE/rabbitmq4-root (a later
# start, or another clone, skips both downloads); building it and running the node need root (chroot).
#
# The root shares the machine's network: the node listens on 127.0.0.1:<port> ($STATE/rabbitmq4/port),
# with an Erlang distribution port and an epmd port of its own, so it never meets the 3.10 node or its
# epmd. Its data, logs and pid file live inside the root, in a folder of this clone's own (clones share
# the root, never a node); our own records (ports, the server's pid) in $STATE/rabbitmq4/, beside
# `rabbitmqctl`, a wrapper that runs the root's own rabbitmqctl (the host's 3.10 tool cannot talk to a 4.0
# node; the wrapper needs root too): env.sh names it RETRY_TEST_AMQP4_CTL and the node
# RETRY_TEST_AMQP4_NODE, for the conformance fixture's view. Only /proc is mounted in the root, while one
# of its nodes runs (debootstrap made its device files).
#
# With --tls the node also serves AMQP over TLS on 127.0.0.1:<tls-port> ($STATE/rabbitmq4/tls-port), set up
# as rabbitmq.sh sets up the 3.10 node's (the same certificates, user and login mechanisms).

# shellcheck source=rabbitmq.sh
source "$(dirname "${BASH_SOURCE[0]}")/rabbitmq.sh"

# The marker of a root whose build finished (an interrupted build is started over).
RABBITMQ4_READY=.event-retry-ready

# rabbitmq4_key — what tells this clone's node from another clone's: a digest of its state folder.
rabbitmq4_key() { printf '%s' "$STATE" | md5sum | cut -c1-8; }

# rabbitmq4_node — this clone's node name.
rabbitmq4_node() { printf 'eventretry4-%s@localhost' "$(rabbitmq4_key)"; }

# rabbitmq4_data — the node's data, logs and pid file, as a path inside the root.
rabbitmq4_data() { printf '/var/lib/event-retry-rabbitmq4/%s' "$(rabbitmq4_key)"; }

# rabbitmq4_root — the Debian 13 root (built by rabbitmq4_install).
rabbitmq4_root() { printf '%s' "$CACHE/rabbitmq4-root"; }

# rabbitmq4_locked CMD... — runs CMD holding the root's lock (building it, mounting and unmounting /proc
# there), so that two clones never do either at once.
rabbitmq4_locked() {
  mkdir -p "$CACHE"
  ( flock 9 && "$@" ) 9> "$CACHE/rabbitmq4-root.lock"
}

# rabbitmq4_mirror — the machine's own Debian mirror over HTTP(S) (its deb822 sources, or the one-line
# form), Debian's own when it names none.
rabbitmq4_mirror() {
  local m
  m=$(sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | tr ' ' '\n' |
    grep -E '^https?://' | grep -v -- '-security' | head -n 1 || true)
  [ -n "$m" ] || m=$(awk '$1 == "deb" && $2 ~ /^https?:\/\// && $2 !~ /security/ {print $2; exit}' \
    /etc/apt/sources.list 2>/dev/null || true)
  printf '%s' "${m:-http://deb.debian.org/debian}"
}

# rabbitmq4_in_root CMD... — runs CMD inside the root, as rabbitmq's tools expect to be run.
rabbitmq4_in_root() {
  /usr/sbin/chroot "$(rabbitmq4_root)" /usr/bin/env PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/var/lib/rabbitmq LANG=C.UTF-8 "$@"
}

# rabbitmq4_ctl ARGS... — the root's rabbitmqctl against our node, through the node's epmd port.
rabbitmq4_ctl() {
  rabbitmq4_in_root ERL_EPMD_PORT="$(cat "$STATE/rabbitmq4/epmd-port")" rabbitmqctl -q -n "$(rabbitmq4_node)" "$@"
}

# rabbitmq4_in_root_pids [EPMD_PORT] — the processes running in the root; with EPMD_PORT, only those
# started with it (our node, its epmd and a CLI of ours, not another clone's).
rabbitmq4_in_root_pids() {
  local r p
  r=$(rabbitmq4_root)
  [ -d "$r" ] || return 0
  r=$(readlink -f "$r")
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$r" ] || continue
    if [ -n "${1:-}" ] && ! tr '\0' '\n' < "$p/environ" 2>/dev/null | grep -qx "ERL_EPMD_PORT=$1"; then
      continue
    fi
    printf '%s\n' "${p#/proc/}"
  done
  return 0
}

# rabbitmq4_mount — /proc in the root (Erlang reads it), unless already there.
rabbitmq4_mount() {
  local r; r=$(rabbitmq4_root)
  mountpoint -q "$r/proc" || mount -t proc proc "$r/proc"
}

# rabbitmq4_unmount — every mount under the root (also one an interrupted debootstrap left), once nothing
# runs there any more.
rabbitmq4_unmount() {
  local r m; r=$(readlink -f "$(rabbitmq4_root)")
  [ -z "$(rabbitmq4_in_root_pids)" ] || return 0
  # findmnt fails when nothing is mounted there.
  { findmnt -R -n -l -o TARGET "$r" 2>/dev/null || true; } | sort -r | while read -r m; do
    [ "$m" = "$r" ] || umount "$m" 2>/dev/null || umount -l "$m"
  done
}

# rabbitmq4_build — makes the root: Debian 13 (minbase) and its rabbitmq-server, whose own start of a
# system broker is refused while it installs (a policy-rc.d in the root). Run under the root's lock.
rabbitmq4_build() {
  local r d mirror
  r=$(rabbitmq4_root); d=$(dir rabbitmq4)
  [ -f "$r/$RABBITMQ4_READY" ] && return 0
  apt_install debootstrap
  mirror=$(rabbitmq4_mirror)
  if [ -d "$r" ]; then
    log "rabbitmq4: removing a root whose build did not finish ($r)"
    rabbitmq4_unmount
    [ -z "$(findmnt -R -n -l -o TARGET "$r" 2>/dev/null | grep -vx "$(readlink -f "$r")")" ] \
      || die "rabbitmq4: $r still has mounts; unmount them first"
    rm -rf --one-file-system "$r"
  fi
  mkdir -p "$(dirname "$r")"
  log "rabbitmq4: building a Debian 13 root in $r from $mirror (once; about 300 MB)"
  bounded 900 debootstrap --variant=minbase trixie "$r" "$mirror" > "$d/debootstrap.log" 2>&1 \
    || { rabbitmq4_unmount; tail_log rabbitmq4 "$d/debootstrap.log"; die "rabbitmq4: debootstrap failed"; }
  printf '#!/bin/sh\nexit 101\n' > "$r/usr/sbin/policy-rc.d" && chmod 755 "$r/usr/sbin/policy-rc.d"
  if [ -f /etc/resolv.conf ]; then cp /etc/resolv.conf "$r/etc/resolv.conf"; fi
  rabbitmq4_mount
  if ! bounded 900 rabbitmq4_in_root sh -c \
      'apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends rabbitmq-server' \
      > "$d/install.log" 2>&1; then
    rabbitmq4_unmount
    tail_log rabbitmq4 "$d/install.log"
    die "rabbitmq4: installing rabbitmq-server in the root failed"
  fi
  rabbitmq4_unmount
  touch "$r/$RABBITMQ4_READY"
  log "rabbitmq4: root ready ($(rabbitmq4_in_root dpkg-query -W -f='rabbitmq-server ${Version}' rabbitmq-server))"
}

# rabbitmq4_install — the root, built once (as root: debootstrap and chroot need it).
rabbitmq4_install() {
  [ "$(id -u)" -eq 0 ] || die "rabbitmq4: it runs in a Debian 13 root (debootstrap, chroot), which needs root"
  [ -f "$(rabbitmq4_root)/$RABBITMQ4_READY" ] && return 0
  rabbitmq4_locked rabbitmq4_build || exit 1
}

# rabbitmq4_server_pid — the node's pid (the root shares the machine's process ids), from our copy or
# from the server's own pid file, when that process runs in the root.
rabbitmq4_server_pid() {
  local f r
  r=$(readlink -f "$(rabbitmq4_root)")
  for f in "$STATE/rabbitmq4/server.pid" "$(rabbitmq4_root)$(rabbitmq4_data)/pid"; do
    if alive "$f" && [ "$(readlink "/proc/$(cat "$f")/root" 2>/dev/null)" = "$r" ]; then
      cat "$f"; return 0
    fi
  done
  return 1
}

# rabbitmq4_pid — the server's pid, for `scripts/brokers pid rabbitmq4` (fault runs signal it).
rabbitmq4_pid() { rabbitmq4_server_pid || die "rabbitmq4: not running"; }

# rabbitmq4_ctl_wrapper — writes $STATE/rabbitmq4/rabbitmqctl: the root's rabbitmqctl for this node's
# epmd port, for the tests (which pass -n NODE themselves).
rabbitmq4_ctl_wrapper() {
  local d="$STATE/rabbitmq4"
  cat > "$d/rabbitmqctl" <<EOF
#!/bin/sh
# The RabbitMQ 4 node's own rabbitmqctl, run in its root (written by scripts/broker.d/rabbitmq4.sh; root
# only, as chroot is).
exec /usr/sbin/chroot '$(rabbitmq4_root)' /usr/bin/env PATH=/usr/sbin:/usr/bin:/sbin:/bin \\
  HOME=/var/lib/rabbitmq LANG=C.UTF-8 ERL_EPMD_PORT=$(cat "$d/epmd-port") rabbitmqctl "\$@"
EOF
  chmod 755 "$d/rabbitmqctl"
}

# rabbitmq4_tls_user — makes user event-retry anew with the password of tls.sh and every permission on
# vhost /. RabbitMQ 4.0's rabbitmqctl waits for ever on a password given through stdin, so the password
# goes in hashed as RabbitMQ hashes it (SHA-256 over a 4-byte salt and the password, the salt first), never
# in the clear on a command line.
rabbitmq4_tls_user() {
  local hash
  hash=$(python3 -c '
import base64, hashlib, os, sys
salt = os.urandom(4)
password = open(sys.argv[1], "rb").read().strip()
print(base64.b64encode(salt + hashlib.sha256(salt + password).digest()).decode())' "$TLS_DIR/amqp.password") || return 1
  if rabbitmq4_ctl list_users | awk '{print $1}' | grep -qx "$TLS_USER"; then
    rabbitmq4_ctl delete_user "$TLS_USER" >/dev/null || return 1
  fi
  rabbitmq4_ctl add_user "$TLS_USER" "$hash" --pre-hashed-password >/dev/null \
    && rabbitmq4_ctl set_permissions -p / "$TLS_USER" '.*' '.*' '.*' >/dev/null
}

# rabbitmq4_serves PORT — true when our node says it is a 4.x node listening for AMQP on PORT (its own
# status, read through the node, not the tool's version).
rabbitmq4_serves() {
  rabbitmq4_ctl status --formatter json 2>/dev/null | python3 -c '
import json, sys
s = json.load(sys.stdin)
port = int(sys.argv[1])
ok = str(s.get("rabbitmq_version", "")).startswith("4.") and any(
    l.get("port") == port and l.get("protocol") == "amqp" for l in s.get("listeners", []))
print(s.get("rabbitmq_version", "?"))
sys.exit(0 if ok else 1)' "$1"
}

# rabbitmq4_start — starts the node on loopback with fresh data (kept by a restart) and waits until it
# accepts connections.
rabbitmq4_start() {
  local d r data dir_in port dist epmd version tls="" tls_env=()
  d=$(dir rabbitmq4); r=$(rabbitmq4_root)
  [ "$(id -u)" -eq 0 ] || die "rabbitmq4: it runs in a Debian 13 root (chroot), which needs root"
  [ -f "$r/$RABBITMQ4_READY" ] || die "rabbitmq4: no root at $r (scripts/brokers start builds it)"
  rabbitmq4_server_pid >/dev/null && rabbitmq4_stop   # a half-started node of ours holds the node name
  port=$(pick_port rabbitmq4 $(recorded_port "$d/port") 5682 5683 35682)
  dist=$(pick_port rabbitmq4-dist $(recorded_port "$d/dist-port") 25682 45682 55682)
  epmd=$(pick_port rabbitmq4-epmd $(recorded_port "$d/epmd-port") 4370 4371 14370)
  if tls_wanted; then
    tls_material
    tls=$(pick_port rabbitmq4 $(recorded_port "$d/tls-port") 5681 15681 25681)
  fi
  tls_mark "$d"
  printf '%s' "$port" > "$d/port"
  printf '%s' "$dist" > "$d/dist-port"
  printf '%s' "$epmd" > "$d/epmd-port"
  rabbitmq4_ctl_wrapper
  rabbitmq4_locked rabbitmq4_mount || die "rabbitmq4: cannot mount /proc in $r"
  dir_in=$(rabbitmq4_data)
  data=$r$dir_in
  keep_data || rm -rf "$data"
  rm -rf "$data/pid" "$data/rabbitmq.log" "$d/server.pid" "$data/rabbitmq.conf" "$data/enabled_plugins" "$data/tls"
  mkdir -p "$data/mnesia"
  touch "$data/rabbitmq.log"
  if [ -n "$tls" ]; then
    printf '%s' "$tls" > "$d/tls-port"
    rabbitmq_tls_files "$data" "$tls" "$dir_in"
    tls_env=(RABBITMQ_CONFIG_FILE="$dir_in/rabbitmq" RABBITMQ_ENABLED_PLUGINS_FILE="$dir_in/enabled_plugins")
  fi
  rabbitmq4_in_root chown -R rabbitmq:rabbitmq "$dir_in" \
    || { rabbitmq4_stop; die "rabbitmq4: cannot give $data to user rabbitmq"; }
  ln -sfn "$data/rabbitmq.log" "$d/rabbitmq4.log"
  log "rabbitmq4: starting node $(rabbitmq4_node) on 127.0.0.1:$port${tls:+ (TLS 127.0.0.1:$tls)} (root $r)"
  rabbitmq4_in_root RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT="$port" RABBITMQ_DIST_PORT="$dist" \
    ERL_EPMD_PORT="$epmd" RABBITMQ_NODENAME="$(rabbitmq4_node)" RABBITMQ_MNESIA_BASE="$dir_in/mnesia" \
    RABBITMQ_LOG_BASE="$dir_in" RABBITMQ_LOGS="$dir_in/rabbitmq.log" RABBITMQ_PID_FILE="$dir_in/pid" \
    ${tls_env[@]+"${tls_env[@]}"} rabbitmq-server -detached > "$d/detach.out" 2>&1 \
    || { tail_log rabbitmq4 "$d/detach.out"; rabbitmq4_stop; die "rabbitmq4: could not start"; }
  if ! (wait_ready rabbitmq4 90 "" "$data/rabbitmq.log" rabbitmq4_ctl await_startup --timeout 15 \
        && wait_ready rabbitmq4 30 "$data/pid" "$data/rabbitmq.log" rabbitmq4_ctl status); then
    rabbitmq4_stop; exit 1
  fi
  # RabbitMQ deletes its own pid file when it stops; keep our copy to wait for the process itself.
  cp "$data/pid" "$d/server.pid"
  version=$(rabbitmq4_serves "$port") \
    || { tail_log rabbitmq4 "$data/rabbitmq.log"; rabbitmq4_stop; die "rabbitmq4: the node (version '$version') does not serve AMQP on $port as a 4.x node"; }
  if [ -n "$tls" ]; then
    bounded 60 rabbitmq4_tls_user || { rabbitmq4_stop; die "rabbitmq4: could not set up user $TLS_USER"; }
    rabbitmq_tls_logins rabbitmq4 rabbitmq4_stop "$d/server.pid" "$data/rabbitmq.log" "$tls"
  fi
  log "rabbitmq4: RabbitMQ $version up at amqp://127.0.0.1:$port${tls:+ and amqps://127.0.0.1:$tls} (pid $(cat "$d/server.pid"))"
}

# rabbitmq4_tls_status — prints the RETRY_TEST_AMQP4_TLS URL when our node runs with its TLS listener and
# a TLS handshake with it verifies; else 1, silent.
rabbitmq4_tls_status() {
  local d="$STATE/rabbitmq4"
  tls_on rabbitmq4 && rabbitmq4_server_pid >/dev/null && [ -s "$d/tls-port" ] || return 1
  rabbitmq_tls_url "$(cat "$d/tls-port")"
}

# rabbitmq4_status — prints the AMQP URL and succeeds if our node is up.
rabbitmq4_status() {
  local d="$STATE/rabbitmq4"
  rabbitmq4_server_pid >/dev/null && [ -s "$d/port" ] && port_in_use "$(cat "$d/port")" || return 1
  printf 'amqp://guest:guest@127.0.0.1:%s/%%2f' "$(cat "$d/port")"
}

# rabbitmq4_stop — stops our node, then its epmd and any CLI of ours left running in the root (another
# clone's node stays), unmounts /proc there once nothing runs in it; also a node that never finished
# starting.
rabbitmq4_stop() {
  local d="$STATE/rabbitmq4" pid left epmd=""
  [ -s "$d/epmd-port" ] && epmd=$(cat "$d/epmd-port")
  if pid=$(rabbitmq4_server_pid); then
    [ -n "$epmd" ] && bounded 60 rabbitmq4_ctl stop >/dev/null 2>&1 || true
    echo "$pid" > "$d/server.pid"
    stop_pid rabbitmq4 "$d/server.pid" 30
  fi
  rm -f "$d/server.pid"
  if [ -n "$epmd" ]; then
    left=$(rabbitmq4_in_root_pids "$epmd")
    if [ -n "$left" ]; then
      # shellcheck disable=SC2086 # one pid per word
      kill $left 2>/dev/null || true
      sleep 1
      left=$(rabbitmq4_in_root_pids "$epmd")
      # shellcheck disable=SC2086
      [ -z "$left" ] || kill -9 $left 2>/dev/null || true
    fi
  fi
  if [ -d "$(rabbitmq4_root)" ]; then rabbitmq4_locked rabbitmq4_unmount; fi
  # Unless keeping data (a restart), the node's data goes too.
  keep_data || rm -rf "$(rabbitmq4_root)$(rabbitmq4_data)"
}
