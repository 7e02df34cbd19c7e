-- People signed in through the organisation's OpenID provider have no row in `users` (the
-- provider holds their account): each sign-in is a row here, with the roles their groups
-- granted at that sign-in (space-separated, possibly none). Only the SHA-256 of the session
-- id is stored. `provider_session` is the provider's `sid`, which its back-channel logout
-- names.
CREATE TABLE provider_sessions (
    id_hash          TEXT PRIMARY KEY,
    identity         TEXT NOT NULL,
    display_name     TEXT NOT NULL,
    roles            TEXT NOT NULL,
    csrf_token       TEXT NOT NULL,
    issuer           TEXT NOT NULL,
    subject          TEXT NOT NULL,
    provider_session TEXT,
    created_at       TEXT NOT NULL,
    expires_at       TEXT NOT NULL
);
CREATE INDEX provider_sessions_identity ON provider_sessions (identity);
CREATE INDEX provider_sessions_subject ON provider_sessions (issuer, subject);

-- The person an OAuth agent acted for when it asked (`person:<id>`): they may not approve.
ALTER TABLE approvals ADD COLUMN on_behalf_of TEXT;
