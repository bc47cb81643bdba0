# Shared helpers for scripts/brokers and the per-broker modules in scripts/broker.d/<name>.sh.
#
# Every broker keeps its runtime state under $STATE/<name>/ (pid, port, log, data), binds to 127.0.0.1,
# and is stopped only through the pid it wrote. Downloads (apt packages, Maven artifacts) are cached
# outside the work tree: apt's cache and ~/.m2, plus resolved classpaths under $CACHE.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
STATE=${RETRY_BROKERS_STATE:-$ROOT/target/brokers}
CACHE=${RETRY_BROKERS_CACHE:-${XDG_CACHE_HOME:-${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}/.cache}/event-retry/brokers}
# Debian's broker and package tools live in the sbin folders, which a CI PATH may lack.
PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin

# The one feature set every build and test of the test command (and of scripts/stress) takes: cargo
# unifies features over the packages a command selects, so a command with another set (or another -p
# selection) rebuilds most dependencies — minutes in a cold run. The optional integrations are on for
# the whole workspace; each adapter already is (the fault harness depends on all four).
OPTIONAL_FEATURES=event-retry/tower,event-retry/backoff,event-retry/prometheus,event-retry/health,event-retry/opentelemetry,event-retry-outbox/opentelemetry
# shellcheck disable=SC2034 # used by the scripts that source this file
WORKSPACE_BUILD=(--workspace --features "$OPTIONAL_FEATURES")

log() { printf '[brokers] %s\n' "$*" >&2; }
die() { printf '[brokers] error: %s\n' "$*" >&2; exit 1; }

# dir NAME — the state folder of a broker (created).
dir() { mkdir -p "$STATE/$1" && printf '%s' "$STATE/$1"; }

# keep_data — true during `scripts/brokers restart`: a broker starts on the data it had (and, where the
# data remembers them, the ports it had), to test that nothing is lost across a broker restart.
keep_data() { [ "${RETRY_BROKERS_KEEP_DATA:-}" = 1 ]; }

# recorded_port FILE — the port recorded in FILE when keeping data (printed first among the candidates).
recorded_port() { if keep_data && [ -s "$1" ]; then cat "$1"; fi; }

# port_in_use PORT — true if something listens on 127.0.0.1:PORT.
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# PORT_RELEASE_WAIT — how long a restart waits for the port the broker had. A broker killed with SIGKILL
# holds its sockets until its last thread has exited (a JVM's main thread shows as a zombie well before
# that), and a restart that moved to another port would strand every client that knows the old one.
PORT_RELEASE_WAIT=${RETRY_BROKERS_PORT_RELEASE_WAIT:-60}

# pick_port NAME PREFERRED [ALTERNATIVES...] — prints the first free port; fails clearly when all are taken
# by something else. During a restart the first candidate (the recorded port) is waited for, not skipped.
# Use it as a plain assignment (`port=$(pick_port ...)`, not `local port=$(...)`) so that the failure
# stops the caller under `set -e`.
pick_port() {
  local name=$1; shift
  local p start=$SECONDS
  if keep_data && port_in_use "$1"; then
    log "$name: waiting up to ${PORT_RELEASE_WAIT} s for port $1 (the one it had) to be released"
    while port_in_use "$1" && (( SECONDS - start < PORT_RELEASE_WAIT )); do sleep 1; done
  fi
  for p in "$@"; do
    if ! port_in_use "$p"; then printf '%s' "$p"; return 0; fi
    log "$name: port $p is taken by another process; trying the next one"
  done
  die "$name: every candidate port ($*) is taken by another process"
}

# pid_running PID — true if PID is a live process (a zombie waiting to be reaped does not count: where
# nothing reaps orphans, a stopped broker lingers as one).
pid_running() {
  kill -0 "$1" 2>/dev/null || return 1
  local state; state=$(ps -o stat= -p "$1" 2>/dev/null)
  [ -n "$state" ] && [ "${state:0:1}" != Z ]
}

