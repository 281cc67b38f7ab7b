-- 0003 inbox and sequences: consumer-side deduplication, and optional per-key sequence numbers.
-- Placeholders in braces are identifiers composed with psycopg.sql.Identifier.

-- One row per message a consumer processed, inserted in the consumer's own transaction, so a
-- redelivery of the same message id is recognised. Rows older than inbox_retention are deleted.
CREATE TABLE {inbox} (
    consumer text NOT NULL CHECK (length(consumer) BETWEEN 1 AND 200),
    message_id uuid NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX {inbox_received} ON {inbox} (received_at);

-- Per consumer and ordering key, the highest sequence number claimed so far: what gaps and
-- late arrivals are measured against. Expires with the inbox entries (inbox_retention).
CREATE TABLE {inbox_keys} (
    consumer text NOT NULL,
    ordering_key text NOT NULL,
    last_sequence bigint NOT NULL CHECK (last_sequence >= 1),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, ordering_key)
);
CREATE INDEX {inbox_keys_updated} ON {inbox_keys} (updated_at);

-- Writer side (sequence_numbers = true): the last number stamped per ordering key. Writers of a
-- key lock its row until they commit, so numbers are gapless and follow commit order.
CREATE TABLE {sequences} (
    ordering_key text PRIMARY KEY,
    last_sequence bigint NOT NULL CHECK (last_sequence >= 1),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX {sequences_updated} ON {sequences} (updated_at);
