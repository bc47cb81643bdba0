# Apache Pulsar 4.0 standalone for scripts/brokers: one JVM running the broker, an in-process BookKeeper
# bookie and RocksDB metadata (no ZooKeeper), from Maven Central jars (scripts/broker.d/pulsar/pom.xml).
# Sourced by scripts/brokers after common.sh; defines pulsar_install, pulsar_start, pulsar_status and
# pulsar_stop. State, config and log live in $STATE/pulsar/; the data folder is wiped at every start but
# a restart.
#
# With --tls the broker also serves pulsar+ssl on <tls-port> and https on <web-tls-port> ($STATE/pulsar/
# tls-port, web-tls-port; the PEM files of tls.sh), and authentication is on: a token (HS256, checked
# against pulsar-secret.key) or a client certificate signed by the CA is verified when presented and
# refused when bad, while a client that presents nothing gets the role "anonymous" (authorization stays
# off), so the plaintext listeners serve the rest of the suite as before. On the binary protocol a client
# always names its method, so a bad token is refused. Over HTTP, Pulsar checks a token as a token only
# when the request says so (header X-Pulsar-Auth-Method-Name: token, as Pulsar's own admin client sends
# it); without that header a token no provider accepts falls back to the anonymous role (200, not 401).

# The Maven project, config template and log4j2 config next to this file.
pulsar_home() { printf '%s' "$ROOT/scripts/broker.d/pulsar"; }

# pulsar_install — makes sure curl (for the readiness and admin calls) and the jars are there. Idempotent:
# a second call only reads the cached classpath.
pulsar_install() {
  apt_install curl
  maven_classpath pulsar "$(pulsar_home)" >/dev/null
}

# pulsar_admin_url WEB_PORT PATH — the admin REST URL of PATH (e.g. /admin/v2/brokers/health).
pulsar_admin_url() { printf 'http://127.0.0.1:%s%s' "$1" "$2"; }

# pulsar_healthy WEB_PORT — true when the broker's deep health check (it writes and reads a message through
# the bookie) answers "ok".
pulsar_healthy() {
  [ "$(curl -sf --max-time 15 "$(pulsar_admin_url "$1" /admin/v2/brokers/health)" 2>/dev/null)" = ok ]
}

# pulsar_status — prints pulsar://127.0.0.1:PORT when our JVM is alive and healthy; else prints nothing and
# fails.
pulsar_status() {
  local d="$STATE/pulsar"
  cmdline_has "$d/pid" PulsarStandaloneStarter && [ -s "$d/port" ] && [ -s "$d/web-port" ] || return 1
  pulsar_healthy "$(cat "$d/web-port")" || return 1
  printf 'pulsar://127.0.0.1:%s\n' "$(cat "$d/port")"
}

# pulsar_strays DIR — pids of standalone JVMs started with DIR's config but no longer in the pid file (e.g.
# after the pid file was deleted). Matches only our own config path, never another agent's broker.
pulsar_strays() {
  local p
  for p in $(pgrep -f -- "PulsarStandaloneStarter --config $1/standalone.conf" || true); do
    [ -s "$1/pid" ] && [ "$p" = "$(cat "$1/pid")" ] && continue
    printf '%s\n' "$p"
  done
}

# pulsar_stop — stops our standalone by its pid (SIGTERM; SIGKILL after 60 s), plus any stray JVM of this
# state folder, so no Pulsar of ours is left behind. Leaves other processes alone.
pulsar_stop() {
  local d; d=$(dir pulsar)
  if [ -s "$d/pid" ] && ! cmdline_has "$d/pid" PulsarStandaloneStarter; then rm -f "$d/pid"; fi
  stop_pid pulsar "$d/pid" 60
  local p
  for p in $(pulsar_strays "$d"); do
    log "pulsar: stopping stray standalone pid $p of $d"
    echo "$p" > "$d/stray.pid"
    stop_pid pulsar "$d/stray.pid" 60
  done
}

# pulsar_wipe DIR — removes the data and temp files of an earlier run. A leftover data/standalone/zookeeper
# would switch the standalone to ZooKeeper mode, and stale bookie cookies can refuse a new port.
pulsar_wipe() {
  keep_data || rm -rf "$1/data"
  rm -rf "$1/tmp" "$1/standalone.conf" "$1/java.args"
  mkdir -p "$1/data" "$1/tmp"
}