# alive PIDFILE — true if the pid in PIDFILE is a running process.
alive() { [ -s "$1" ] && pid_running "$(cat "$1")"; }

# running_named NAME — true if a live (non-zombie) process has exactly this command name.
running_named() { ps -C "$1" -o stat= 2>/dev/null | grep -qv '^Z'; }

# tail_log NAME FILE — prints where a log is and its last lines.
tail_log() {
  log "$1: log at $2; last lines:"
  tail -n 40 "$2" 2>/dev/null | sed 's/^/    /' >&2 || true
}

# bounded SECONDS CMD... — runs CMD (a program or a shell function) for at most SECONDS.
bounded() {
  local limit=$1; shift
  if type -P "$1" >/dev/null 2>&1; then
    timeout "$limit" "$@"
  else
    # A shell function: run it in a subshell that a watchdog kills when time runs out.
    ( "$@" ) & local pid=$!
    ( sleep "$limit"; kill -TERM "$pid" 2>/dev/null ) & local dog=$!
    local rc=0; wait "$pid" || rc=$?
    kill "$dog" 2>/dev/null; wait "$dog" 2>/dev/null || true
    return "$rc"
  fi
}

# wait_ready NAME TIMEOUT_SECONDS PIDFILE LOG CHECK... — waits until CHECK (a program or a shell function)
# succeeds; fails with the log tail if the process dies or the time runs out. Never hangs longer than
# TIMEOUT_SECONDS plus one check (each bounded to 20 s). PIDFILE may be empty when there is none yet; when
# given, it must already hold the pid.
wait_ready() {
  local name=$1 timeout=$2 pidfile=$3 logfile=$4; shift 4
  local start=$SECONDS
  while (( SECONDS - start < timeout )); do
    if bounded 20 "$@" >/dev/null 2>&1; then
      log "$name: ready after $((SECONDS - start)) s"
      return 0
    fi
    if [ -n "$pidfile" ] && ! alive "$pidfile"; then
      tail_log "$name" "$logfile"
      die "$name: the process exited before it was ready"
    fi
    sleep 1
  done
  tail_log "$name" "$logfile"
  die "$name: not ready after ${timeout} s"
}

# serve_or_stop NAME STOP_FN TIMEOUT CHECK... — waits (wait_ready, on $STATE/NAME/pid and NAME.log) until
# CHECK answers; if it never does, stops the half-started broker with STOP_FN and fails.
serve_or_stop() {
  local name=$1 stop_fn=$2 limit=$3; shift 3
  # In a subshell, so wait_ready's exit on a timeout still lets us stop what we started.
  if ! (wait_ready "$name" "$limit" "$STATE/$name/pid" "$STATE/$name/$name.log" "$@"); then
    "$stop_fn"; exit 1
  fi
}

# roundtrip_or_stop NAME STOP_FN WHAT CHECK... — runs the client round trip CHECK; if it fails, prints the
# log tail, stops the broker with STOP_FN and fails saying WHAT failed.
roundtrip_or_stop() {
  local name=$1 stop_fn=$2 what=$3; shift 3
  if ! "$@"; then
    tail_log "$name" "$STATE/$name/$name.log"; "$stop_fn"
    die "$name: $what"
  fi
}

# stop_pid NAME PIDFILE [GRACE_SECONDS] — SIGTERM, wait, then SIGKILL; only the pid in PIDFILE (modules
# write the broker process's own pid there, not a wrapper's).
stop_pid() {
  local name=$1 pidfile=$2 grace=${3:-30}
  if ! alive "$pidfile"; then rm -f "$pidfile"; return 0; fi
  local pid; pid=$(cat "$pidfile")
  kill -TERM "$pid" 2>/dev/null || true
  local start=$SECONDS
  while pid_running "$pid" && (( SECONDS - start < grace )); do sleep 1; done
  if pid_running "$pid"; then
    log "$name: still running after ${grace} s; killing pid $pid"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
  log "$name: stopped"
}

