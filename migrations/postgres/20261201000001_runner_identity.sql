-- A join token allows a stated number of joins (one unless issued with more), and may bind
-- the runner that joins with it to a name or a name pattern and to the labels it grants.
-- A join consumes a use with one guarded UPDATE, so two joins can never share the last one.
ALTER TABLE join_tokens ADD COLUMN max_uses INTEGER NOT NULL DEFAULT 1 CHECK (max_uses >= 1);
ALTER TABLE join_tokens ADD COLUMN uses INTEGER NOT NULL DEFAULT 0 CHECK (uses >= 0 AND uses <= max_uses);
ALTER TABLE join_tokens ADD COLUMN runner_name TEXT;
ALTER TABLE join_tokens ADD COLUMN name_pattern TEXT CHECK (runner_name IS NULL OR name_pattern IS NULL);
ALTER TABLE join_tokens ADD COLUMN labels JSONB NOT NULL DEFAULT '{}';

-- Tokens issued before this could be presented any number of times under any name, and carry
-- no fingerprint of the server, which runners now require: none of them may join again.
UPDATE join_tokens SET revoked_at = now() WHERE revoked_at IS NULL;

-- Which join token a runner joined with (for `emisar runner list` and the audit trail).
ALTER TABLE runners ADD COLUMN join_token_id TEXT;
