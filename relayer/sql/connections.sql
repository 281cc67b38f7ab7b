-- Statements that set up a worker's own connections to a store.

-- name: listen
-- The workers' wake-ups: writers notify this channel with a lane, or '' for every lane.
LISTEN {channel}

-- name: unlisten
-- A store that leaves a running worker whose other stores of the database keep listening.
UNLISTEN {channel}

-- name: set_local
-- Behind a transaction pooler, the settings a transaction needs, for that transaction only
-- (a session SET would stay on a server connection other clients get next).
SELECT pg_catalog.set_config(s.name, s.value, true)
FROM ROWS FROM (pg_catalog.unnest(%(names)s::text[]), pg_catalog.unnest(%(values)s::text[]))
    AS s(name, value)
