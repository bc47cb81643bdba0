# The secured listeners of `scripts/brokers start --tls`: the switch the broker modules read, and the
# throwaway key material they serve with. Sourced by common.sh.
#
# Everything lives in $STATE/tls/, made with openssl alone the first time it is needed and reused after
# (while the certificates verify, match their keys and are not about to expire):
#   ca.pem, ca.key              a throwaway CA
#   server.pem, server.key      CN=localhost, SAN DNS:localhost and IP:127.0.0.1, server and client auth
#   client.pem, client.key      CN=event-retry, client auth (RabbitMQ's EXTERNAL login, Pulsar's TLS auth)
#   other-ca.pem, other-ca.key  an unrelated CA: trusting it instead of ca.pem must fail verification
#   kafka.password              the SASL password of user event-retry on Kafka (PLAIN and SCRAM)
#   amqp.password               the password of user event-retry on RabbitMQ
#   pulsar-secret.key           the HS256 key (32 raw bytes) Pulsar verifies tokens with
#   pulsar.token                a JWT for subject event-retry, signed with that key
#   pulsar-wrong.token          the same claims signed with another (discarded) key: Pulsar must refuse it
# Keys are unencrypted PKCS#8 PEM. Passwords and tokens are written without a trailing line break.
# Private keys and secrets are mode 0600.

TLS_DIR=$STATE/tls
# The one user every secured listener knows (SASL user, AMQP user, certificate CN, token subject).
TLS_USER=event-retry
# Certificates are made for ten years and made again when they expire within 30 days.
TLS_DAYS=3650
TLS_MIN_LEFT=$((30 * 24 * 3600))

# tls_wanted — true when the broker being started is to serve its secured listener too: scripts/brokers
# sets RETRY_BROKERS_TLS=1 for `start --tls`, and for the `restart` of a broker that had it.
tls_wanted() { [ "${RETRY_BROKERS_TLS:-}" = 1 ]; }

# tls_on NAME — true when NAME was last started with its secured listener (the marker $STATE/NAME/tls,
# which its start writes or removes).
tls_on() { [ -f "$STATE/$1/tls" ]; }

# tls_mark DIR — records in DIR (a broker's state folder) whether it now starts with TLS, per tls_wanted;
# without TLS the recorded secured ports go too.
tls_mark() {
  if tls_wanted; then
    : > "$1/tls"
  else
    rm -f "$1/tls" "$1/tls-port" "$1/web-tls-port"
  fi
}

# tls_secret NAME — the content of the secret file $TLS_DIR/NAME (for a config file, never a command line).
tls_secret() { cat "$TLS_DIR/$1"; }

# tls_b64url — stdin as base64url without padding (the encoding of a JWT's parts).
tls_b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }

# tls_jwt HEX_KEY SUBJECT — an HS256 JWT {"sub":SUBJECT} signed with the key given in hex (the form
# `pulsar tokens create --secret-key` writes: header {"alg":"HS256"}, no expiry).
tls_jwt() {
  local header payload sig
  header=$(printf '{"alg":"HS256"}' | tls_b64url)
  payload=$(printf '{"sub":"%s"}' "$2" | tls_b64url)
  sig=$(printf '%s.%s' "$header" "$payload" \
    | openssl dgst -sha256 -mac HMAC -macopt "hexkey:$1" -binary | tls_b64url)
  printf '%s.%s.%s' "$header" "$payload" "$sig"
}

# tls_hex FILE — FILE's bytes in hex, on one line.
tls_hex() { od -An -tx1 -v "$1" | tr -d ' \n'; }

# tls_cert_ok NAME [CA] — true when NAME.pem matches NAME.key and, signed by CA (self-signed without
# one), verifies and stays valid for at least TLS_MIN_LEFT seconds.
tls_cert_ok() {
  local c="$TLS_DIR/$1.pem" k="$TLS_DIR/$1.key" ca="$TLS_DIR/${2:-$1}.pem"
  [ -s "$c" ] && [ -s "$k" ] && [ -s "$ca" ] || return 1
  openssl x509 -in "$c" -noout -checkend "$TLS_MIN_LEFT" >/dev/null 2>&1 || return 1
  openssl verify -CAfile "$ca" "$c" >/dev/null 2>&1 || return 1
  [ "$(openssl x509 -in "$c" -noout -pubkey 2>/dev/null)" = "$(openssl pkey -in "$k" -pubout 2>/dev/null)" ]
}

