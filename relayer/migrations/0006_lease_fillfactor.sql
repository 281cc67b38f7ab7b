-- 0006 lease fillfactor: half of every page of the lease table is left free. A lease row is
-- rewritten each time a member takes, renews or releases its lane (every batch that finds a
-- lease past half its life, every heartbeat of a member row), and on a full page each rewrite
-- puts the new row version on another page and adds an entry to both of the table's indexes.
-- With room on its own page the rewrite is a heap-only update: no index entry, less WAL, and
-- no index bloat. The lane rows a store is given later are written with the room; rows already
-- on full pages move to pages with room on their next rewrite.
-- Placeholders in braces are identifiers composed with psycopg.sql.Identifier.

ALTER TABLE {leases} SET (fillfactor = 50);
