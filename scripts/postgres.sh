#!/usr/bin/env bash
# Runs a command with LIFEBOAT_TEST_DATABASE_URL pointing to a PostgreSQL database, e.g.
#
#   scripts/postgres.sh cargo test --workspace --test ledger
#
# - LIFEBOAT_TEST_DATABASE_URL already set: the command runs against that server (its role needs
#   CREATEDB: each test creates and drops its own database).
# - Otherwise a throwaway PostgreSQL is started: initdb in a temporary directory, listening on a
#   free loopback port (its Unix socket in the same directory), password authentication
#   (SCRAM), one database; it is stopped and removed when the command ends, whatever the outcome.
# - PostgreSQL's binaries (initdb, pg_ctl) are taken from PATH or Debian's
#   /usr/lib/postgresql/<version>/bin (highest version). When absent they are installed from
#   Debian's packages (`apt-get install postgresql`; needs root) and stay installed; a cluster
#   the installation started (Debian's `main` on port 5432, where services may start) is stopped.
#   LIFEBOAT_POSTGRES_ASSUME_ABSENT=1 takes that path even when they are present, to exercise it:
#   apt-get then keeps the installed package, or upgrades it to the newest one in its lists.
# - PostgreSQL refuses to run as root: as root the server runs as the `postgres` user that
#   Debian's package creates (through runuser); the command itself runs as the caller.
#
# The exit status is the command's.
set -euo pipefail

if [[ $# -eq 0 ]]; then
    echo "usage: $0 COMMAND [ARGS...]" >&2
    exit 2
fi

log() { echo "postgres.sh: $*" >&2; }

if [[ -n "${LIFEBOAT_TEST_DATABASE_URL:-}" ]]; then
    log "using the given LIFEBOAT_TEST_DATABASE_URL"
    exec "$@"
fi

find_bindir() {
    if [[ "${LIFEBOAT_POSTGRES_ASSUME_ABSENT:-}" == 1 && -z "${installed_now:-}" ]]; then
        return 1
    fi
    local initdb
    if initdb=$(command -v initdb 2>/dev/null) && command -v pg_ctl >/dev/null 2>&1; then
        # Resolve symlinks (e.g. /usr/local/bin/initdb -> /usr/lib/postgresql/15/bin/initdb):
        # the other tools (postgres, psql) live beside the real one.
        dirname "$(readlink -f "$initdb")"
        return 0
    fi
    local dir
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5 -V -r); do
        if [[ -x "$dir/initdb" && -x "$dir/pg_ctl" ]]; then
            echo "$dir"
            return 0
        fi
    done
    return 1
}

# Debian's clusters (postgresql-common) that are running, as VERSION:NAME lines.
online_clusters() {
    command -v pg_lsclusters >/dev/null 2>&1 || return 0
    pg_lsclusters -h 2>/dev/null | awk '$4 ~ /^online/ { print $1 ":" $2 }'
}

install_postgres() {
    if [[ $(id -u) -ne 0 ]]; then
        log "PostgreSQL (initdb, pg_ctl) not found and not running as root to install it."
        log "Install it (Debian: sudo apt-get install postgresql) or set LIFEBOAT_TEST_DATABASE_URL."
        exit 1
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        log "PostgreSQL not found and apt-get is not available: install PostgreSQL or set LIFEBOAT_TEST_DATABASE_URL."
        exit 1
    fi
    log "PostgreSQL not found: installing it from Debian's packages (apt-get install postgresql)"
    export DEBIAN_FRONTEND=noninteractive
    # A fresh machine has no package lists yet: update only when the package is unknown.
    if ! apt-cache show postgresql >/dev/null 2>&1; then
        apt-get update -q
    fi
    local online_before
    online_before=$(online_clusters)
    apt-get install -y -q --no-install-recommends postgresql
    installed_now=1
    # Debian's package creates a `main` cluster and, where services may start (systemd, no
    # policy-rc.d), starts it on port 5432. The tests do not use it: stop what the installation
    # started (the package stays installed; the cluster starts again at boot).
    local cluster
    for cluster in $(online_clusters); do
        if ! grep -qxF "$cluster" <<<"$online_before"; then
            log "stopping PostgreSQL cluster ${cluster/:/\/} that the package installation started"
            pg_ctlcluster "${cluster%%:*}" "${cluster#*:}" stop ||
                log "could not stop cluster ${cluster/:/\/}"
        fi
    done
}

bindir=$(find_bindir) || {
    install_postgres
    bindir=$(find_bindir) || {
        log "PostgreSQL installed but initdb/pg_ctl still not found under /usr/lib/postgresql/*/bin"
        exit 1
    }
}
log "using $("$bindir/postgres" --version) from $bindir"

# As root, run the server's tools as `postgres`; otherwise as the caller.
as_server_user=()
server_user=$(id -un)
if [[ $(id -u) -eq 0 ]]; then
    if ! id postgres >/dev/null 2>&1; then
        log "running as root and there is no 'postgres' user to run the server as"
        log "(Debian's postgresql package creates it); create one or run as another user"
        exit 1
    fi
    as_server_user=(runuser -u postgres --)
    server_user=postgres
fi

workdir=$(mktemp -d "${TMPDIR:-/tmp}/lifeboat-postgres.XXXXXX")
datadir="$workdir/data"
started=""

cleanup() {
    local status=$?
    if [[ -n "$started" ]]; then
        "${as_server_user[@]}" "$bindir/pg_ctl" -D "$datadir" -m fast -w stop >/dev/null 2>&1 ||
            log "could not stop the server cleanly (log: $workdir/server.log)"
    fi
    rm -rf "$workdir"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

chmod 700 "$workdir"
[[ -n "${as_server_user[*]}" ]] && chown "$server_user" "$workdir"

# A random password: the server authenticates with SCRAM, as a real deployment would.
password=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
pwfile="$workdir/pwfile"
(umask 077 && printf '%s\n' "$password" >"$pwfile")
[[ -n "${as_server_user[*]}" ]] && chown "$server_user" "$pwfile"

"${as_server_user[@]}" "$bindir/initdb" -D "$datadir" -U lifeboat --pwfile="$pwfile" \
    --auth=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 --no-sync >"$workdir/initdb.log" 2>&1 || {
    cat "$workdir/initdb.log" >&2
    log "initdb failed"
    exit 1
}
rm -f "$pwfile"

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# A free loopback port; another process may take it between the check and the start, so retry.
for attempt in 1 2 3 4 5; do
    port=$((20000 + RANDOM % 30000))
    port_in_use "$port" && continue
    if "${as_server_user[@]}" "$bindir/pg_ctl" -D "$datadir" -l "$workdir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $workdir" start >/dev/null; then
        started=1
        break
    fi
    log "start on port $port failed (attempt $attempt)"
done
if [[ -z "$started" ]]; then
    cat "$workdir/server.log" >&2 || true
    log "could not start PostgreSQL"
    exit 1
fi

psql="$bindir/psql"
[[ -x "$psql" ]] || psql=psql
PGPASSWORD="$password" "$psql" -X -q -h 127.0.0.1 -p "$port" -U lifeboat -d postgres \
    -c "CREATE DATABASE lifeboat_test" >/dev/null
log "PostgreSQL on 127.0.0.1:$port, database lifeboat_test (stopped and removed on exit)"

export LIFEBOAT_TEST_DATABASE_URL="postgres://lifeboat:$password@127.0.0.1:$port/lifeboat_test"
# Not exec: the trap stops the server when the command is done.
"$@"
