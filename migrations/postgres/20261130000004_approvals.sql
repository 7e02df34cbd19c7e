-- Approval requests for risk:high (and policy-raised) calls. The row is the request's state;
-- every transition is also an audit event. `args` is what runners will receive, `shown_args`
-- what humans and the audit log see (secret params sealed).
CREATE TABLE approvals (
    id                 TEXT PRIMARY KEY,
    call_id            TEXT NOT NULL,
    tool               TEXT NOT NULL,
    risk               TEXT NOT NULL,
    args               JSONB NOT NULL,
    shown_args         JSONB NOT NULL,
    runners            JSONB NOT NULL,
    runner_chosen      BOOLEAN NOT NULL,
    raw                BOOLEAN NOT NULL,
    reason             TEXT NOT NULL,
    requester          TEXT NOT NULL,
    requester_name     TEXT NOT NULL,
    pack_sha256        TEXT NOT NULL,
    preview            JSONB,
    required_approvals INTEGER NOT NULL,
    approvals          JSONB NOT NULL,
    state              TEXT NOT NULL,
    note               TEXT,
    decided_by         TEXT,
    result             JSONB,
    created_at         TIMESTAMPTZ NOT NULL,
    expires_at         TIMESTAMPTZ NOT NULL,
    updated_at         TIMESTAMPTZ NOT NULL
);
CREATE INDEX approvals_state ON approvals (state, created_at);

-- Humans: local users with argon2 password hashes, and their portal sessions.
CREATE TABLE users (
    name          TEXT PRIMARY KEY,
    role          TEXT NOT NULL,
    password_hash TEXT NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL
);

-- Only the SHA-256 of a session id is stored; the CSRF token is per session.
CREATE TABLE sessions (
    id_hash    TEXT PRIMARY KEY,
    user_name  TEXT NOT NULL REFERENCES users (name),
    csrf_token TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