# pulsar_write_config DIR BROKER_PORT WEB_PORT BOOKIE_PORT [TLS_PORT WEB_TLS_PORT] — fills the template
# into DIR/standalone.conf; with the TLS ports, appends the secured listeners and authentication
# (pulsar_tls_config).
pulsar_write_config() {
  sed -e "s|@BROKER_PORT@|$2|g" -e "s|@WEB_PORT@|$3|g" -e "s|@BOOKIE_PORT@|$4|g" \
    "$(pulsar_home)/standalone.conf.in" > "$1/standalone.conf"
  [ -z "${5:-}" ] || pulsar_tls_config "$5" "$6" >> "$1/standalone.conf"
}

# pulsar_tls_config TLS_PORT WEB_TLS_PORT — the standalone.conf lines of the secured listeners.
pulsar_tls_config() {
  cat <<EOF

### Secured listeners (scripts/brokers start --tls), next to the plaintext ones above.
brokerServicePortTls=$1
webServicePortTls=$2
tlsCertificateFilePath=$TLS_DIR/server.pem
tlsKeyFilePath=$TLS_DIR/server.key
tlsTrustCertsFilePath=$TLS_DIR/ca.pem
# A client certificate is optional; one that is sent must be signed by the CA.
tlsRequireTrustedClientCertOnConnect=false
tlsAllowInsecureConnection=false

### Authentication: a token or a client certificate is verified when presented and a bad one refused (over
### HTTP, a token only with header X-Pulsar-Auth-Method-Name: token); a client that presents nothing gets
### the anonymous role, and without authorization every role may do everything, so the plaintext
### listeners work as without --tls.
authenticationEnabled=true
authenticationProviders=org.apache.pulsar.broker.authentication.AuthenticationProviderToken,org.apache.pulsar.broker.authentication.AuthenticationProviderTls
# The HS256 key as raw bytes (the form \`pulsar tokens create-secret-key\` writes).
tokenSecretKey=file://$TLS_DIR/pulsar-secret.key
anonymousUserRole=anonymous
authorizationEnabled=false
superUserRoles=$TLS_USER
# The standalone's own clients (namespace setup, system topics) use the plaintext listeners, with the token.
brokerClientTlsEnabled=false
brokerClientAuthenticationPlugin=org.apache.pulsar.client.impl.auth.AuthenticationToken
brokerClientAuthenticationParameters=file://$TLS_DIR/pulsar.token
EOF
}

# pulsar_tls_code WEB_TLS_PORT PATH TOKEN_FILE — the HTTP status of a GET of PATH over https, verifying the
# server against our CA and sending the token of TOKEN_FILE (through curl's stdin, not its command line).
# The X-Pulsar-Auth-Method-Name header makes the broker check the token as a token: without it, a token
# that no provider accepts falls back to the anonymous role.
pulsar_tls_code() {
  printf 'header = "Authorization: Bearer %s"\n' "$(cat "$3")" \
    | curl -s -K - -o /dev/null -w '%{http_code}' --max-time 15 --cacert "$TLS_DIR/ca.pem" \
        -H 'X-Pulsar-Auth-Method-Name: token' "https://127.0.0.1:$1$2"
}

# pulsar_tls_ready TLS_PORT WEB_TLS_PORT — true when the admin API answers 200 over https with our token
# and 401 with the wrong one, and the broker's TLS port completes a handshake that verifies against our CA.
pulsar_tls_ready() {
  local ns=/admin/v2/namespaces/public/default
  [ "$(pulsar_tls_code "$2" "$ns" "$TLS_DIR/pulsar.token")" = 200 ] || return 1
  [ "$(pulsar_tls_code "$2" "$ns" "$TLS_DIR/pulsar-wrong.token")" = 401 ] || return 1
  timeout 10 openssl s_client -connect "127.0.0.1:$1" -CAfile "$TLS_DIR/ca.pem" -verify_return_error \
    -verify_ip 127.0.0.1 < /dev/null >/dev/null 2>&1
}

