-- Named queries. Each starts with a "-- name: <name>" line; the text up to the next header is
-- the statement. {placeholders} are identifiers composed with psycopg.sql.Identifier after
-- validation; every value is a bound parameter (%s or %(name)s).

-- name: create_schema
CREATE SCHEMA IF NOT EXISTS {schema}

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS {migrations} (
    version integer PRIMARY KEY,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT pg_catalog.now()
)

-- name: lock_schema_changes
SELECT pg_catalog.pg_advisory_xact_lock(%s)

-- name: applied_migrations
SELECT version, name, checksum FROM {migrations} ORDER BY version

-- name: record_migration
INSERT INTO {migrations} (version, name, checksum) VALUES (%s, %s, %s)

-- name: read_meta
SELECT lanes, schema_version FROM {meta} WHERE singleton

-- name: insert_meta
INSERT INTO {meta} (lanes, schema_version) VALUES (%s, %s)

-- name: update_meta_version
UPDATE {meta} SET schema_version = %s, updated_at = pg_catalog.now() WHERE singleton

-- name: update_meta_lanes
UPDATE {meta} SET lanes = %s, updated_at = pg_catalog.now() WHERE singleton

-- name: any_pending_row
SELECT EXISTS (SELECT 1 FROM {outbox})

-- name: table_exists
SELECT pg_catalog.to_regclass(%s) IS NOT NULL

-- name: insert_message
INSERT INTO {outbox} (id, lane, ordering_key, transport, destination, body, headers, deliver_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)

-- name: insert_message_notify
-- The payload is the row's lane, so a worker wakes just that lane. PostgreSQL sends a
-- (channel, payload) pair once per transaction, at commit, however often it was notified.
WITH inserted AS (
    INSERT INTO {outbox} (id, lane, ordering_key, transport, destination, body, headers, deliver_at)
    VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
)
SELECT pg_catalog.pg_notify(%s, %s)

-- name: copy_messages
COPY {outbox} (id, lane, ordering_key, transport, destination, body, headers, deliver_at)
FROM STDIN (FORMAT BINARY)

-- name: notify
-- An empty payload wakes every lane (the workers probe them all in one query).
SELECT pg_catalog.pg_notify(%s, '')

-- name: notify_lanes
SELECT pg_catalog.pg_notify(%s, lane::pg_catalog.text)
FROM pg_catalog.unnest(%s::pg_catalog.int4[]) AS lane

-- name: notify_channels
-- The after-commit wake-ups of several stores of one database: a channel and a payload each
-- (a lane's number, or empty: every lane).
SELECT pg_catalog.pg_notify(wake.channel, wake.payload)
FROM ROWS FROM (pg_catalog.unnest(%s::pg_catalog.text[]), pg_catalog.unnest(%s::pg_catalog.text[]))
    AS wake (channel, payload)
