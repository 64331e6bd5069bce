#!/usr/bin/env bash
# dev-postgres.sh makes sure the PostgreSQL database in RATCHET_POSTGRES_URL
# (default postgres://localhost:5432/ratchet) exists and answers, so that
# `make run` can start `ratchet dev` right after it.
#
#   1. Is a server answering at the URL's host and port?
#   2. If not, and the host is this machine: as root on Debian/Ubuntu it
#      installs and starts PostgreSQL and creates a superuser role for the
#      current OS user; otherwise it prints the commands to run and exits 1.
#   3. Creates the database named in the URL if it does not exist.
#   4. Prints one line naming the server and database (never a password).
#
# Running it again changes nothing. Exit status: 0 ready, 1 not ready.
set -euo pipefail

readonly default_url="postgres://localhost:5432/ratchet"
url="${RATCHET_POSTGRES_URL:-$default_url}"
os_user="$(id -un)"

say() { printf 'dev-postgres: %s\n' "$*"; }
die() { printf 'dev-postgres: %s\n' "$*" >&2; exit 1; }

# urldecode turns %XX escapes back into bytes.
urldecode() { printf '%b' "${1//%/\\x}"; }

# query_param NAME prints the value of NAME in the URL's query string.
query_param() {
	local pair
	local IFS='&'
	for pair in $query; do
		if [[ "$pair" == "$1="* ]]; then
			urldecode "${pair#*=}"
			return 0
		fi
	done
	return 1
}

# --- 0. Parse the URL ------------------------------------------------------
re='^(postgres|postgresql)://([^/?#]*)(/[^?#]*)?(\?[^#]*)?$'
[[ "$url" =~ $re ]] || die "RATCHET_POSTGRES_URL is not a postgres:// or postgresql:// URL"
authority="${BASH_REMATCH[2]}"
path="${BASH_REMATCH[3]:-}"
query="${BASH_REMATCH[4]#\?}"

userinfo=""
hostport="$authority"
if [[ "$authority" == *@* ]]; then
	userinfo="${authority%@*}"
	hostport="${authority##*@}"
fi
url_user=""
has_password=false
if [[ -n "$userinfo" ]]; then
	url_user="$(urldecode "${userinfo%%:*}")"
	[[ "$userinfo" == *:* ]] && has_password=true
fi
[[ "$hostport" == *,* ]] && die "several hosts in RATCHET_POSTGRES_URL are not supported here"

host="" port=""
if [[ "$hostport" =~ ^\[([^]]*)\](:([0-9]*))?$ ]]; then # [ipv6]:port
	host="${BASH_REMATCH[1]}"
	port="${BASH_REMATCH[3]}"
elif [[ "$hostport" == *:* ]]; then
	host="${hostport%:*}"
	port="${hostport##*:}"
else
	host="$hostport"
fi
host="$(urldecode "$host")"
if [[ -z "$host" ]]; then host="$(query_param host || true)"; fi
if [[ -z "$port" ]]; then port="$(query_param port || true)"; fi
port="${port:-5432}"
[[ "$port" =~ ^[0-9]+$ ]] || die "port '$port' in RATCHET_POSTGRES_URL is not a number"

