-- Rollouts in waves: the plan a request's runners run in (its waves in order and the pause
-- between them, JSON), fixed when the request is made and part of the statement people sign.
-- NULL for every request made before: those ran on all their runners at once.
ALTER TABLE approvals ADD COLUMN plan TEXT;
