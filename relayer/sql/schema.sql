-- Named queries of a store's schema beyond queries.sql's (same format and namespace): the
-- search_path that apply and the drift check pin, the drift check's catalog reads, and
-- dropping a store's schema.

-- name: pin_search_path
-- Inside apply's transaction (and the drift check's), names in the migrations resolve to
-- PostgreSQL's own functions, types and operators whatever the role's or database's
-- search_path puts first: a column default is bound when it is created, so a schema placed
-- ahead of pg_catalog (`search_path = evil, pg_catalog`) could otherwise plant its now() in
-- every insert. SET LOCAL ends with the transaction, so a pooled connection keeps its own.
SET LOCAL search_path = pg_catalog, pg_temp

-- name: lock_outbox_for_lane_change
-- SHARE mode waits for in-flight writers and blocks new ones until the transaction ends, so
-- no row can slip in between the emptiness check and the new lane count.
LOCK TABLE {outbox} IN SHARE MODE

-- name: drop_schema
DROP SCHEMA IF EXISTS {schema} CASCADE

-- name: catalog_schema_oid
SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = %s

-- name: catalog_temp_schema_oid
SELECT pg_catalog.pg_my_temp_schema()::oid

-- name: catalog_columns
SELECT c.relname, a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull,
       coalesce(pg_catalog.pg_get_expr(d.adbin, d.adrelid), '')
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
WHERE c.relnamespace = %s AND c.relname = ANY(%s) AND c.relkind IN ('r', 'p')

-- name: catalog_indexes
SELECT t.relname, i.relname, pg_catalog.pg_get_indexdef(i.oid)
FROM pg_catalog.pg_index x
JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid
JOIN pg_catalog.pg_class t ON t.oid = x.indrelid
WHERE t.relnamespace = %s AND t.relname = ANY(%s)

-- name: catalog_constraints
SELECT t.relname, pg_catalog.pg_get_constraintdef(k.oid)
FROM pg_catalog.pg_constraint k JOIN pg_catalog.pg_class t ON t.oid = k.conrelid
WHERE t.relnamespace = %s AND t.relname = ANY(%s) AND k.contype IN ('c', 'u', 'f')

-- name: join_tables
-- Stores of one database joining a worker together (relayer.store.joins), one row each, in
-- order: its metadata table's oid (NULL: never applied), its schema's oid (NULL: missing) and
-- its outbox's relkind ('p': partitioned storage). The first array holds the metadata tables'
-- quoted, qualified names, the second the schemas, the third the outboxes' names.
SELECT pg_catalog.to_regclass(t.meta)::oid, n.oid,
       (SELECT c.relkind::text FROM pg_catalog.pg_class AS c
        WHERE c.oid = pg_catalog.to_regclass(t.outbox))
FROM ROWS FROM (pg_catalog.unnest(%s::text[]), pg_catalog.unnest(%s::text[]),
                pg_catalog.unnest(%s::text[]))
    WITH ORDINALITY AS t(meta, schema, outbox, place)
LEFT JOIN pg_catalog.pg_namespace AS n ON n.nspname = t.schema
ORDER BY t.place

-- name: join_lock_timeout
-- How long a batch of joining stores waits for a lock on any of their tables before each of
-- them checks on its own (so that one store's held lock does not hold up the others).
SELECT pg_catalog.set_config('lock_timeout', %s, true)

-- name: join_meta
-- One store's part of a UNION ALL of joining stores: its place in the batch (bound), its
-- recorded lane count and schema version.
SELECT %s::integer, lanes, schema_version FROM {meta} WHERE singleton

-- name: join_migrations
-- One store's part of a UNION ALL of joining stores: its place in the batch (bound) and the
-- migrations recorded, with their checksums.
SELECT %s::integer, version, checksum FROM {migrations}

-- name: catalog_columns_of
-- catalog_columns for several schemas at once (their oids), each row with its schema's oid.
SELECT c.relnamespace, c.relname, a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod),
       a.attnotnull, coalesce(pg_catalog.pg_get_expr(d.adbin, d.adrelid), '')
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
WHERE c.relnamespace = ANY(%s) AND c.relname = ANY(%s) AND c.relkind IN ('r', 'p')

-- name: catalog_indexes_of
SELECT t.relnamespace, t.relname, i.relname, pg_catalog.pg_get_indexdef(i.oid)
FROM pg_catalog.pg_index x
JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid
JOIN pg_catalog.pg_class t ON t.oid = x.indrelid
WHERE t.relnamespace = ANY(%s) AND t.relname = ANY(%s)

-- name: catalog_constraints_of
SELECT t.relnamespace, t.relname, pg_catalog.pg_get_constraintdef(k.oid)
FROM pg_catalog.pg_constraint k JOIN pg_catalog.pg_class t ON t.oid = k.conrelid
WHERE t.relnamespace = ANY(%s) AND t.relname = ANY(%s) AND k.contype IN ('c', 'u', 'f')
