-- Statements that set up a worker's own connections to a store.

-- name: listen
-- The workers' wake-ups: writers notify this channel with a lane, or '' for every lane.
LISTEN {channel}
