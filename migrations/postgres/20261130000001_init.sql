-- The audit log: append-only and hash-chained. `seq` is assigned by the single writer under
-- an advisory lock (not a sequence), so the chain has no gaps and replicas interleave safely.
CREATE TABLE audit_events (
    seq           BIGINT PRIMARY KEY,
    id            TEXT NOT NULL UNIQUE,
    at            TIMESTAMPTZ NOT NULL,
    actor         TEXT NOT NULL,
    kind          TEXT NOT NULL,
    tool          TEXT,
    runner        TEXT,
    args          JSONB,
    reason        TEXT,
    call_id       TEXT,
    approval_id   TEXT,
    outcome       TEXT,
    result_digest TEXT,
    detail        JSONB,
    prev_hash     TEXT NOT NULL,
    hash          TEXT NOT NULL
);
CREATE INDEX audit_events_at ON audit_events (at);
CREATE INDEX audit_events_tool ON audit_events (tool, seq);
CREATE INDEX audit_events_runner ON audit_events (runner, seq);
CREATE INDEX audit_events_actor ON audit_events (actor, seq);
CREATE INDEX audit_events_call ON audit_events (call_id);

CREATE FUNCTION audit_events_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_events is append-only: % refused', TG_OP;
END
$$;
CREATE TRIGGER audit_events_no_update_delete BEFORE UPDATE OR DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_refuse_change();
CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON audit_events
    FOR EACH STATEMENT EXECUTE FUNCTION audit_events_refuse_change();

-- Agent bearer tokens. Only the SHA-256 of a token is stored (tokens are 256-bit random, so a
-- fast hash is enough; passwords, which are guessable, will use argon2).
CREATE TABLE agent_tokens (
    id         TEXT PRIMARY KEY,
    agent      TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    created_at TIMESTAMPTZ NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    revoked_at TIMESTAMPTZ
);
