-- Break-glass reviews (issue 47): people's signed review of a break-glass window after the
-- incident (`emisar-review/v1`). One row per window: the review's text, the signatures so far
-- (each verified against the approvers file before it is stored), and `reviewed` once enough
-- people signed. A window's state is never read from here: the `break_glass.reviewed` audit
-- event is what makes it reviewed (src/server/break_glass/), so deleting or editing a row
-- makes no window look reviewed.
CREATE TABLE break_glass_reviews (
    window_id   TEXT PRIMARY KEY,
    text        TEXT NOT NULL,
    signatures  TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('signing', 'reviewed')),
    proposed_by TEXT NOT NULL,
    proposed_at TEXT NOT NULL,
    reviewed_at TEXT
);
