-- Approvals signed by people: the statement a request's approvers sign, when its runners check
-- people's signatures (NULL for requests that need none, and for every request made before).
ALTER TABLE approvals ADD COLUMN statement TEXT;