# tls_new_ca NAME CN — a self-signed CA certificate NAME.pem with its key NAME.key.
tls_new_ca() {
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$TLS_DIR/$1.key" 2>/dev/null &&
  openssl req -x509 -new -key "$TLS_DIR/$1.key" -subj "/CN=$2" -days "$TLS_DAYS" -sha256 \
    -addext 'basicConstraints=critical,CA:TRUE' -addext 'keyUsage=critical,keyCertSign,cRLSign' \
    -out "$TLS_DIR/$1.pem"
}

# tls_new_leaf NAME CN EXTENSIONS — a certificate NAME.pem (key NAME.key) for CN, signed by ca.pem, with
# the x509v3 EXTENSIONS (one per line) and the key identifiers.
tls_new_leaf() {
  local tmp rc=0; tmp=$(mktemp -d)
  printf '%s\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n' "$3" > "$tmp/ext"
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$TLS_DIR/$1.key" 2>/dev/null &&
  openssl req -new -key "$TLS_DIR/$1.key" -subj "/CN=$2" -out "$tmp/csr" &&
  openssl x509 -req -in "$tmp/csr" -CA "$TLS_DIR/ca.pem" -CAkey "$TLS_DIR/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days "$TLS_DAYS" -sha256 -extfile "$tmp/ext" \
    -out "$TLS_DIR/$1.pem" 2>/dev/null || rc=1
  rm -rf "$tmp"
  return $rc
}

# tls_new_secret NAME CMD... — writes CMD's output to $TLS_DIR/NAME unless that already holds something.
tls_new_secret() {
  local f="$TLS_DIR/$1"; shift
  [ -s "$f" ] || "$@" > "$f"
}

# tls_password — 16 random bytes in hex, without a line break.
tls_password() { printf '%s' "$(openssl rand -hex 16)"; }

# tls_material — makes (once) and checks the files listed at the top of this file; fails if openssl
# cannot. Passwords and keys are kept as long as they exist, so a broker restarted on its data (Kafka's
# SCRAM credentials, RabbitMQ's user) still finds the ones it was given. The folder is the owner's
# alone (0700) before anything is written to it.
tls_material() {
  local d=$TLS_DIR leaf="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment"
  mkdir -p "$d" || die "tls: cannot create $d"
  chmod 700 "$d"
  if ! tls_cert_ok ca; then
    log "tls: making a throwaway CA and certificates in $d"
    tls_new_ca ca "event-retry test CA" || die "tls: could not make the CA"
    rm -f "$d/server.pem" "$d/client.pem"
  fi
  tls_cert_ok server ca || tls_new_leaf server localhost "$leaf
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=DNS:localhost,IP:127.0.0.1" || die "tls: could not make the server certificate"
  tls_cert_ok client ca || tls_new_leaf client "$TLS_USER" "$leaf
extendedKeyUsage=clientAuth" || die "tls: could not make the client certificate"
  tls_cert_ok other-ca || tls_new_ca other-ca "event-retry unrelated CA" || die "tls: could not make the other CA"
  tls_new_secret kafka.password tls_password || die "tls: could not write kafka.password"
  tls_new_secret amqp.password tls_password || die "tls: could not write amqp.password"
  # Exactly 32 bytes (HS256 wants at least 256 bits); anything else is made again, and so its token.
  if [ "$(stat -c %s "$d/pulsar-secret.key" 2>/dev/null)" != 32 ]; then
    openssl rand 32 > "$d/pulsar-secret.key" || die "tls: could not write pulsar-secret.key"
  fi
  # The token follows from the key and the claims (rewritten only if it differs); the wrong one is
  # signed with a key that is thrown away.
  local token; token=$(tls_jwt "$(tls_hex "$d/pulsar-secret.key")" "$TLS_USER")
  [ "$(cat "$d/pulsar.token" 2>/dev/null)" = "$token" ] || printf '%s' "$token" > "$d/pulsar.token"
  tls_new_secret pulsar-wrong.token tls_jwt "$(openssl rand -hex 32)" "$TLS_USER" \
    || die "tls: could not write pulsar-wrong.token"
  # Certificates 0644, keys and secrets 0600 (inside a folder that is the owner's alone anyway).
  chmod 644 "$d"/{ca,server,client,other-ca}.pem
  chmod 600 "$d"/*.key "$d"/*.password "$d"/*.token
}
