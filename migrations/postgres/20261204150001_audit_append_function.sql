-- One audit append in one round trip (issue 28; `src/server/audit/store.rs`).
--
-- An append was three round trips: `BEGIN; SELECT pg_advisory_xact_lock(…)`, the INSERT, and
-- `COMMIT`, each of which wakes the database and the server in turn, with the append lock held
-- across the last two. Called as a statement of its own (an implicit transaction, committed
-- when the statement ends), this function takes the same lock, checks that the last event is
-- still the one the batch was chained after, and inserts the events and the tree nodes they
-- complete: one round trip, the lock held for one statement. Called inside a transaction (the
-- slow path, which read the last event under the lock), it does the same within it; the lock
-- is re-entrant.
--
-- The statements inside a VOLATILE function each take their own snapshot (READ COMMITTED), so
-- the check below sees every batch committed before the lock was granted, as the statement
-- after `BEGIN; SELECT pg_advisory_xact_lock(…)` did.
--
-- Returns false, having inserted nothing, when `after_seq` is given and is not (with
-- `after_hash`) the last event: another replica appended since.
CREATE FUNCTION emisar_audit_append(
    seqs BIGINT[], ids TEXT[], batch_at TIMESTAMPTZ, actors TEXT[], kinds TEXT[],
    tools TEXT[], runners TEXT[], argss TEXT[], reasons TEXT[], call_ids TEXT[],
    approval_ids TEXT[], outcomes TEXT[], result_digests TEXT[], details TEXT[],
    prev_hashes TEXT[], hashes TEXT[], batch_hash_v SMALLINT,
    node_levels SMALLINT[], node_idxs BIGINT[], node_hashes BYTEA[],
    after_seq BIGINT, after_hash TEXT
) RETURNS BOOLEAN
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    -- The append lock (`src/server/audit/lock.rs`): "emisar" in ASCII.
    PERFORM pg_advisory_xact_lock(111520595009906);
    IF after_seq IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM (SELECT seq, hash FROM audit_events ORDER BY seq DESC LIMIT 1) AS last
        WHERE last.seq = after_seq AND last.hash = after_hash
    ) THEN
        RETURN FALSE;
    END IF;
    INSERT INTO audit_events (seq, id, at, actor, kind, tool, runner, args, reason, call_id,
                              approval_id, outcome, result_digest, detail, prev_hash, hash, hash_v)
    SELECT t.seq, t.id, batch_at, t.actor, t.kind, t.tool, t.runner, t.args, t.reason, t.call_id,
           t.approval_id, t.outcome, t.result_digest, t.detail, t.prev_hash, t.hash, batch_hash_v
    FROM UNNEST(seqs, ids, actors, kinds, tools, runners, argss, reasons, call_ids, approval_ids,
                outcomes, result_digests, details, prev_hashes, hashes)
        AS t(seq, id, actor, kind, tool, runner, args, reason, call_id, approval_id, outcome,
             result_digest, detail, prev_hash, hash);
    INSERT INTO audit_tree (level, idx, hash)
    SELECT * FROM UNNEST(node_levels, node_idxs, node_hashes);
    RETURN TRUE;
END
$$;
