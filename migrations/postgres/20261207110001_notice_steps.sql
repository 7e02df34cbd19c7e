-- Notices (src/server/notices): each step of a request's notice schedule (the first group,
-- each escalation, each reminder, the expiry) is claimed here before it is sent. The primary
-- key makes the claim unique: of two replicas that find the same step due, one inserts the
-- row and sends, the other inserts nothing and sends nothing.
CREATE TABLE notice_steps (
    approval_id TEXT NOT NULL REFERENCES approvals (id),
    step        TEXT NOT NULL,
    claimed_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (approval_id, step)
);
