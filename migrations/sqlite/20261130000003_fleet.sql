ALTER TABLE agent_tokens ADD COLUMN selector TEXT;

CREATE TABLE join_tokens (
    id         TEXT PRIMARY KEY,
    token_hash TEXT NOT NULL UNIQUE,
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    revoked_at TEXT
);

CREATE TABLE runners (
    name              TEXT PRIMARY KEY,
    url               TEXT NOT NULL,
    labels            TEXT NOT NULL,
    packs             TEXT NOT NULL,
    runner_token_hash TEXT NOT NULL UNIQUE,
    joined_at         TEXT NOT NULL,
    last_heartbeat    TEXT
);
