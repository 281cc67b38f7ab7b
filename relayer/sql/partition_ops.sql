-- What an operator reads of a partitioned store's partitions (docs/storage.md): the table
-- health's outbox line and how far ahead of the database clock the partitions reach.

-- name: partition_health
-- The outbox's partitions (%(parent)s: the outbox, quoted schema.table; NULL if it is gone),
-- summed: how many, their live and dead tuples, last vacuum and size (table, indexes and TOAST),
-- as the table health reads one table (a partitioned table has no storage or statistics of
-- its own); the upper bound of the newest partition (NULL: none; a UUID's text sorts as the
-- UUID does) and the database clock in Unix milliseconds. Catalog reads only: an operator's
-- role can run it.
WITH partitions AS MATERIALIZED (
    SELECT c.oid,
           pg_catalog.substring(pg_catalog.pg_get_expr(c.relpartbound, c.oid),
                                'TO \(''([0-9a-f-]+)''\)') AS upper
    FROM pg_catalog.pg_inherits AS i
    JOIN pg_catalog.pg_class AS c ON c.oid = i.inhrelid
    WHERE i.inhparent = pg_catalog.to_regclass(%(parent)s)
)
SELECT pg_catalog.count(*)::int8,
       coalesce(pg_catalog.sum(pg_catalog.pg_stat_get_live_tuples(oid)), 0)::int8,
       coalesce(pg_catalog.sum(pg_catalog.pg_stat_get_dead_tuples(oid)), 0)::int8,
       pg_catalog.max(greatest(pg_catalog.pg_stat_get_last_autovacuum_time(oid),
                               pg_catalog.pg_stat_get_last_vacuum_time(oid))),
       coalesce(pg_catalog.sum(pg_catalog.pg_total_relation_size(oid)), 0)::int8,
       pg_catalog.max(upper),
       (extract(epoch FROM pg_catalog.now()) * 1000)::int8
FROM partitions
