-- Searches on two columns at once. With one index per column, "tool X on runner Y" walked the
-- tool's index and read each event until 100 also matched the runner: 12-24 ms p95 at
-- 1,000,000 events, and unbounded when the pair is rare. These two cover the pairs operators
-- ask for (what ran on a node with a tool; what an agent did with a tool) and bound those
-- pages to one index range. Each costs every append one more index entry (~13 % more insert
-- time in a bulk measurement); other pairs still combine the single-column indexes.
CREATE INDEX audit_events_tool_runner ON audit_events (tool, runner, seq);
CREATE INDEX audit_events_actor_tool ON audit_events (actor, tool, seq);
