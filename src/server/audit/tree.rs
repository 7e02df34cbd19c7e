//! The audit log's Merkle tree (RFC 6962 / RFC 9162) as stored: `audit_tree` holds every
//! complete subtree, written in the transaction that appends its last event and never
//! changed (see the migration `transparency_log`).
//!
//! Leaf `i` is event `seq = i + 1`; its entry is the event's 32-byte chain hash, which covers
//! every column of the event and the hash before it. `seq` is gapless (the writer assigns it
//! under the append lock), so the tree's size is the last event's `seq`.
//!
//! Invariant: after an append commits, the tree has exactly as many leaves as there are
//! events. Events appended before the tree existed (or by a replica of an older version) are
//! folded in by the next append that finds the tree behind, under the same lock, in order.

use tlog_tiles::Hash;

use crate::protocol::witnessed::event_leaf;
use crate::server::db::{Db, Pool};
use crate::tlog::tree::{self, Frontier, Subtree, SubtreeMap, TreeError};

/// Events folded into the tree per query while catching up.
const FOLD_CHUNK: i64 = 10_000;

fn decode(e: String) -> sqlx::Error {
    sqlx::Error::Decode(e.into())
}

/// `(level, idx) IN (…)` for `nodes`; only integers are formatted into the SQL.
fn nodes_clause(nodes: &[Subtree]) -> String {
    if nodes.is_empty() {
        return "FALSE".into();
    }
    let list: Vec<String> = nodes
        .iter()
        .map(|n| format!("({}, {})", n.level, n.index))
        .collect();
    format!("(level, idx) IN ({})", list.join(", "))
}

/// Rows of `audit_tree` as a map; every node asked must be there.
fn to_map(nodes: &[Subtree], rows: Vec<(i64, i64, Vec<u8>)>) -> Result<SubtreeMap, sqlx::Error> {
    let mut map = SubtreeMap::default();
    for (level, idx, hash) in rows {
        let hash: [u8; 32] = hash
            .try_into()
            .map_err(|_| decode(format!("audit_tree ({level}, {idx}) is not 32 bytes")))?;
        let level = u8::try_from(level).map_err(|_| decode(format!("level {level}")))?;
        map.0.insert(
            Subtree {
                level,
                index: idx as u64,
            },
            Hash(hash),
        );
    }
    if let Some(missing) = nodes.iter().find(|n| !map.0.contains_key(n)) {
        return Err(decode(format!(
            "the audit tree lacks subtree (level {}, index {}): it was not folded in, or rows were removed",
            missing.level, missing.index
        )));
    }
    Ok(map)
}

/// Reads `nodes` (and whatever else) on a PostgreSQL or SQLite connection, the same code for
/// both: `$conn` is either backend's connection.
macro_rules! read_nodes {
    ($conn:expr, $nodes:expr) => {{
        let nodes: &[Subtree] = $nodes;
        let sql = format!(
            "SELECT CAST(level AS BIGINT), idx, hash FROM audit_tree WHERE {}",
            nodes_clause(nodes)
        );
        let rows: Vec<(i64, i64, Vec<u8>)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .fetch_all($conn)
            .await?;
        to_map(nodes, rows)
    }};
}

/// The tree's size as stored: one past its last leaf.
macro_rules! stored_size {
    ($conn:expr) => {{
        let size: Option<i64> =
            sqlx::query_scalar("SELECT MAX(idx) + 1 FROM audit_tree WHERE level = 0")
                .fetch_one($conn)
                .await?;
        size.unwrap_or(0) as u64
    }};
}

/// The rows to insert for `nodes` (subtrees an append completed).
pub(super) struct NewNodes {
    pub levels: Vec<i16>,
    pub indexes: Vec<i64>,
    pub hashes: Vec<Vec<u8>>,
}

impl NewNodes {
    pub(crate) fn with_capacity(n: usize) -> Self {
        NewNodes {
            levels: Vec::with_capacity(n),
            indexes: Vec::with_capacity(n),
            hashes: Vec::with_capacity(n),
        }
    }

