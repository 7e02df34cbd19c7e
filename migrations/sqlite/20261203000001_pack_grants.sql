-- A join token grants packs the way it grants labels: a runner that joins with it serves
-- only the packs it announced AND the token grants. Tokens issued before this grant none
-- (they were never reviewed for packs); runners joined before keep what they announced,
-- recorded as their grant, so an upgrade does not take packs away from a running fleet
-- (`emisar runner list` shows them; remove and re-join to narrow them).
ALTER TABLE join_tokens ADD COLUMN packs TEXT NOT NULL DEFAULT '[]';
-- What a joined runner may serve, fixed when it joined: a re-registration may announce
-- fewer or other packs, but serves only those inside this grant.
ALTER TABLE runners ADD COLUMN granted_packs TEXT;
UPDATE runners SET granted_packs = packs;
