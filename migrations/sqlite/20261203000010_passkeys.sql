-- Passkeys (WebAuthn) people register in the portal to sign approvals. A person is a local
-- user or a provider person (`person:<claim>`, who has no `users` row), so `user_name` is
-- not a foreign key. A credential id belongs to one passkey of one person: the runners
-- count people by their keys, so two rows must never share one.
CREATE TABLE passkeys (
    id            TEXT PRIMARY KEY,
    user_name     TEXT NOT NULL,
    -- base64url (no padding), as the browser's rawId and approvers files write it.
    credential_id TEXT NOT NULL UNIQUE,
    -- ES256 or EdDSA.
    alg           TEXT NOT NULL,
    -- SubjectPublicKeyInfo DER, standard base64.
    public_key    TEXT NOT NULL,
    name          TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    last_used_at  TEXT
);
CREATE INDEX passkeys_user ON passkeys (user_name);

-- A registration under way: the challenge the server chose for one portal session (or API
-- token), single use, for a few minutes. One per session; starting again replaces it.
CREATE TABLE passkey_challenges (
    owner      TEXT PRIMARY KEY,
    user_name  TEXT NOT NULL,
    challenge  TEXT NOT NULL,
    expires_at TEXT NOT NULL
);
