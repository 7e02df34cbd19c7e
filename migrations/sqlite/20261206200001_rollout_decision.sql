-- People's decision on a halted rollout (resume, retry or abort), signed like an approval:
-- the latest one of the request, JSON, while it gathers votes and once taken. NULL until a
-- rollout halts and someone proposes one; the audit log keeps every decision.
ALTER TABLE approvals ADD COLUMN decision TEXT;
