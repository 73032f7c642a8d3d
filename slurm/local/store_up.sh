#!/usr/bin/env bash
# A team's MLflow store: a tracking server on PostgreSQL (Debian's package) with artifacts on a
# shared folder and MLflow's own authentication (basic-auth), one account per user. Started by
# hand, no systemd needed; idempotent: rerunning it while the store is up takes a second.
#   sudo slurm/local/store_up.sh                  # the store in /var/lib/hyprun-store, port 5050
#   HYPRUN_STORE_USERS="ana bo" slurm/local/store_up.sh   # accounts with EDIT on experiment hyprun
#   slurm/local/store_down.sh                     # stops the server, then PostgreSQL
# Settings (environment):
#   HYPRUN_STORE_DIR        folder of the store: PostgreSQL's data, logs, credentials
#   HYPRUN_STORE_ARTIFACTS  the shared folder artifacts go to (default $HYPRUN_STORE_DIR/artifacts)
#   HYPRUN_STORE_HOST/PORT  where the tracking server listens (127.0.0.1:5050)
#   HYPRUN_STORE_PG_PORT    PostgreSQL's port on 127.0.0.1 (5433: Debian's own cluster keeps 5432)
#   HYPRUN_STORE_WORKERS    the server's worker processes (2)
#   HYPRUN_STORE_USERS      accounts to create (each: $DIR/users/NAME.env, 0600)
#   HYPRUN_STORE_EDIT       experiments those accounts may edit (default: hyprun)
#   MLFLOW_AUTH_ADMIN_PASSWORD  the admin's password (set it on every run, or never); else generated
#                           into $DIR/admin.env (0600) on the first run
#   HYPRUN_STORE_PYTHON     the Python with mlflow, psycopg and Flask-WTF (default: .venv's)
# No password is ever on a command line or in a URI: PostgreSQL's comes from a pgpass file
# (PGPASSFILE), the admin's from the environment of the server process.
set -euo pipefail
start=$SECONDS
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${HYPRUN_STORE_DIR:-/var/lib/hyprun-store}
artifacts=${HYPRUN_STORE_ARTIFACTS:-$dir/artifacts}
host=${HYPRUN_STORE_HOST:-127.0.0.1}
port=${HYPRUN_STORE_PORT:-5050}
pg_port=${HYPRUN_STORE_PG_PORT:-5433}
workers=${HYPRUN_STORE_WORKERS:-2}
python=${HYPRUN_STORE_PYTHON:-$root/.venv/bin/python}
uri=http://$host:$port
die() { echo "store_up.sh: $*" >&2; exit 1; }
secret() { od -An -tx1 -N16 /dev/urandom | tr -d ' \n'; }
as_postgres() { runuser -u postgres -- "$@"; }

# --- packages ------------------------------------------------------------------------------------
if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-cache show postgresql >/dev/null 2>&1 || apt-get update -qq
  apt-get install -y -qq --no-install-recommends postgresql >/dev/null
fi
pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n1)
"$python" -c "import mlflow, psycopg, flask_wtf" 2>/dev/null ||
  die "$python lacks mlflow, psycopg or Flask-WTF: pip install -e '.[dev]'"

# --- folders and credentials ---------------------------------------------------------------------
umask 077
mkdir -p "$dir" "$dir/users" "$artifacts"
chmod 711 "$dir"  # PostgreSQL (user postgres) reaches its data folder inside, nothing more
install -d -o postgres -g postgres -m 700 "$dir/pg" "$dir/socket"
as_postgres test -w "$dir/pg" ||
  die "user postgres cannot reach $dir/pg: pick a HYPRUN_STORE_DIR whose parents it can enter"
[[ -s $dir/pg.secret ]] || secret >"$dir/pg.secret"
pg_pass=$(cat "$dir/pg.secret")
# The key that signs the UI's CSRF tokens: the same across workers and restarts.
[[ -s $dir/flask.secret ]] || secret >"$dir/flask.secret"
printf '127.0.0.1:%s:*:mlflow:%s\n' "$pg_port" "$pg_pass" >"$dir/pgpass"
if [[ -n ${MLFLOW_AUTH_ADMIN_PASSWORD:-} ]]; then
  admin_pass=$MLFLOW_AUTH_ADMIN_PASSWORD
else
  [[ -s $dir/admin.env ]] || printf 'MLFLOW_TRACKING_USERNAME=admin\nMLFLOW_TRACKING_PASSWORD=%s\n' \
    "$(secret)" >"$dir/admin.env"
  admin_pass=$(sed -n 's/^MLFLOW_TRACKING_PASSWORD=//p' "$dir/admin.env")
