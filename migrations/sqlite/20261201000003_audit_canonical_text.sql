-- How a row was hashed (see the PostgreSQL migration): 1 for rows written before this
-- migration, whose JSON columns are re-canonicalised to verify them; the current writer sets
-- 2, the stored canonical text hashed as is. SQLite always stored the JSON as text.
ALTER TABLE audit_events ADD COLUMN hash_v INTEGER NOT NULL DEFAULT 1;