user="${url_user:-$(query_param user || true)}"
user="${user:-$os_user}"
db="$(urldecode "${path#/}")"
db="${db:-$(query_param dbname || true)}"
db="${db:-$user}" # libpq's default: the database named like the user

# An empty host (or a directory) means the local Unix socket.
socket=false
if [[ -z "$host" || "$host" == /* ]]; then socket=true; fi
case "$host" in
"" | /* | localhost | 127.0.0.1 | ::1) local_host=true ;;
*) local_host=false ;;
esac
if $socket; then
	where="${host:-local socket}:$port"
elif [[ "$host" == *:* ]]; then
	where="[$host]:$port"
else
	where="$host:$port"
fi

# admin_url is the URL with the database replaced by the maintenance
# database "postgres", to look for and create the target database.
admin_url="${url%%\?*}"
admin_url="${admin_url%"$path"}/postgres"
[[ -n "$query" ]] && admin_url="$admin_url?$query"

is_root() { [[ "$(id -u)" -eq 0 ]]; }

# as_postgres runs a command as the postgres OS user (peer authentication
# over the local socket).
as_postgres() {
	if command -v runuser >/dev/null 2>&1; then
		runuser -u postgres -- "$@"
	else
		su postgres -s /bin/bash -c "$(printf '%q ' "$@")"
	fi
}

# --- 1. Is a server answering? ---------------------------------------------
server_up() {
	if command -v pg_isready >/dev/null 2>&1; then
		local args=(-q -t 3 -p "$port")
		[[ -n "$host" ]] && args+=(-h "$host")
		pg_isready "${args[@]}"
		return
	fi
	if $socket; then
		[[ -S "${host:-/var/run/postgresql}/.s.PGSQL.$port" ]]
		return
	fi
	# bash's /dev/tcp: the port accepts connections. The inner script is
	# single-quoted on purpose; host and port arrive as $0 and $1.
	# shellcheck disable=SC2016
	if command -v timeout >/dev/null 2>&1; then
		timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$host" "$port" 2>/dev/null
	else
		bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$host" "$port" 2>/dev/null
	fi
}

wait_server() {
	local i
	for ((i = 0; i < 60; i++)); do
		server_up && return 0
		sleep 0.5
	done
	return 1
}

print_install_help() {
	if ! command -v apt-get >/dev/null 2>&1; then
		cat >&2 <<EOF
dev-postgres: no PostgreSQL server answers at $where.
Install PostgreSQL with your system's package manager, start it, create a
superuser role named $os_user (createuser -s $os_user, as the postgres user),
then run this again, or point RATCHET_POSTGRES_URL at a server you have.
EOF
		return
	fi
	cat >&2 <<EOF
dev-postgres: no PostgreSQL server answers at $where.
Install and start one, then run this again:

  sudo apt-get update
  sudo DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql
  sudo service postgresql start
  sudo -u postgres createuser -s $os_user

or point RATCHET_POSTGRES_URL at a server you already have.
EOF
}

installed_here=false
start_local_server() {
	if ! command -v pg_ctlcluster >/dev/null 2>&1; then
		say "installing postgresql with apt-get"
		apt-get update
		DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql
		installed_here=true
	fi
	local conf ver started=false running=""
	for conf in /etc/postgresql/*/main; do
		[[ -d "$conf" ]] || continue
		ver="$(basename "$(dirname "$conf")")"
		if pg_ctlcluster "$ver" main status >/dev/null 2>&1; then
			running+=" $ver/main"
			continue
		fi
		say "starting PostgreSQL $ver"
		if pg_ctlcluster --skip-systemctl-redirect "$ver" main start; then started=true; fi
	done
	if ! $started && [[ -n "$running" ]]; then
		# Starting more would not help: the server runs, just not where
		# the URL points.
		die "PostgreSQL is running ($running ), but nothing answers at $where; check the host and port in RATCHET_POSTGRES_URL (pg_lsclusters lists the ports)"
	fi
	if ! $started && command -v service >/dev/null 2>&1; then
		service postgresql start || true
	fi
	wait_server || die "PostgreSQL was started but does not answer at $where (is it configured for port $port?)"
}

if ! server_up; then
	$local_host || die "no PostgreSQL server answers at $where; start it or change RATCHET_POSTGRES_URL"
	if ! is_root || ! command -v apt-get >/dev/null 2>&1; then
		print_install_help
		exit 1
	fi
	start_local_server
fi

if ! command -v psql >/dev/null 2>&1; then
	if is_root && command -v apt-get >/dev/null 2>&1; then
		say "installing postgresql-client with apt-get"
		apt-get update
		DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql-client
	else
		die "psql is not installed; install it with: sudo apt-get install -y postgresql-client"
	fi
fi

# psql_url URL SQL runs SQL (from stdin, so that :'var' and :"var" quote
# values and identifiers) against URL with the variables db and owner set.
psql_url() {
	printf '%s\n' "$2" | psql -X -q -At -v ON_ERROR_STOP=1 -v db="$db" -v owner="$user" -d "$1"
}
psql_postgres() {
	printf '%s\n' "$1" | as_postgres psql -X -q -At -v ON_ERROR_STOP=1 -v db="$db" -v owner="$user" -p "$port" -d postgres
}
can_use_postgres_user() { is_root && $local_host && id postgres >/dev/null 2>&1; }

# A fresh Debian install asks for passwords on TCP connections; the role
# created below has none. Trust it on loopback, on this development server
# only, because this script installed it.
trust_loopback() {
	local hba
	hba="$(psql_postgres 'SHOW hba_file')"
	grep -q "^# added by dev-postgres.sh" "$hba" && return 0
	{
		printf '# added by dev-postgres.sh for local development\n'
		printf 'host all %s 127.0.0.1/32 trust\nhost all %s ::1/128 trust\n' "$user" "$user"
		cat "$hba"
	} >"$hba.new"
	chown --reference="$hba" "$hba.new"
	chmod --reference="$hba" "$hba.new"
	mv "$hba.new" "$hba"
	psql_postgres 'SELECT pg_reload_conf()' >/dev/null
	say "trusting role $user on loopback in $hba"
}

# --- 2b. A role for the user -----------------------------------------------
if ! psql_url "$admin_url" 'SELECT 1' >/dev/null 2>&1 && can_use_postgres_user && ! $has_password; then
	if [[ "$(psql_postgres "SELECT 1 FROM pg_roles WHERE rolname = :'owner'")" != 1 ]]; then
		say "creating superuser role $user"
		as_postgres createuser -p "$port" -s "$user"
	fi
	if $installed_here; then trust_loopback; fi
fi

# --- 3. The database -------------------------------------------------------
exists_sql="SELECT 1 FROM pg_database WHERE datname = :'db'"
if found="$(psql_url "$admin_url" "$exists_sql" 2>/dev/null)"; then
	if [[ "$found" != 1 ]]; then
		say "creating database $db"
		psql_url "$admin_url" 'CREATE DATABASE :"db"'
	fi
elif can_use_postgres_user; then
	if [[ "$(psql_postgres "$exists_sql")" != 1 ]]; then
		say "creating database $db (owner $user)"
		if [[ "$(psql_postgres "SELECT 1 FROM pg_roles WHERE rolname = :'owner'")" == 1 ]]; then
			psql_postgres 'CREATE DATABASE :"db" OWNER :"owner"'
		else
			psql_postgres 'CREATE DATABASE :"db"'
		fi
	fi
else
	die "cannot connect to $where as $user to create database $db; create it yourself: createdb -h ${host:-localhost} -p $port -U <admin> $db"
fi

# --- 4. Report --------------------------------------------------------------
if ! err="$(psql_url "$url" 'SELECT 1' 2>&1 >/dev/null)"; then
	die "database $db exists on $where but connecting as $user fails: ${err//$'\n'/ }"
fi
say "using database $db on $where as $user"
