#!/usr/bin/env bash
# Back up chatsite's PostgreSQL databases with pg_dump, one custom-format dump per database.
#
#   scripts/backup.sh [-o DIR] [NAME=URL ...]
#
# Without NAME=URL arguments it dumps every database the deployment writes, read from the same
# environment the app uses: DATABASE_URL as "default", and the primary of each region in
# CHAT_REGION_DATABASE_URLS ({"us-east": URL} or {"us-east": [PRIMARY, REPLICA, ...]}) as
# "region_<name>" (replicas are copies: not dumped). Each dump is DIR/<NAME>.dump, written to a
# temporary name, checked by listing it with pg_restore, then renamed, so a file with the final
# name is always a complete dump. DIR also gets SHA256SUMS. DIR defaults to
# $CHAT_BACKUP_DIR/<UTC time> (CHAT_BACKUP_DIR: var/backups); it must not contain dumps already.
#
# Each dump is one consistent snapshot of its database (pg_dump runs in one repeatable-read
# transaction; writers are not blocked). Dumps of different databases are taken one after the
# other, so they are not one snapshot together: a conversation lives in exactly one region's
# database, and accounts in "default", so each region restores on its own.
#
# The turn log (conversations_turn) is partitioned by month: the dump holds the partitioned
# table, every partition (the DEFAULT one too) with its bounds, and each partition's rows.
#
# Binaries: $PG_BIN/pg_dump if PG_BIN is set; otherwise the newest of the pg_dump on PATH and
# the one the pgserver wheel ships (PostgreSQL 16, .venv). pg_dump must be at least as new as
# the server. Passwords: in the URL, ~/.pgpass or PGPASSWORD (libpq's usual ways).
#
# Restore with scripts/restore.sh (docs/operations.md, "Backups and restore").
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/pg_tools.sh
. "$ROOT/scripts/pg_tools.sh"

usage() {
    echo "usage: $0 [-o DIR] [NAME=URL ...]" >&2
    exit 2
}

OUT=""
while getopts "o:h" opt; do
    case "$opt" in
        o) OUT="$OPTARG" ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
OUT="${OUT:-${CHAT_BACKUP_DIR:-$ROOT/var/backups}/$(date -u +%Y%m%dT%H%M%SZ)}"

# NAME<TAB>URL lines: from the arguments, else from the environment.
if [ "$#" -gt 0 ]; then
    targets=""
    for pair in "$@"; do
        case "$pair" in
            *=*) targets+="${pair%%=*}"$'\t'"${pair#*=}"$'\n' ;;
            *) echo "backup: '$pair' is not NAME=URL" >&2; usage ;;
        esac
    done
else
    targets="$(chatsite_databases)"
fi
[ -n "$targets" ] || die "nothing to back up"

PG_DUMP="$(pg_tool pg_dump)"
PG_RESTORE="$(pg_tool pg_restore)"

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
if compgen -G "$OUT/*.dump" >/dev/null; then
    die "$OUT already holds dumps; give a new directory with -o"
fi

echo "backup: $("$PG_DUMP" --version) -> $OUT"
while IFS=$'\t' read -r name url; do
    [ -n "$name" ] || continue
    case "$name" in
        *[!A-Za-z0-9_.-]*) die "invalid dump name '$name' (letters, digits, _ . - only)" ;;
    esac
    final="$OUT/$name.dump"
    partial="$OUT/.$name.dump.partial"
    started=$(date +%s)
    # --format=custom: compressed, and pg_restore can restore it selectively or in parallel.
    "$PG_DUMP" --format=custom --file="$partial" --dbname="$url" \
        || die "pg_dump of '$name' failed (nothing written as $final)"
    "$PG_RESTORE" --list "$partial" >/dev/null || die "the dump of '$name' does not read back"
    mv "$partial" "$final"
    echo "backup: $name -> $final ($(du -h "$final" | cut -f1), $(( $(date +%s) - started )) s)"
done <<<"$targets"

(cd "$OUT" && sha256sum -- *.dump >SHA256SUMS)
echo "backup: done ($OUT/SHA256SUMS)"
