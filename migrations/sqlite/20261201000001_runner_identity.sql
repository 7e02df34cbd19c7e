ALTER TABLE join_tokens ADD COLUMN max_uses INTEGER NOT NULL DEFAULT 1 CHECK (max_uses >= 1);
ALTER TABLE join_tokens ADD COLUMN uses INTEGER NOT NULL DEFAULT 0 CHECK (uses >= 0 AND uses <= max_uses);
ALTER TABLE join_tokens ADD COLUMN runner_name TEXT;
ALTER TABLE join_tokens ADD COLUMN name_pattern TEXT CHECK (runner_name IS NULL OR name_pattern IS NULL);
ALTER TABLE join_tokens ADD COLUMN labels TEXT NOT NULL DEFAULT '{}';

UPDATE join_tokens SET revoked_at = strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') WHERE revoked_at IS NULL;

ALTER TABLE runners ADD COLUMN join_token_id TEXT;
