-- Rate limits shared by every replica (issue 28; `src/server/shared_limit.rs`): one GCRA
-- token bucket per key (`agent:NAME`, `login-address:ADDRESS`, …), held as its theoretical
-- arrival time `tat` in microseconds since the epoch on the database's clock. A bucket whose
-- `tat` has passed is full, as if it had no row, so old rows can be deleted at any time (each
-- replica deletes those a minute old). UNLOGGED: no write-ahead log, so its updates cost no
-- fsync; a crash empties it, which only refills every bucket.
CREATE UNLOGGED TABLE rate_buckets (
    key TEXT PRIMARY KEY,
    tat BIGINT NOT NULL
);
