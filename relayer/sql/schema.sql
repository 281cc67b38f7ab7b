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