    pub(crate) fn extend(&mut self, nodes: Vec<(Subtree, Hash)>) {
        for (s, h) in nodes {
            self.levels.push(i16::from(s.level));
            self.indexes.push(s.index as i64);
            self.hashes.push(h.0.to_vec());
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.levels.is_empty()
    }
}

/// Extends `tree` with the leaves of `hashes` (event chain hashes, in seq order).
pub(super) fn grow<'a>(
    tree: &mut Frontier,
    hashes: impl IntoIterator<Item = &'a str>,
    out: &mut NewNodes,
) -> Result<(), sqlx::Error> {
    for hash in hashes {
        out.extend(tree.push(event_leaf(hash).map_err(decode)?));
    }
    Ok(())
}

const PG_INSERT_NODES: &str = "INSERT INTO audit_tree (level, idx, hash) \
     SELECT * FROM UNNEST($1::smallint[], $2::bigint[], $3::bytea[])";
/// Rows per SQLite INSERT (3 parameters each).
const SQLITE_NODES_PER_INSERT: usize = 5_000;

pub(super) async fn pg_insert_nodes(
    tx: &mut sqlx::PgConnection,
    nodes: &NewNodes,
) -> Result<(), sqlx::Error> {
    if nodes.is_empty() {
        return Ok(());
    }
    sqlx::query(PG_INSERT_NODES)
        .bind(&nodes.levels)
        .bind(&nodes.indexes)
        .bind(&nodes.hashes)
        .execute(tx)
        .await?;
    Ok(())
}

pub(super) async fn sqlite_insert_nodes(
    tx: &mut sqlx::SqliteConnection,
    nodes: &NewNodes,
) -> Result<(), sqlx::Error> {
    let rows: Vec<usize> = (0..nodes.levels.len()).collect();
    for chunk in rows.chunks(SQLITE_NODES_PER_INSERT) {
        // Only placeholders are formatted into the SQL; every value is bound.
        let sql = format!(
            "INSERT INTO audit_tree (level, idx, hash) VALUES {}",
            vec!["(?, ?, ?)"; chunk.len()].join(", ")
        );
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        for &i in chunk {
            q = q
                .bind(nodes.levels[i])
                .bind(nodes.indexes[i])
                .bind(&nodes.hashes[i]);
        }
        q.execute(&mut *tx).await?;
    }
    Ok(())
}

/// The tree as it must stand before events after `last_seq` are appended: read its right
/// edge, and fold in the events it lacks (those written before the tree existed), writing
/// their subtrees. Runs inside the append's transaction, under the append lock.
macro_rules! fold_to {
    ($conn:expr, $last_seq:expr, $insert:path) => {{
        let last_seq: u64 = $last_seq;
        let size = stored_size!(&mut *$conn);
        if size > last_seq {
            return Err(decode(format!(
                "the audit tree has {size} leaves but the log only {last_seq} events"
            )));
        }
        let subtrees = Frontier::subtrees_of(size);
        let map = read_nodes!(&mut *$conn, &subtrees)?;
        let hashes = subtrees.iter().map(|s| map.0[s]).collect();
        let mut tree = Frontier::new(size, hashes).map_err(|e| decode(e.to_string()))?;
        while tree.size() < last_seq {
            let from = tree.size() as i64 + 1;
            let rows: Vec<(i64, String)> = sqlx::query_as(
                "SELECT seq, hash FROM audit_events WHERE seq >= $1 AND seq <= $2 ORDER BY seq",
            )
            .bind(from)
            .bind((from + FOLD_CHUNK - 1).min(last_seq as i64))
            .fetch_all(&mut *$conn)
            .await?;
            if rows.first().map(|r| r.0) != Some(from)
                || rows.windows(2).any(|w| w[1].0 != w[0].0 + 1)
            {
                return Err(decode(format!(
                    "audit events from seq {from} are not contiguous: the tree cannot be folded in"
                )));
            }
            let mut nodes = NewNodes::with_capacity(rows.len() * 2);
            grow(&mut tree, rows.iter().map(|r| r.1.as_str()), &mut nodes)?;
            $insert(&mut *$conn, &nodes).await?;
        }
        Ok::<Frontier, sqlx::Error>(tree)
    }};
}

pub(super) async fn pg_fold(
    tx: &mut sqlx::PgConnection,
    last_seq: u64,
) -> Result<Frontier, sqlx::Error> {
    fold_to!(tx, last_seq, pg_insert_nodes)
}

pub(super) async fn sqlite_fold(
    tx: &mut sqlx::SqliteConnection,
    last_seq: u64,
) -> Result<Frontier, sqlx::Error> {
    fold_to!(tx, last_seq, sqlite_insert_nodes)
}