fi

# --- PostgreSQL ----------------------------------------------------------------------------------
if [[ ! -s $dir/pg/PG_VERSION ]]; then
  as_postgres "$pg_bin/initdb" -D "$dir/pg" -U postgres --auth-local=peer \
    --auth-host=scram-sha-256 >/dev/null
fi
if ! as_postgres "$pg_bin/pg_isready" -q -h "$dir/socket" -p "$pg_port"; then
  as_postgres "$pg_bin/pg_ctl" -D "$dir/pg" -l "$dir/pg/postgres.log" -w -t 60 start \
    -o "-p $pg_port -k $dir/socket -c listen_addresses=127.0.0.1 -c max_connections=200" \
    >/dev/null || die "PostgreSQL did not start, see $dir/pg/postgres.log"
fi
sql() { as_postgres "$pg_bin/psql" -q -v ON_ERROR_STOP=1 -h "$dir/socket" -p "$pg_port" "$@"; }
# The password travels on psql's standard input, never on a command line.
sql -d postgres <<EOF
SELECT 'CREATE ROLE mlflow LOGIN' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'mlflow')
\gexec
ALTER ROLE mlflow PASSWORD '$pg_pass';
SELECT 'CREATE DATABASE mlflow OWNER mlflow' WHERE NOT EXISTS
  (SELECT FROM pg_database WHERE datname = 'mlflow')
\gexec
SELECT 'CREATE DATABASE mlflow_auth OWNER mlflow' WHERE NOT EXISTS
  (SELECT FROM pg_database WHERE datname = 'mlflow_auth')
\gexec
EOF

# --- the tracking server -------------------------------------------------------------------------
cat >"$dir/basic_auth.ini" <<EOF
[mlflow]
# Everyone signed in reads every experiment; writing needs EDIT, granted per experiment
# (HYPRUN_STORE_EDIT), or MANAGE on an experiment the user created.
default_permission = READ
database_uri = postgresql://mlflow@127.0.0.1:$pg_port/mlflow_auth
admin_username = admin
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
# Checking a password costs ~0.5 s of hashing (PBKDF2) on each request: 'hyprun status' sends a
# dozen. A checked password is trusted for a minute per worker (MLflow's own cache); a changed
# or deleted account takes up to that long to reach every worker.
auth_cache_ttl_seconds = 60
EOF
answers() { curl -fs -o /dev/null --max-time 2 "$uri/health"; }
if ! answers; then
  pid_file=$dir/mlflow.pid
  if [[ -f $pid_file ]] && kill -0 "$(cat "$pid_file")" 2>/dev/null; then
    die "the server ($(cat "$pid_file")) runs but $uri/health does not answer: store_down.sh first"
  fi
  PGPASSFILE=$dir/pgpass MLFLOW_AUTH_CONFIG_PATH=$dir/basic_auth.ini \
    MLFLOW_AUTH_ADMIN_PASSWORD=$admin_pass MLFLOW_FLASK_SERVER_SECRET_KEY=$(cat "$dir/flask.secret") \
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false \
    setsid "$python" -m mlflow server --host "$host" --port "$port" --workers "$workers" \
    --backend-store-uri "postgresql://mlflow@127.0.0.1:$pg_port/mlflow" \
    --artifacts-destination "$artifacts" --app-name basic-auth \
    </dev/null >>"$dir/mlflow.log" 2>&1 &
  echo $! >"$pid_file"
  for _ in $(seq 240); do
    answers && break
    kill -0 "$(cat "$pid_file")" 2>/dev/null || die "the server exited, see $dir/mlflow.log"
    sleep 0.5
  done
  answers || die "the server did not answer within 120 s, see $dir/mlflow.log"
fi

# --- accounts ------------------------------------------------------------------------------------
if [[ -n ${HYPRUN_STORE_USERS:-} ]]; then
  MLFLOW_TRACKING_USERNAME=admin MLFLOW_TRACKING_PASSWORD=$admin_pass \
    "$python" -m hyprun.runner.store.team "$uri" \
    "$dir/users" --users ${HYPRUN_STORE_USERS} --edit ${HYPRUN_STORE_EDIT:-hyprun}
fi
admin=$dir/admin.env
[[ -n ${MLFLOW_AUTH_ADMIN_PASSWORD:-} ]] && admin="MLFLOW_AUTH_ADMIN_PASSWORD"
echo "store up in $((SECONDS - start)) s: MLFLOW_TRACKING_URI=$uri (PostgreSQL :$pg_port," \
  "artifacts in $artifacts); the admin's password: $admin"