# pulsar_tls_status — prints the RETRY_TEST_PULSAR_TLS URL when our standalone runs with its secured
# listeners and its health check answers over https with our token; else prints nothing and fails.
pulsar_tls_status() {
  local d="$STATE/pulsar"
  tls_on pulsar && cmdline_has "$d/pid" PulsarStandaloneStarter && [ -s "$d/tls-port" ] && [ -s "$d/web-tls-port" ] \
    || return 1
  [ "$(pulsar_tls_code "$(cat "$d/web-tls-port")" /admin/v2/brokers/health "$TLS_DIR/pulsar.token")" = 200 ] || return 1
  printf 'pulsar+ssl://127.0.0.1:%s?tls_ca=%s&token_file=%s\n' \
    "$(cat "$d/tls-port")" "$TLS_DIR/ca.pem" "$TLS_DIR/pulsar.token"
}

# pulsar_jvm_args DIR CLASSPATH — writes DIR/java.args, a java @argfile holding the classpath and JVM flags
# (keeps the ~25 kB classpath out of `ps`). The flags follow upstream bin/pulsar for Java 17: the
# --add-opens for Netty and Pulsar's stats, and the BookKeeper metadata drivers backed by Pulsar's store.
pulsar_jvm_args() {
  cat > "$1/java.args" <<EOF
-cp "$2"
-Xms256m
-Xmx768m
-XX:MaxDirectMemorySize=512m
-XX:+ExitOnOutOfMemoryError
--add-opens=java.base/java.io=ALL-UNNAMED
--add-opens=java.base/java.util.zip=ALL-UNNAMED
--add-opens=java.base/java.nio=ALL-UNNAMED
--add-opens=java.base/jdk.internal.misc=ALL-UNNAMED
--add-opens=java.base/sun.net=ALL-UNNAMED
--add-opens=java.management/sun.management=ALL-UNNAMED
-Dio.netty.tryReflectionSetAccessible=true
-Dio.netty.leakDetectionLevel=disabled
-Djava.net.preferIPv4Stack=true
-Dbookkeeper.metadata.bookie.drivers=org.apache.pulsar.metadata.bookkeeper.PulsarMetadataBookieDriver
-Dbookkeeper.metadata.client.drivers=org.apache.pulsar.metadata.bookkeeper.PulsarMetadataClientDriver
-Dlog4j.configurationFile="$(pulsar_home)/log4j2.xml"
-Djava.io.tmpdir="$1/tmp"
EOF
}

# pulsar_launch DIR BOOKIE_PORT — starts the standalone detached, in DIR so its relative default paths land
# there, without PULSAR_STANDALONE_USE_ZOOKEEPER (it would switch the standalone to ZooKeeper mode).
pulsar_launch() {
  local d=$1 bk=$2 java; java=$(java_bin)
  launch_detached pulsar "$d" "$d/pulsar.log" \
    env -u PULSAR_STANDALONE_USE_ZOOKEEPER "$java" "@$d/java.args" org.apache.pulsar.PulsarStandaloneStarter \
    --config "$d/standalone.conf" --no-functions-worker --no-stream-storage $(keep_data || echo --wipe-data) \
    --metadata-dir "$d/data/metadata" --bookkeeper-dir "$d/data/bookkeeper" --bookkeeper-port "$bk" \
    --advertised-address 127.0.0.1
}

# pulsar_ensure_namespace WEB_PORT — makes sure public/default exists, so clients can use
# persistent://public/default/<topic>. The standalone creates it just after its web service answers, so
# wait for it a little, then create the tenant and namespace through the admin API (409 = already there).
pulsar_ensure_namespace() {
  local web=$1 ns
  ns=$(pulsar_admin_url "$web" /admin/v2/namespaces/public/default)
  for _ in $(seq 20); do curl -sf --max-time 10 -o /dev/null "$ns" && return 0; sleep 0.5; done
  log "pulsar: creating tenant public and namespace public/default"
  curl -s --max-time 10 -o /dev/null -X PUT -H 'Content-Type: application/json' \
    -d '{"adminRoles":[],"allowedClusters":["standalone"]}' "$(pulsar_admin_url "$web" /admin/v2/tenants/public)"
  curl -s --max-time 10 -o /dev/null -X PUT "$ns"
  curl -sf --max-time 10 -o /dev/null "$ns" || die "pulsar: namespace public/default could not be created"
}

