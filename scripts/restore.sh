#!/usr/bin/env bash
# Restore one dump made by scripts/backup.sh into an EMPTY database.
#
#   scripts/restore.sh DUMP_FILE TARGET_URL
#
# TARGET_URL names a database that exists and holds no tables, views or sequences yet (create
# it with `createdb -O chat chat`, or CREATE DATABASE; the pgvector extension must be installed
# on that server). A database that holds anything is refused and left alone: restoring over a
# live database would mix two histories.
#
# Steps: the dump's checksum is checked against SHA256SUMS beside it (when there is one); the
# dump is listed (it must read back); pg_restore runs in ONE transaction with --exit-on-error,
# so a failed restore leaves the database empty again; objects are owned by the user of
# TARGET_URL (--no-owner; the original roles need not exist) and no GRANTs are replayed
# (--no-privileges); finally ANALYZE gives the planner statistics (a dump carries none).
# Partitioned tables come back partitioned: the turn log's monthly partitions and DEFAULT, with
# their bounds and rows.
#
# For a deployment with regions, restore each region's dump into that region's new database:
#   for f in DIR/*.dump; do scripts/restore.sh "$f" "<the URL for $(basename "$f" .dump)>"; done
#
# Binaries as in scripts/backup.sh (PG_BIN, else the newest pg_restore found).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/pg_tools.sh
. "$ROOT/scripts/pg_tools.sh"

[ "$#" -eq 2 ] || { echo "usage: $0 DUMP_FILE TARGET_URL" >&2; exit 2; }
DUMP="$1"
TARGET="$2"
[ -f "$DUMP" ] || die "no such dump: $DUMP"

PG_RESTORE="$(pg_tool pg_restore)"
PSQL="$(dirname "$PG_RESTORE")/psql"
[ -x "$PSQL" ] || PSQL="$(pg_tool psql)"

sums="$(dirname "$DUMP")/SHA256SUMS"
if [ -f "$sums" ]; then
    expected="$(awk -v f="$(basename "$DUMP")" '$2 == f || $2 == "*" f {print $1}' "$sums")"
    if [ -n "$expected" ]; then
        actual="$(sha256sum -- "$DUMP" | cut -d' ' -f1)"
        [ "$actual" = "$expected" ] || die "$DUMP does not match its checksum in $sums: damaged copy?"
    fi
fi
"$PG_RESTORE" --list "$DUMP" >/dev/null || die "$DUMP is not a readable custom-format dump"

objects="$("$PSQL" --no-psqlrc --quiet --tuples-only --no-align --dbname="$TARGET" --command \
    "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
       AND n.nspname NOT IN ('pg_catalog', 'information_schema')
       AND n.nspname NOT LIKE 'pg\_toast%' AND n.nspname NOT LIKE 'pg\_temp%'")" \
    || die "cannot connect to the target database"
[ "$objects" = "0" ] || die "the target database is not empty ($objects tables, views or sequences): restore into a new, empty database"

echo "restore: $("$PG_RESTORE" --version): $DUMP -> target database"
"$PG_RESTORE" --exit-on-error --single-transaction --no-owner --no-privileges \
    --dbname="$TARGET" "$DUMP" || die "pg_restore failed; the transaction was rolled back"
"$PSQL" --no-psqlrc --quiet --dbname="$TARGET" --command "ANALYZE" || die "ANALYZE failed"
echo "restore: done"
