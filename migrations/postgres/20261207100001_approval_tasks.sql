-- MCP Tasks (SEP-2663): a call that waits for people, answered with a task instead of held
-- open. One task per approval request; its state is the request's, read from `approvals`,
-- so any replica answers `tasks/get`. Only the SHA-256 of the task id is stored, and the
-- task belongs to the caller that made it (`owner`: the audit actor, and the person an
-- OAuth agent acts for).
CREATE TABLE approval_tasks (
    id_sha256   TEXT PRIMARY KEY,
    approval_id TEXT NOT NULL UNIQUE REFERENCES approvals (id),
    owner       TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL
);
