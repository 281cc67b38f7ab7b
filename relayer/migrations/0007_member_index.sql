-- 0007 member index: the member rows of the lease table (lane IS NULL: one per live or
-- recently live member) are found through an index of their own, not by reading every lane's
-- lease row. Each heartbeat renews its member, drops expired members and counts the live ones;
-- with 65,536 lanes each of those reads went through 65,536 lane rows (about 10 ms each). The
-- index holds only the member rows and only their names, which a lease take or renewal never
-- changes, so the lane rows' rewrites stay heap-only updates.
-- Placeholders in braces are identifiers composed with psycopg.sql.Identifier.

CREATE INDEX {leases_members} ON {leases} (name) WHERE lane IS NULL;
