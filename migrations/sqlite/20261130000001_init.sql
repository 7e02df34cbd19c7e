-- The audit log: append-only and hash-chained (see the PostgreSQL migration for the design).
CREATE TABLE audit_events (
    seq           INTEGER PRIMARY KEY,
    id            TEXT NOT NULL UNIQUE,
    at            TEXT NOT NULL,
    actor         TEXT NOT NULL,
    kind          TEXT NOT NULL,
    tool          TEXT,
    runner        TEXT,
    args          TEXT,
    reason        TEXT,
    call_id       TEXT,
    approval_id   TEXT,
    outcome       TEXT,
    result_digest TEXT,
    detail        TEXT,
    prev_hash     TEXT NOT NULL,
    hash          TEXT NOT NULL
);
CREATE INDEX audit_events_at ON audit_events (at);
CREATE INDEX audit_events_tool ON audit_events (tool, seq);
CREATE INDEX audit_events_runner ON audit_events (runner, seq);
CREATE INDEX audit_events_actor ON audit_events (actor, seq);
CREATE INDEX audit_events_call ON audit_events (call_id);

CREATE TRIGGER audit_events_no_update BEFORE UPDATE ON audit_events
BEGIN
    SELECT RAISE(ABORT, 'audit_events is append-only: UPDATE refused');
END;
CREATE TRIGGER audit_events_no_delete BEFORE DELETE ON audit_events
BEGIN
    SELECT RAISE(ABORT, 'audit_events is append-only: DELETE refused');
END;

CREATE TABLE agent_tokens (
    id         TEXT PRIMARY KEY,
    agent      TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    revoked_at TEXT
);
