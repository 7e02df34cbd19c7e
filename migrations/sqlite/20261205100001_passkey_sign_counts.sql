-- The last signature counter (WebAuthn `signCount`) the server accepted from each passkey
-- credential, so that an assertion whose counter does not grow (a cloned authenticator) is
-- refused (WebAuthn L3 §7.2). Keyed by the credential, not by a row of `passkeys`: an
-- approvers file may name passkeys registered elsewhere, and a counter outlives the removal
-- of its passkey. Authenticators that keep no counter (they report 0) have no row.
CREATE TABLE passkey_sign_counts (
    -- base64url (no padding), as `passkeys.credential_id` and approvers files write it.
    credential_id TEXT PRIMARY KEY,
    sign_count    INTEGER NOT NULL,
    updated_at    TEXT NOT NULL
);
