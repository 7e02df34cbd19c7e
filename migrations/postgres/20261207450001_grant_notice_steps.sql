-- Notices of grants (src/server/notices/grants.rs): each announcement of a grant (a request to
-- group i, a break-glass window's request, its opening, each call inside it) is claimed here
-- before it is sent, as `notice_steps` does for approval requests (whose rows name an
-- approval, hence a table of their own). The primary key makes the claim unique: of two
-- replicas that find the same announcement due, one inserts the row and sends, the other
-- inserts nothing and sends nothing; a restarted server finds the row and sends nothing again.
CREATE TABLE grant_notice_steps (
    grant_id   TEXT NOT NULL REFERENCES grants (id),
    step       TEXT NOT NULL,
    claimed_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (grant_id, step)
);