/// Subtree hashes read ahead for one tree operation (see [`tree::subtrees_read_by`]).
pub(crate) async fn read_for<T>(
    db: &Db,
    operation: impl FnOnce(&tree::Recorder) -> T,
) -> Result<SubtreeMap, sqlx::Error> {
    let nodes = tree::subtrees_read_by(operation);
    db.guard(async {
        match db.pool() {
            Pool::Pg(pool) => read_nodes!(pool, &nodes),
            Pool::Sqlite(pool) => read_nodes!(pool, &nodes),
        }
    })
    .await
}

/// The number of leaves the stored tree has.
pub async fn size(db: &Db) -> Result<u64, sqlx::Error> {
    db.guard(async {
        Ok(match db.pool() {
            Pool::Pg(pool) => stored_size!(pool),
            Pool::Sqlite(pool) => stored_size!(pool),
        })
    })
    .await
}

fn tree_error(e: TreeError<tree::MissingSubtree>) -> sqlx::Error {
    decode(e.to_string())
}

/// The root hash of the stored tree's first `size` leaves.
pub async fn root(db: &Db, size: u64) -> Result<Hash, sqlx::Error> {
    let map = read_for(db, |r| tree::tree_head(size, r)).await?;
    tree::tree_head(size, &map).map_err(tree_error)
}

/// The right edge of the stored tree's first `size` leaves.
pub(crate) async fn frontier(db: &Db, size: u64) -> Result<Frontier, sqlx::Error> {
    let subtrees = Frontier::subtrees_of(size);
    let map = read_for(db, |r| {
        use tree::SubtreeHashes;
        r.subtree_hashes(&subtrees)
    })
    .await?;
    let hashes = subtrees.iter().map(|s| map.0[s]).collect();
    Frontier::new(size, hashes).map_err(|e| decode(e.to_string()))
}

/// The inclusion proof of leaf `index` in the stored tree of `size` leaves.
pub async fn inclusion_proof(db: &Db, size: u64, index: u64) -> Result<Vec<Hash>, sqlx::Error> {
    let map = read_for(db, |r| tree::inclusion_proof(size, index, r)).await?;
    tree::inclusion_proof(size, index, &map).map_err(tree_error)
}

/// The consistency proof from the stored tree of `old` leaves to that of `new`.
pub async fn consistency_proof(db: &Db, old: u64, new: u64) -> Result<Vec<Hash>, sqlx::Error> {
    let map = read_for(db, |r| tree::consistency_proof(old, new, r)).await?;
    tree::consistency_proof(old, new, &map).map_err(tree_error)
}

/// Folds every event the tree lacks into it (`emisar migrate`, and the writer at start):
/// chunk by chunk, each under the append lock, so a live server's appends interleave.
pub(crate) async fn fold_all(db: &Db) -> Result<u64, sqlx::Error> {
    loop {
        let folded = db
            .guard(async {
                match db.pool() {
                    Pool::Pg(pool) => {
                        let mut tx = pool.begin_with(super::lock::PG_BEGIN_LOCKED).await?;
                        let last: Option<i64> =
                            sqlx::query_scalar("SELECT MAX(seq) FROM audit_events")
                                .fetch_one(&mut *tx)
                                .await?;
                        let size = stored_size!(&mut *tx);
                        let target = (last.unwrap_or(0) as u64).min(size + FOLD_CHUNK as u64);
                        let tree = pg_fold(&mut tx, target).await?;
                        tx.commit().await?;
                        Ok::<_, sqlx::Error>((tree.size(), last.unwrap_or(0) as u64))
                    }
                    Pool::Sqlite(pool) => {
                        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                        let last: Option<i64> =
                            sqlx::query_scalar("SELECT MAX(seq) FROM audit_events")
                                .fetch_one(&mut *tx)
                                .await?;
                        let size = stored_size!(&mut *tx);
                        let target = (last.unwrap_or(0) as u64).min(size + FOLD_CHUNK as u64);
                        let tree = sqlite_fold(&mut tx, target).await?;
                        tx.commit().await?;
                        Ok((tree.size(), last.unwrap_or(0) as u64))
                    }
                }
            })
            .await?;
        if folded.0 >= folded.1 {
            return Ok(folded.0);
        }
    }
}
