-- Tokens carry a role: `agent` tokens call tools over MCP, `auditor` tokens read the audit
-- log over the HTTP API. Neither can do the other's job.
ALTER TABLE agent_tokens ADD COLUMN role TEXT NOT NULL DEFAULT 'agent';
CREATE INDEX audit_events_kind ON audit_events (kind, seq);
CREATE INDEX audit_events_approval ON audit_events (approval_id) WHERE approval_id IS NOT NULL;