# apt_install PACKAGE... — installs the Debian packages that are missing (as root, or through sudo). Waits
# for a dpkg lock held by a boot-time upgrade instead of failing, and refreshes the package lists (once,
# tolerating an unreachable extra source) when the first try finds nothing.
apt_install() {
  local missing=() p
  # Installed means "install ok installed": a removed package keeps its config files and a dpkg record.
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  local apt=($sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -y -q)
  log "installing ${missing[*]} (apt)"
  if ! "${apt[@]}" install --no-install-recommends "${missing[@]}" >/dev/null; then
    "${apt[@]}" update >/dev/null || log "apt-get update reported errors; trying the install anyway"
    "${apt[@]}" install --no-install-recommends "${missing[@]}" >/dev/null \
      || die "apt-get install ${missing[*]} failed"
  fi
}

# install_build_packages — the Debian packages the workspace's crates need to build: protoc for the pulsar
# client's protocol, OpenSSL, zlib, cmake and a C toolchain for librdkafka.
install_build_packages() {
  apt_install protobuf-compiler libssl-dev pkg-config zlib1g-dev cmake build-essential
}

# install_browser_packages — Debian's chromium and its WebDriver (chromedriver), for the DLQ console's
# browser test (retryctl/tests/console.rs).
install_browser_packages() {
  apt_install chromium chromium-driver
}

# maven_classpath NAME POMDIR — resolves the Maven project in POMDIR into a classpath (cached by the pom's
# hash under $CACHE/NAME) and prints it. The jars themselves stay in ~/.m2.
maven_classpath() {
  local name=$1 pomdir=$2
  command -v mvn >/dev/null || apt_install maven
  local hash; hash=$(sha256sum "$pomdir/pom.xml" | cut -c1-16)
  local out="$CACHE/$name/classpath-$hash.txt"
  # The cached classpath is reused while every jar it names is still in the local Maven repository.
  if [ ! -s "$out" ] || ! tr ':' '\n' < "$out" | xargs -r ls >/dev/null 2>&1; then
    mkdir -p "$CACHE/$name"
    log "$name: resolving the Maven classpath (first run downloads from Maven Central)"
    timeout 1200 mvn -B -q -f "$pomdir/pom.xml" dependency:build-classpath -Dmdep.outputFile="$out.tmp" \
      > "$CACHE/$name/mvn.log" 2>&1 || { tail -n 30 "$CACHE/$name/mvn.log" >&2; die "$name: Maven could not resolve $pomdir/pom.xml"; }
    mv "$out.tmp" "$out"
  fi
  cat "$out"
}

# launch_detached NAME DIR LOGFILE CMD... — starts CMD in DIR in its own session (so it outlives the
# script and no terminal signal reaches it), output to LOGFILE. DIR/pid is written by the process itself
# just before it becomes CMD, so it is CMD's own pid whether or not setsid had to fork.
launch_detached() {
  local name=$1 d=$2 logfile=$3; shift 3
  rm -f "$d/pid"
  ( cd "$d" && exec nohup setsid bash -c 'echo $$ > "$0"; exec "$@"' "$d/pid" "$@" \
      > "$logfile" 2>&1 < /dev/null ) &
  local i
  for i in $(seq 50); do [ -s "$d/pid" ] && return 0; sleep 0.1; done
  die "$name: the process did not start (see $logfile)"
}

# cmdline_has PIDFILE PATTERN — true if the pid in PIDFILE is alive and its command line matches PATTERN
# (guards against a reused pid: status never vouches for, and stop never signals, a stranger).
cmdline_has() {
  alive "$1" && tr '\0' ' ' < "/proc/$(cat "$1")/cmdline" 2>/dev/null | grep -q -- "$2"
}

# java_bin — the java to run brokers with.
java_bin() { command -v java || die "java is not installed (OpenJDK 17 is expected)"; }

# shellcheck source=tls.sh
source "$(dirname "${BASH_SOURCE[0]}")/tls.sh"
