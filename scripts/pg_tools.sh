# Shared by scripts/backup.sh and scripts/restore.sh (sourced, not run).

die() {
    echo "${0##*/}: $*" >&2
    exit 1
}

# The major version of a PostgreSQL client binary ("pg_dump (PostgreSQL) 16.4" -> 16), 0 if it
# does not run.
pg_major() {
    "$1" --version 2>/dev/null | sed -n 's/^[^0-9]*\([0-9][0-9]*\).*/\1/p' | head -n1 | grep . || echo 0
}

# The path of PostgreSQL program $1: $PG_BIN/$1 if PG_BIN is set, else the newest of the one on
# PATH and the one in the pgserver wheel (a newer pg_dump reads older servers; not the reverse).
pg_tool() {
    local program="$1" candidate best="" best_major=-1 major wheel_bin python
    if [ -n "${PG_BIN:-}" ]; then
        [ -x "$PG_BIN/$program" ] || die "PG_BIN=$PG_BIN has no $program"
        echo "$PG_BIN/$program"
        return
    fi
    python="${PYTHON:-$ROOT/.venv/bin/python}"
    [ -x "$python" ] || python=python3
    wheel_bin="$("$python" -c 'import pathlib, pgserver; print(pathlib.Path(pgserver.__file__).parent / "pginstall" / "bin")' 2>/dev/null || true)"
    for candidate in "$(command -v "$program" || true)" "${wheel_bin:+$wheel_bin/$program}"; do
        [ -n "$candidate" ] && [ -x "$candidate" ] || continue
        major="$(pg_major "$candidate")"
        if [ "$major" -gt "$best_major" ]; then
            best="$candidate"
            best_major="$major"
        fi
    done
    [ -n "$best" ] || die "$program not found: install the PostgreSQL client or set PG_BIN"
    echo "$best"
}

# "NAME<TAB>URL" lines for the databases this deployment writes: DATABASE_URL as default, and
# the primary (first URL) of each region in CHAT_REGION_DATABASE_URLS as region_<name>.
chatsite_databases() {
    local python="${PYTHON:-$ROOT/.venv/bin/python}"
    [ -x "$python" ] || python=python3
    [ -n "${DATABASE_URL:-}" ] || die "DATABASE_URL is not set (or give NAME=URL arguments)"
    "$python" - <<'PY'
import json
import os

print(f"default\t{os.environ['DATABASE_URL']}")
regions = json.loads(os.environ.get("CHAT_REGION_DATABASE_URLS") or "{}")
for region, urls in regions.items():
    primary = urls if isinstance(urls, str) else urls[0]
    print(f"region_{region}\t{primary}")
PY
}
