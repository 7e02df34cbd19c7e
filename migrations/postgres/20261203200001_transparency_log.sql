-- The audit log as a transparency log (RFC 6962 / RFC 9162): the Merkle tree over the events,
-- kept as its complete subtrees. Leaf `idx` of level 0 is event `seq = idx + 1`, its hash
-- SHA-256(0x00 ‖ the event's 32-byte chain hash); a subtree of level L is written when its
-- last leaf is appended, in the same transaction as the events, and never changes. Events
-- written before this migration are folded in by the next append (or `emisar migrate`).
CREATE TABLE audit_tree (
    level SMALLINT NOT NULL CHECK (level >= 0 AND level < 64),
    idx   BIGINT NOT NULL CHECK (idx >= 0),
    hash  BYTEA NOT NULL CHECK (length(hash) = 32),
    PRIMARY KEY (level, idx)
);

-- Checkpoints (C2SP tlog-checkpoint signed notes, signed by the log key) and the
-- cosignatures witnesses returned for them (one `— name base64` line each).
CREATE TABLE audit_checkpoints (
    size    BIGINT PRIMARY KEY CHECK (size >= 0),
    note    TEXT NOT NULL,
    made_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE TABLE audit_cosignatures (
    size    BIGINT NOT NULL REFERENCES audit_checkpoints (size),
    witness TEXT NOT NULL,
    line    TEXT NOT NULL,
    at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (size, witness)
);

CREATE FUNCTION transparency_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP;
END
$$;
CREATE TRIGGER audit_tree_no_update_delete BEFORE UPDATE OR DELETE ON audit_tree
    FOR EACH ROW EXECUTE FUNCTION transparency_refuse_change();
CREATE TRIGGER audit_tree_no_truncate BEFORE TRUNCATE ON audit_tree
    FOR EACH STATEMENT EXECUTE FUNCTION transparency_refuse_change();
CREATE TRIGGER audit_checkpoints_no_update_delete BEFORE UPDATE OR DELETE ON audit_checkpoints
    FOR EACH ROW EXECUTE FUNCTION transparency_refuse_change();
CREATE TRIGGER audit_checkpoints_no_truncate BEFORE TRUNCATE ON audit_checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION transparency_refuse_change();
CREATE TRIGGER audit_cosignatures_no_update_delete BEFORE UPDATE OR DELETE ON audit_cosignatures
    FOR EACH ROW EXECUTE FUNCTION transparency_refuse_change();
CREATE TRIGGER audit_cosignatures_no_truncate BEFORE TRUNCATE ON audit_cosignatures
    FOR EACH STATEMENT EXECUTE FUNCTION transparency_refuse_change();
