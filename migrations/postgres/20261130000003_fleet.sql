-- A token may be limited to the runners a label selector matches (NULL: all runners).
ALTER TABLE agent_tokens ADD COLUMN selector TEXT;

-- One-time-issued join tokens let runners register themselves (`emisar runner --join-token`).
CREATE TABLE join_tokens (
    id         TEXT PRIMARY KEY,
    token_hash TEXT NOT NULL UNIQUE,
    created_at TIMESTAMPTZ NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    revoked_at TIMESTAMPTZ
);

-- Runners that joined. `runner_token_hash` authenticates their heartbeats; every replica
-- reads this table, so a runner that joined through one replica is known to all.
CREATE TABLE runners (
    name              TEXT PRIMARY KEY,
    url               TEXT NOT NULL,
    labels            JSONB NOT NULL,
    packs             JSONB NOT NULL,
    runner_token_hash TEXT NOT NULL UNIQUE,
    joined_at         TIMESTAMPTZ NOT NULL,
    last_heartbeat    TIMESTAMPTZ
);
