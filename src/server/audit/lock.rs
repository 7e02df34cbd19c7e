//! The append lock: the one PostgreSQL advisory lock that every writer of the audit log takes,
//! the store's appends and the tree's folding alike, so that one chain and one tree grow in
//! one order across every `emisar serve` replica.

/// Opens a transaction holding the advisory lock that serializes appends across every
/// `emisar serve` replica, in one round trip (a simple query of two statements): the append
/// that must read the last event first, and the tree's folding. The key is 0x656d_6973_6172,
/// "emisar" in ASCII; replicas of every version must share it, and the append function
/// (migration `20261204150001_audit_append_function.sql`, the common case) takes the same
/// key. The last event is read by the next statement, whose snapshot (READ COMMITTED: one per
/// statement) is taken after the lock is granted, so it sees every batch committed before.
pub(super) const PG_BEGIN_LOCKED: &str = "BEGIN; SELECT pg_advisory_xact_lock(111520595009906)";
