-- The audit log as a transparency log: see the PostgreSQL migration of the same name.
CREATE TABLE audit_tree (
    level INTEGER NOT NULL CHECK (level >= 0 AND level < 64),
    idx   INTEGER NOT NULL CHECK (idx >= 0),
    hash  BLOB NOT NULL CHECK (length(hash) = 32),
    PRIMARY KEY (level, idx)
) WITHOUT ROWID;
CREATE TABLE audit_checkpoints (
    size    INTEGER PRIMARY KEY CHECK (size >= 0),
    note    TEXT NOT NULL,
    made_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE TABLE audit_cosignatures (
    size    INTEGER NOT NULL REFERENCES audit_checkpoints (size),
    witness TEXT NOT NULL,
    line    TEXT NOT NULL,
    at      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (size, witness)
);
CREATE TRIGGER audit_tree_no_update BEFORE UPDATE ON audit_tree
BEGIN
    SELECT RAISE(ABORT, 'audit_tree is append-only: UPDATE refused');
END;
CREATE TRIGGER audit_tree_no_delete BEFORE DELETE ON audit_tree
BEGIN
    SELECT RAISE(ABORT, 'audit_tree is append-only: DELETE refused');
END;
CREATE TRIGGER audit_checkpoints_no_update BEFORE UPDATE ON audit_checkpoints
BEGIN
    SELECT RAISE(ABORT, 'audit_checkpoints is append-only: UPDATE refused');
END;
CREATE TRIGGER audit_checkpoints_no_delete BEFORE DELETE ON audit_checkpoints
BEGIN
    SELECT RAISE(ABORT, 'audit_checkpoints is append-only: DELETE refused');
END;
CREATE TRIGGER audit_cosignatures_no_update BEFORE UPDATE ON audit_cosignatures
BEGIN
    SELECT RAISE(ABORT, 'audit_cosignatures is append-only: UPDATE refused');
END;
CREATE TRIGGER audit_cosignatures_no_delete BEFORE DELETE ON audit_cosignatures
BEGIN
    SELECT RAISE(ABORT, 'audit_cosignatures is append-only: DELETE refused');
END;
