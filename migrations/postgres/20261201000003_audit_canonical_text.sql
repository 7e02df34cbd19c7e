-- The audit chain hashes exactly the text that is stored. JSONB normalises what it stores
-- (`-0.0` becomes `0`, large and long numbers are rewritten, `\u0000` is refused), so a stored
-- event could re-hash differently from how it was hashed when written. `args` and `detail`
-- now hold the canonical JSON text itself, byte for byte what was hashed.
--
-- `hash_v` says how a row was hashed: 1 for rows written before this migration (their JSON is
-- re-canonicalised from the stored text to verify them, as before) and for any writer that
-- does not set it; the current writer sets 2 (the stored text is hashed as is).
ALTER TABLE audit_events
    ALTER COLUMN args TYPE TEXT USING args::text,
    ALTER COLUMN detail TYPE TEXT USING detail::text,
    ADD COLUMN hash_v SMALLINT NOT NULL DEFAULT 1;
