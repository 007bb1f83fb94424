-- The hub's append-only event ledger (SQLite). Mirrors ../postgres/0001_ledger_events.sql.
--
-- `id` is the rowid: with UPDATE and DELETE refused below, max(rowid) never goes down, so ids
-- increase in write order without AUTOINCREMENT's extra bookkeeping on every insert.
CREATE TABLE ledger_events (
    id                INTEGER PRIMARY KEY,
    at_micros         INTEGER NOT NULL, -- UTC, microseconds since the Unix epoch
    kind              TEXT    NOT NULL,
    binding_namespace TEXT,
    binding_name      TEXT,
    binding_uid       TEXT,
    cluster           TEXT,
    from_state        TEXT,
    to_state          TEXT,
    reason            TEXT,
    class             TEXT,
    details           TEXT    NOT NULL DEFAULT '{}' -- a JSON object
);

-- "History of binding X": equality on (namespace, name), ordered by (at_micros, id).
CREATE INDEX ledger_events_binding
    ON ledger_events (binding_namespace, binding_name, at_micros, id);

-- "What happened on cluster Y since T": equality on cluster, range and order on (at_micros, id).
CREATE INDEX ledger_events_cluster
    ON ledger_events (cluster, at_micros, id);

-- Append-only: a record, once written, is never changed or removed by the hub.
CREATE TRIGGER ledger_events_no_update BEFORE UPDATE ON ledger_events
BEGIN
    SELECT RAISE(ABORT, 'ledger_events is append-only: UPDATE refused');
END;

CREATE TRIGGER ledger_events_no_delete BEFORE DELETE ON ledger_events
BEGIN
    SELECT RAISE(ABORT, 'ledger_events is append-only: DELETE refused');
END;
