-- Grants (issue 47): people's signed, time-boxed mandate for an agent's writes. One row per
-- grant: its canonical text (`emisar-grant/v1`, what people sign), its status (requested →
-- active once enough people signed → revoked or expired) and the signatures, each verified
-- against the approvers file before it is stored. How many calls ran under a grant is not
-- kept here: it is counted from the audit log's `grant.used` events, which no one rewrites.
CREATE TABLE grants (
    id             TEXT PRIMARY KEY,
    agent          TEXT NOT NULL,
    requester_name TEXT NOT NULL,
    on_behalf_of   TEXT,
    text           TEXT NOT NULL,
    status         TEXT NOT NULL CHECK (status IN ('requested', 'active', 'revoked', 'expired')),
    required       INTEGER NOT NULL,
    signatures     TEXT NOT NULL,
    break_glass    BOOLEAN NOT NULL DEFAULT FALSE,
    expires_at     TEXT NOT NULL,
    requested_at   TEXT NOT NULL,
    decided_at     TEXT,
    decided_by     TEXT,
    revoked_at     TEXT,
    revoked_by     TEXT,
    revoke_reason  TEXT
);
CREATE INDEX grants_agent ON grants (agent, status);
CREATE INDEX grants_status ON grants (status, expires_at);
-- The uses of a grant, counted from the log.
CREATE INDEX audit_events_grant ON audit_events (json_extract(detail, '$.grant')) WHERE kind LIKE 'grant.%';
