-- The hub's append-only event ledger (PostgreSQL). Mirrors ../sqlite/0001_ledger_events.sql.
CREATE TABLE ledger_events (
    id                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at_micros         BIGINT NOT NULL, -- UTC, microseconds since the Unix epoch
    kind              TEXT   NOT NULL,
    binding_namespace TEXT,
    binding_name      TEXT,
    binding_uid       TEXT,
    cluster           TEXT,
    from_state        TEXT,
    to_state          TEXT,
    reason            TEXT,
    class             TEXT,
    details           JSONB  NOT NULL DEFAULT '{}'::jsonb -- a JSON object
);

-- "History of binding X": equality on (namespace, name), ordered by (at_micros, id).
CREATE INDEX ledger_events_binding
    ON ledger_events (binding_namespace, binding_name, at_micros, id);

-- "What happened on cluster Y since T": equality on cluster, range and order on (at_micros, id).
CREATE INDEX ledger_events_cluster
    ON ledger_events (cluster, at_micros, id);

-- Append-only: a record, once written, is never changed or removed by the hub.
CREATE FUNCTION ledger_events_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger_events is append-only: % refused', TG_OP;
END;
$$;

CREATE TRIGGER ledger_events_no_update_or_delete
    BEFORE UPDATE OR DELETE ON ledger_events
    FOR EACH ROW EXECUTE FUNCTION ledger_events_append_only();

CREATE TRIGGER ledger_events_no_truncate
    BEFORE TRUNCATE ON ledger_events
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_events_append_only();