# pulsar_start — starts a fresh standalone (wiped data, free ports written to DIR/port and DIR/web-port),
# waits until it really serves (health check through the bookie), then makes sure public/default exists.
# With TLS (tls_wanted), the secured listeners too (DIR/tls-port, DIR/web-tls-port), checked with
# pulsar_tls_ready.
pulsar_start() {
  local d; d=$(dir pulsar)
  local cp; cp=$(maven_classpath pulsar "$(pulsar_home)")
  pulsar_stop   # a half-alive JVM of ours (alive, not healthy) would hold the ports and the data folder
  pulsar_wipe "$d"
  local port web bk
  # On a restart the bookie's stored cookie names its port: keep the ports the data was written with.
  port=$(pick_port pulsar $(recorded_port "$d/port") 6650 16650 26650)
  web=$(pick_port pulsar $(recorded_port "$d/web-port") 8080 18080 28080)
  bk=$(pick_port pulsar $(recorded_port "$d/bookie-port") 3181 13181 23181)
  local tls="" webtls=""
  if tls_wanted; then
    tls_material
    tls=$(pick_port pulsar $(recorded_port "$d/tls-port") 6651 16651 26651)
    webtls=$(pick_port pulsar $(recorded_port "$d/web-tls-port") 8443 18443 28443)
  fi
  tls_mark "$d"
  printf '%s\n' "$port" > "$d/port"
  printf '%s\n' "$web" > "$d/web-port"
  printf '%s\n' "$bk" > "$d/bookie-port"
  if [ -n "$tls" ]; then
    printf '%s\n' "$tls" > "$d/tls-port"
    printf '%s\n' "$webtls" > "$d/web-tls-port"
  fi
  pulsar_write_config "$d" "$port" "$web" "$bk" "$tls" "$webtls"
  pulsar_jvm_args "$d" "$cp"
  log "pulsar: starting (broker $port, web $web, bookie $bk${tls:+, TLS broker $tls and web $webtls}; log $d/pulsar.log)"
  pulsar_launch "$d" "$bk"
  serve_or_stop pulsar pulsar_stop 240 pulsar_healthy "$web"
  pulsar_ensure_namespace "$web"
  # Started on the data of a standalone that was killed (SIGKILL), the bookie's registration flaps: the
  # killed process's entry and the new one keep invalidating each other, thousands of times a second,
  # and every ledger created while the bookie is missing fails with "Not enough non-faulty bookies
  # available" — for as long as the process runs (about 50 minutes was seen). A clean restart on the same
  # data registers the bookie once and for all.
  local attempt
  for attempt in 1 2 3; do
    keep_data && pulsar_flapping "$d" || break
    [ "$attempt" = 3 ] && { pulsar_stop; die "pulsar: the bookie's registration keeps flapping after restarts"; }
    log "pulsar: the bookie's registration flaps (a start on a killed standalone's data); restarting cleanly"
    pulsar_stop
    RETRY_BROKERS_KEEP_DATA=1 pulsar_launch "$d" "$bk"
    serve_or_stop pulsar pulsar_stop 240 pulsar_healthy "$web"
  done
  if [ -n "$tls" ]; then
    serve_or_stop pulsar pulsar_stop 60 pulsar_tls_ready "$tls" "$webtls"
  fi
  log "pulsar: up at pulsar://127.0.0.1:$port (admin http://127.0.0.1:$web)${tls:+ and pulsar+ssl://127.0.0.1:$tls (admin https://127.0.0.1:$webtls)}"
}

# pulsar_flapping DIR — true when, over two seconds, the log shows the bookie's registration lock being
# invalidated (see pulsar_start).
pulsar_flapping() {
  local before; before=$(grep -c "was invalidated" "$1/pulsar.log" 2>/dev/null || true)
  sleep 2
  [ "$(grep -c "was invalidated" "$1/pulsar.log" 2>/dev/null || true)" -gt "${before:-0}" ]
}
