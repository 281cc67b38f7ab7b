-- 0005 claim function: the dispatch layer's claim logic (relayer.dispatch.postgres) as a
-- function of the store's schema, so a worker needs no TEMP privilege and creates nothing per
-- connection (which transaction-pooling proxies would not keep). It reads no table: the calling
-- statement passes the pause flags and limits. Its name carries a version (claim_slots_v1): a
-- relayer that changes the logic adds a function of a new name in a later migration, so workers
-- of both versions run side by side during a rolling upgrade.
CREATE OR REPLACE FUNCTION {claim_slots}(
    all_paused boolean,
    is_paused boolean[],
    limits integer[],
    lock_keys integer[],
    wanted integer[],
    budget integer,
    held_keys integer[],
    held_slots integer[],
    release_keys integer[],
    release_slots integer[]
) RETURNS TABLE (
    wanted_position integer,
    queue_position integer,
    granted_slot integer,
    queue_state text,
    queue_limit integer
)
LANGUAGE plpgsql VOLATILE
-- Name lookups in the body ignore the caller's search_path, so no function or operator of a
-- schema placed ahead of pg_catalog can stand in for a built-in one.
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    queue_count integer := coalesce(pg_catalog.array_length(lock_keys, 1), 0);
    next_slot integer[];
    refused boolean[];
    remaining integer := budget;
    candidate integer;
    slot_number integer;
    found_slot boolean;
BEGIN
    -- Finished jobs first: their slots may be granted again in this same call.
    FOR i IN 1 .. coalesce(pg_catalog.array_length(release_keys, 1), 0) LOOP
        PERFORM pg_catalog.pg_advisory_unlock(release_keys[i], release_slots[i]);
    END LOOP;
    FOR i IN 1 .. queue_count LOOP
        is_paused[i] := all_paused OR is_paused[i];
        next_slot[i] := 0;
        refused[i] := is_paused[i];
    END LOOP;
    -- Walk the planner's order. Every lock taken here is returned as a row (RETURN NEXT), so
    -- nothing is acquired and then dropped on the floor.
    FOR j IN 1 .. coalesce(pg_catalog.array_length(wanted, 1), 0) LOOP
        EXIT WHEN remaining <= 0;
        candidate := wanted[j];
        CONTINUE WHEN refused[candidate];
        found_slot := false;
        slot_number := NULL;
        IF limits[candidate] IS NULL THEN
            found_slot := true;
        ELSE
            WHILE next_slot[candidate] < limits[candidate] LOOP
                slot_number := next_slot[candidate];
                next_slot[candidate] := slot_number + 1;
                -- Nested IFs, not AND: SQL does not promise the order of AND, and a session
                -- that locks a slot it already holds would count it twice.
                IF NOT EXISTS (
                    SELECT 1 FROM ROWS FROM (pg_catalog.unnest(held_keys),
                        pg_catalog.unnest(held_slots)) AS h(lock_key, slot)
                    WHERE h.lock_key = lock_keys[candidate] AND h.slot = slot_number
                ) THEN
                    IF pg_catalog.pg_try_advisory_lock(lock_keys[candidate], slot_number) THEN
                        found_slot := true;
                        EXIT;
                    END IF;
                END IF;
            END LOOP;
        END IF;
        IF found_slot THEN
            wanted_position := j - 1;
            queue_position := candidate - 1;
            granted_slot := slot_number;
            queue_state := 'granted';
            queue_limit := limits[candidate];
            RETURN NEXT;
            remaining := remaining - 1;
        ELSE
            refused[candidate] := true;
        END IF;
    END LOOP;
    FOR i IN 1 .. queue_count LOOP
        wanted_position := NULL;
        queue_position := i - 1;
        granted_slot := NULL;
        queue_state := CASE
            WHEN is_paused[i] THEN 'paused'
            WHEN refused[i] THEN 'full'
            ELSE 'open'
        END;
        queue_limit := limits[i];
        RETURN NEXT;
    END LOOP;
END;
$$;
