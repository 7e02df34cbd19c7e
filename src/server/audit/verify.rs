//! `audit verify`: walks the chain as stored and reports every broken event.
//!
//! Reading and checking overlap: the calling task reads, a blocking thread builds each
//! event's text from its stored columns, hashes it and checks the links. Only the link to the
//! previous hash is sequential, and the checker keeps it.
//!
//! PostgreSQL hands the rows over as `COPY (SELECT …) TO STDOUT (FORMAT binary)`, and the
//! reading task only moves those bytes on: the checker splits them into columns itself. Read
//! as rows, sqlx's per-row machinery (the row stream, a type check and a UTF-8 check per
//! column) kept the reading task busy ~3.7 s per 1,000,000 events. Measured on 1,037,191
//! events: emisar's CPU went from 4.8 s to 3.4 s. With PostgreSQL on the same 2 cores the
//! wall stays ~4.5 s, because PostgreSQL producing the rows is then the limit (a server-side
//! `COPY` of the same query to /dev/null, no client at all, takes 2.7 s); with the database
//! on its own machine, emisar's share is what the auditor waits for.
//! The binary COPY format is a documented frame of lengths (see [`CopyFrames`]), and
//! sqlx reads it as raw bytes; no crate parses it for us, hence the few lines below.
//!
//! SQLite rows are read as rows: the reading task packs each event's text into chunks.

use std::ops::Range;

use futures::TryStreamExt;
use serde_json::Value;
use sqlx::postgres::PgPoolCopyExt;
use sqlx::{AssertSqlSafe, Row as _};
use tokio::sync::mpsc;

use super::chain::{
    Anchor, BrokenLink, EventText, Growing, StoredEvent, Verifier, VerifyReport, hash_v, write_at,
};
use super::store::{COLUMNS, PG_AT, STORED_COLUMNS};
use crate::digest::canonical_json;
use crate::server::db::{Db, Pool};
use crate::tlog::tree::Frontier;

/// Chunks in flight between the reading task and the checker: enough to keep both busy,
/// bounded so a fast reader does not buffer the whole log.
const CHUNKS_IN_FLIGHT: usize = 4;
/// SQLite: events per chunk.
const SQLITE_CHUNK_EVENTS: usize = 1024;
/// PostgreSQL: bytes of COPY data per chunk (≈ 1,000 events).
const COPY_CHUNK_BYTES: usize = 512 * 1024;

/// Walks the chain from `since` (or the start) and reports every broken event.
pub async fn verify(db: &Db, since: Option<i64>) -> Result<VerifyReport, sqlx::Error> {
    let since = since.unwrap_or(1).max(1);
    let anchor = if since > 1 {
        match anchor(db, since - 1).await? {
            Some(anchor) => Some(anchor),
            None => {
                return Ok(VerifyReport {
                    broken_count: 1,
                    broken: vec![BrokenLink {
                        seq: since - 1,
                        problem: "the event before --since does not exist".into(),
                    }],
                    ..Default::default()
                });
            }
        }
    } else {
        None
    };
    Ok(read_and_check(db, since, Verifier::new(anchor))
        .await?
        .finish())
}

/// `audit verify --checkpoint`'s walk: the events after seq `after` (the kept checkpoint's
/// size; `anchor` is that event, `None` when it is 0), checked as [`verify`] checks them, and
/// `tree` (the kept tree's right edge) grown with the leaves of their recomputed hashes up to
/// seq `upto` (the newest checkpoint's size, or a witness's), keeping the root at each size of
/// `marks`. Reading and hashing overlap as in `verify`.
pub(super) async fn verify_growing(
    db: &Db,
    after: i64,
    anchor: Option<Anchor>,
    tree: Frontier,
    upto: u64,
    marks: &[u64],
) -> Result<(VerifyReport, Growing), sqlx::Error> {
    let verifier = Verifier::growing(anchor, tree, upto, marks);
    let (report, tree) = read_and_check(db, after + 1, verifier)
        .await?
        .finish_growing();
    Ok((report, tree.expect("a growing verifier keeps its tree")))
}

/// Feeds every event from seq `since` on to `verifier`, read on this task and checked on a
/// blocking thread.
async fn read_and_check(db: &Db, since: i64, verifier: Verifier) -> Result<Verifier, sqlx::Error> {
    match db.pool() {
        Pool::Pg(pool) => {
            // `since` is an integer: COPY takes no parameters.
            let sql = format!(
                "COPY (SELECT {STORED_COLUMNS} FROM audit_events WHERE seq >= {since} ORDER BY seq) \
                 TO STDOUT (FORMAT binary)"
            );
            let (tx, rx) = mpsc::channel(CHUNKS_IN_FLIGHT);
            let checker = tokio::task::spawn_blocking(move || check_copy(verifier, rx));
            let read = async {
                let mut data = pool.copy_out_raw(&sql).await?;
                let mut chunk = Vec::with_capacity(COPY_CHUNK_BYTES * 2);
                while let Some(bytes) = data.try_next().await? {
                    chunk.extend_from_slice(&bytes);
                    if chunk.len() >= COPY_CHUNK_BYTES {
                        let full =
                            std::mem::replace(&mut chunk, Vec::with_capacity(COPY_CHUNK_BYTES * 2));
                        if tx.send(full).await.is_err() {
                            // The checker stopped on an error; it is reported below.
                            return Ok(());
                        }
                    }
                }
                if !chunk.is_empty() {
                    let _ = tx.send(chunk).await;
                }
                Ok::<_, sqlx::Error>(())
            }
            .await;
            drop(tx);
            let report = join(checker).await;
            // A read that failed also leaves the checker with a cut-off stream: its error is
            // the one that explains.
            read?;
            report
        }
        Pool::Sqlite(pool) => {
            let sql =
                format!("SELECT {STORED_COLUMNS} FROM audit_events WHERE seq >= $1 ORDER BY seq");
            let (tx, rx) = mpsc::channel(CHUNKS_IN_FLIGHT);
            let checker = tokio::task::spawn_blocking(move || Ok(check_chunks(verifier, rx)));
            let mut rows = sqlx::query(AssertSqlSafe(sql)).bind(since).fetch(pool);
            let mut chunk = Chunk::new();
            let read = async {
                while let Some(row) = rows.try_next().await? {
                    pack_row(&row, &mut chunk)?;
                    if chunk.events.len() == SQLITE_CHUNK_EVENTS {
                        let full = std::mem::replace(&mut chunk, Chunk::new());
                        if tx.send(full).await.is_err() {
                            break;
                        }
                    }
                }
                if !chunk.events.is_empty() {
                    let _ = tx.send(std::mem::replace(&mut chunk, Chunk::new())).await;
                }
                Ok::<_, sqlx::Error>(())
            }
            .await;
            drop(tx);
            let report = join(checker).await;
            read?;
            report
        }
    }
}

/// The stored hash and `at` of event `seq`, if there is one.
pub(super) async fn anchor(db: &Db, seq: i64) -> Result<Option<Anchor>, sqlx::Error> {
    let at = if db.is_postgres() { PG_AT } else { "at" };
    let sql = format!("SELECT seq, hash, {at} FROM audit_events WHERE seq = $1");
    let row: Option<(i64, String, String)> = crate::with_pool!(db, pool => {
        sqlx::query_as(AssertSqlSafe(sql)).bind(seq).fetch_optional(pool).await
    })?;
    Ok(row.map(|(seq, hash, at)| Anchor { seq, hash, at }))
}

async fn join(
    checker: tokio::task::JoinHandle<Result<Verifier, sqlx::Error>>,
) -> Result<Verifier, sqlx::Error> {
    match checker.await {
        Ok(report) => report,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// One stored event's columns, borrowed, as either backend hands them over: the event text's
/// fields (`at` as the text that was hashed) and the format they were hashed in.
struct Columns<'a> {
    text: EventText<'a>,
    hash_v: i16,
}

impl Columns<'_> {
    /// Appends the event text that was hashed when the event was written.
    fn write_text(&self, out: &mut Vec<u8>) -> Result<(), sqlx::Error> {
        if self.hash_v >= hash_v::TEXT {
            self.text.write(out);
            return Ok(());
        }
        // Rows of the first format hashed their JSON re-canonicalised from the value; what the
        // database hands back is JSON with its own spacing (and numbers as it stored them).
        let recanonical = |text: Option<&str>| -> Result<Option<String>, sqlx::Error> {
            text.map(|t| {
                serde_json::from_str::<Value>(t)
                    .map(|v| canonical_json(&v))
                    .map_err(|e| sqlx::Error::Decode(Box::new(e)))
            })
            .transpose()
        };
        let (args, detail) = (recanonical(self.text.args)?, recanonical(self.text.detail)?);
        EventText {
            args: args.as_deref(),
            detail: detail.as_deref(),
            ..self.text
        }
        .write(out);
        Ok(())
    }
}

/// Column positions of [`STORED_COLUMNS`].
mod col {
    pub(crate) const SEQ: usize = 0;
    pub(crate) const ID: usize = 1;
    pub(crate) const AT: usize = 2;
    pub(crate) const ACTOR: usize = 3;
    pub(crate) const KIND: usize = 4;
    pub(crate) const TOOL: usize = 5;
    pub(crate) const RUNNER: usize = 6;
    pub(crate) const ARGS: usize = 7;
    pub(crate) const REASON: usize = 8;
    pub(crate) const CALL_ID: usize = 9;
    pub(crate) const APPROVAL_ID: usize = 10;
    pub(crate) const OUTCOME: usize = 11;
    pub(crate) const RESULT_DIGEST: usize = 12;
    pub(crate) const DETAIL: usize = 13;
    pub(crate) const PREV_HASH: usize = 14;
    pub(crate) const HASH: usize = 15;
    pub(crate) const HASH_V: usize = 16;
    pub(crate) const COUNT: usize = super::COLUMNS.len();
}

// ---- PostgreSQL: binary COPY ----

/// The signature that starts every binary COPY stream, then 4 bytes of flags and 4 of header
/// extension length (PostgreSQL docs, "COPY", Binary Format).
const COPY_SIGNATURE: &[u8; 11] = b"PGCOPY\n\xff\r\n\0";
/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01T00:00:00Z).
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// One row's columns as binary COPY sends them: `None` for NULL.
type Fields<'a> = [Option<&'a [u8]>; col::COUNT];

/// Splits a binary COPY stream, fed in arbitrary pieces, into rows: a header, then per row a
/// 16-bit column count and per column a 32-bit length (-1 for NULL) and that many bytes,
/// then a count of -1 as the trailer. Everything is big-endian.
#[derive(Default)]
struct CopyFrames {
    /// The start of a row (or of the header) that the last piece cut off.
    carry: Vec<u8>,
    header_read: bool,
    trailer_read: bool,
}

enum Frame {
    /// A row of this many bytes, its columns written into the caller's [`Fields`].
    Row(usize),
    Trailer,
    /// Not all of it has arrived yet.
    Partial,
}

fn copy_error(what: impl std::fmt::Display) -> sqlx::Error {
    sqlx::Error::Protocol(format!(
        "audit verify: the COPY data from PostgreSQL {what}"
    ))
}

impl CopyFrames {
    /// Calls `row` for every complete row in what has arrived so far.
    fn feed(
        &mut self,
        piece: &[u8],
        mut row: impl FnMut(&Fields<'_>) -> Result<(), sqlx::Error>,
    ) -> Result<(), sqlx::Error> {
        let joined;
        let mut input = if self.carry.is_empty() {
            piece
        } else {
            self.carry.extend_from_slice(piece);
            joined = std::mem::take(&mut self.carry);
            &joined[..]
        };
        if !self.header_read {
            let fixed = COPY_SIGNATURE.len() + 8;
            if input.len() < fixed {
                self.carry = input.to_vec();
                return Ok(());
            }
            if &input[..COPY_SIGNATURE.len()] != COPY_SIGNATURE {
                return Err(copy_error("does not start with the binary COPY signature"));
            }
            let extension = u32::from_be_bytes(input[fixed - 4..fixed].try_into().expect("4"));
            let Some(end) = fixed.checked_add(extension as usize) else {
                return Err(copy_error("has a header extension too long to be real"));
            };
            if input.len() < end {
                self.carry = input.to_vec();
                return Ok(());
            }
            input = &input[end..];
            self.header_read = true;
        }
        while !input.is_empty() {
            if self.trailer_read {
                return Err(copy_error("goes on after its trailer"));
            }
            let mut fields: Fields<'_> = [None; col::COUNT];
            match Self::frame(input, &mut fields)? {
                Frame::Row(used) => {
                    row(&fields)?;
                    input = &input[used..];
                }
                Frame::Trailer => {
                    self.trailer_read = true;
                    input = &input[2..];
                }
                Frame::Partial => break,
            }
        }
        self.carry = input.to_vec();
        Ok(())
    }

    fn frame<'a>(input: &'a [u8], fields: &mut Fields<'a>) -> Result<Frame, sqlx::Error> {
        let Some(count) = input.get(..2) else {
            return Ok(Frame::Partial);
        };
        let count = i16::from_be_bytes(count.try_into().expect("2"));
        if count == -1 {
            return Ok(Frame::Trailer);
        }
        if count as usize != col::COUNT {
            return Err(copy_error(format_args!(
                "has a row of {count} columns; verify reads {}",
                col::COUNT
            )));
        }
        let mut at = 2;
        for (i, field) in fields.iter_mut().enumerate() {
            let Some(len) = input.get(at..at + 4) else {
                return Ok(Frame::Partial);
            };
            let len = i32::from_be_bytes(len.try_into().expect("4"));
            at += 4;
            if len == -1 {
                continue;
            }
            let Ok(len) = usize::try_from(len) else {
                return Err(copy_error(format_args!(
                    "gives column `{}` the length {len}",
                    COLUMNS[i]
                )));
            };
            let Some(bytes) = input.get(at..at + len) else {
                return Ok(Frame::Partial);
            };
            *field = Some(bytes);
            at += len;
        }
        Ok(Frame::Row(at))
    }

    /// Ends the stream: it must have ended with its trailer.
    fn finish(&self) -> Result<(), sqlx::Error> {
        if self.trailer_read && self.carry.is_empty() {
            Ok(())
        } else {
            Err(copy_error("ended before its trailer"))
        }
    }
}

/// Checks the events of a binary COPY stream of [`STORED_COLUMNS`], in order.
fn check_copy(
    mut verifier: Verifier,
    mut chunks: mpsc::Receiver<Vec<u8>>,
) -> Result<Verifier, sqlx::Error> {
    let mut frames = CopyFrames::default();
    let mut text = Vec::with_capacity(1024);
    let mut at = String::with_capacity(32);
    while let Some(chunk) = chunks.blocking_recv() {
        frames.feed(&chunk, |fields| {
            check_fields(&mut verifier, fields, &mut text, &mut at)
        })?;
    }
    frames.finish()?;
    Ok(verifier)
}

fn check_fields(
    verifier: &mut Verifier,
    fields: &Fields<'_>,
    text: &mut Vec<u8>,
    at_text: &mut String,
) -> Result<(), sqlx::Error> {
    // The seq first, so that every later problem can name the event.
    let seq = fixed::<8>(fields, col::SEQ, None).map(i64::from_be_bytes)?;
    let bad = |i: usize, rule: &str| {
        sqlx::Error::Decode(format!("event {seq}: column `{}` {rule}", COLUMNS[i]).into())
    };
    let opt = |i: usize| -> Result<Option<&str>, sqlx::Error> {
        fields[i]
            .map(|b| std::str::from_utf8(b).map_err(|_| bad(i, "is not UTF-8 text")))
            .transpose()
    };
    let s = |i: usize| opt(i)?.ok_or_else(|| bad(i, "is NULL"));
    let micros = fixed::<8>(fields, col::AT, Some(seq)).map(i64::from_be_bytes)?;
    let at = micros
        .checked_add(PG_EPOCH_MICROS)
        .and_then(chrono::DateTime::from_timestamp_micros)
        .ok_or_else(|| bad(col::AT, "is not a finite time"))?;
    at_text.clear();
    write_at(at_text, at);
    let hash_v = fixed::<2>(fields, col::HASH_V, Some(seq)).map(i16::from_be_bytes)?;
    let columns = Columns {
        text: EventText {
            seq,
            id: s(col::ID)?,
            at: at_text,
            actor: s(col::ACTOR)?,
            kind: s(col::KIND)?,
            tool: opt(col::TOOL)?,
            runner: opt(col::RUNNER)?,
            args: opt(col::ARGS)?,
            reason: opt(col::REASON)?,
            call_id: opt(col::CALL_ID)?,
            approval_id: opt(col::APPROVAL_ID)?,
            outcome: opt(col::OUTCOME)?,
            result_digest: opt(col::RESULT_DIGEST)?,
            detail: opt(col::DETAIL)?,
            prev_hash: s(col::PREV_HASH)?,
        },
        hash_v,
    };
    text.clear();
    columns.write_text(text)?;
    verifier.feed(StoredEvent {
        seq,
        at: columns.text.at,
        prev_hash: columns.text.prev_hash,
        hash: s(col::HASH)?,
        hash_v,
        text,
    });
    Ok(())
}

/// A NOT NULL column of a fixed-size binary type (bigint, smallint, timestamptz).
fn fixed<const N: usize>(
    fields: &Fields<'_>,
    i: usize,
    seq: Option<i64>,
) -> Result<[u8; N], sqlx::Error> {
    fields[i]
        .and_then(|b| <[u8; N]>::try_from(b).ok())
        .ok_or_else(|| {
            let event = seq.map_or("an event".to_owned(), |s| format!("event {s}"));
            sqlx::Error::Decode(
                format!("{event}: column `{}` is NULL or not {N} bytes", COLUMNS[i]).into(),
            )
        })
}

// ---- SQLite: rows ----

/// Events as the checker needs them: each event's text (built from its stored columns) and
/// its links, packed into one buffer per chunk rather than a few strings per event.
struct Chunk {
    bytes: Vec<u8>,
    events: Vec<Packed>,
}

struct Packed {
    seq: i64,
    hash_v: i16,
    text: Range<usize>,
    at: Range<usize>,
    prev_hash: Range<usize>,
    hash: Range<usize>,
}

impl Chunk {
    fn new() -> Chunk {
        Chunk {
            // ≈ 600 bytes of text and links per event.
            bytes: Vec::with_capacity(SQLITE_CHUNK_EVENTS * 768),
            events: Vec::with_capacity(SQLITE_CHUNK_EVENTS),
        }
    }

    fn push_str(&mut self, s: &str) -> Range<usize> {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(s.as_bytes());
        start..self.bytes.len()
    }
}

/// Adds one SQLite row to `chunk`, reading its columns in place (no string per column).
fn pack_row(row: &sqlx::sqlite::SqliteRow, chunk: &mut Chunk) -> Result<(), sqlx::Error> {
    let s = |i: usize| row.try_get::<&str, _>(i);
    let o = |i: usize| row.try_get::<Option<&str>, _>(i);
    let columns = Columns {
        text: EventText {
            seq: row.try_get(col::SEQ)?,
            id: s(col::ID)?,
            at: s(col::AT)?,
            actor: s(col::ACTOR)?,
            kind: s(col::KIND)?,
            tool: o(col::TOOL)?,
            runner: o(col::RUNNER)?,
            args: o(col::ARGS)?,
            reason: o(col::REASON)?,
            call_id: o(col::CALL_ID)?,
            approval_id: o(col::APPROVAL_ID)?,
            outcome: o(col::OUTCOME)?,
            result_digest: o(col::RESULT_DIGEST)?,
            detail: o(col::DETAIL)?,
            prev_hash: s(col::PREV_HASH)?,
        },
        hash_v: row.try_get(col::HASH_V)?,
    };
    let start = chunk.bytes.len();
    columns.write_text(&mut chunk.bytes)?;
    let text = start..chunk.bytes.len();
    let at = chunk.push_str(columns.text.at);
    let prev_hash = chunk.push_str(columns.text.prev_hash);
    let hash = chunk.push_str(s(col::HASH)?);
    chunk.events.push(Packed {
        seq: columns.text.seq,
        hash_v: columns.hash_v,
        text,
        at,
        prev_hash,
        hash,
    });
    Ok(())
}

/// Hashes and checks the chunks in order, on a blocking thread.
fn check_chunks(mut verifier: Verifier, mut chunks: mpsc::Receiver<Chunk>) -> Verifier {
    while let Some(chunk) = chunks.blocking_recv() {
        let text = |r: &Range<usize>| {
            std::str::from_utf8(&chunk.bytes[r.clone()]).expect("packed from a &str")
        };
        for e in &chunk.events {
            verifier.feed(StoredEvent {
                seq: e.seq,
                at: text(&e.at),
                prev_hash: text(&e.prev_hash),
                hash: text(&e.hash),
                hash_v: e.hash_v,
                text: &chunk.bytes[e.text.clone()],
            });
        }
    }
    verifier
}

#[cfg(test)]
mod tests {
    use super::*;

    type Row = Vec<Option<Vec<u8>>>;

    /// A binary COPY stream of `rows`, each a list of columns (`None` for NULL).
    fn stream(rows: &[Row]) -> Vec<u8> {
        let mut out = COPY_SIGNATURE.to_vec();
        out.extend_from_slice(&0u32.to_be_bytes());
        out.extend_from_slice(&0u32.to_be_bytes());
        for row in rows {
            out.extend_from_slice(&(row.len() as i16).to_be_bytes());
            for field in row {
                match field {
                    None => out.extend_from_slice(&(-1i32).to_be_bytes()),
                    Some(b) => {
                        out.extend_from_slice(&(b.len() as i32).to_be_bytes());
                        out.extend_from_slice(b);
                    }
                }
            }
        }
        out.extend_from_slice(&(-1i16).to_be_bytes());
        out
    }

    /// A row with only its seq and id set.
    fn row(seq: i64, id: &str) -> Row {
        let mut r = vec![None; col::COUNT];
        r[col::SEQ] = Some(seq.to_be_bytes().to_vec());
        r[col::ID] = Some(id.as_bytes().to_vec());
        r
    }

    /// The rows `CopyFrames` finds in `data` fed in pieces of `size` bytes: (seq, id).
    fn split(data: &[u8], size: usize) -> Result<Vec<(i64, String)>, sqlx::Error> {
        let mut frames = CopyFrames::default();
        let mut rows = Vec::new();
        for piece in data.chunks(size) {
            frames.feed(piece, |f| {
                let seq = i64::from_be_bytes(f[col::SEQ].unwrap().try_into().unwrap());
                let id = String::from_utf8(f[col::ID].unwrap().to_vec()).unwrap();
                assert!(f[col::ACTOR].is_none());
                rows.push((seq, id));
                Ok(())
            })?;
        }
        frames.finish()?;
        Ok(rows)
    }

    /// `col`'s positions are those of the columns verify selects: a column added to or moved
    /// in [`STORED_COLUMNS`] must move here too, or every event would be read wrongly.
    #[test]
    fn the_column_positions_are_those_of_the_stored_columns() {
        assert_eq!(STORED_COLUMNS, COLUMNS.join(", "));
        for (i, name) in [
            (col::SEQ, "seq"),
            (col::ID, "id"),
            (col::AT, "at"),
            (col::ACTOR, "actor"),
            (col::KIND, "kind"),
            (col::TOOL, "tool"),
            (col::RUNNER, "runner"),
            (col::ARGS, "args"),
            (col::REASON, "reason"),
            (col::CALL_ID, "call_id"),
            (col::APPROVAL_ID, "approval_id"),
            (col::OUTCOME, "outcome"),
            (col::RESULT_DIGEST, "result_digest"),
            (col::DETAIL, "detail"),
            (col::PREV_HASH, "prev_hash"),
            (col::HASH, "hash"),
            (col::HASH_V, "hash_v"),
        ] {
            assert_eq!(COLUMNS[i], name);
        }
    }

    #[test]
    fn rows_are_found_however_the_stream_is_cut() {
        let data = stream(&[row(1, "a"), row(2, ""), row(3, "ccc")]);
        let want = vec![(1, "a".into()), (2, String::new()), (3, "ccc".into())];
        for size in 1..=data.len() {
            assert_eq!(split(&data, size).unwrap(), want, "pieces of {size} bytes");
        }
    }

    #[test]
    fn a_cut_off_or_malformed_stream_is_an_error_not_a_short_report() {
        let data = stream(&[row(1, "a"), row(2, "b")]);
        let e = split(&data[..data.len() - 1], 7).unwrap_err().to_string();
        assert!(e.contains("ended before its trailer"), "{e}");
        let e = split(&data[..data.len() - 20], 7).unwrap_err().to_string();
        assert!(e.contains("ended before its trailer"), "{e}");

        let mut short = row(1, "a");
        short.pop();
        let e = split(&stream(&[short]), 64).unwrap_err().to_string();
        assert!(e.contains("a row of 16 columns; verify reads 17"), "{e}");

        let mut bad = stream(&[row(1, "a")]);
        bad[0] = b'X';
        let e = split(&bad, 64).unwrap_err().to_string();
        assert!(e.contains("signature"), "{e}");

        let mut more = stream(&[row(1, "a")]);
        more.extend_from_slice(&stream(&[row(2, "b")])[19..]);
        let e = split(&more, 64).unwrap_err().to_string();
        assert!(e.contains("goes on after its trailer"), "{e}");

        // A negative length other than -1 (NULL).
        let mut negative = stream(&[row(1, "a")]);
        let id_len = 19 + 2 + 4 + 8;
        negative[id_len..id_len + 4].copy_from_slice(&(-2i32).to_be_bytes());
        let e = split(&negative, 64).unwrap_err().to_string();
        assert!(e.contains("gives column `id` the length -2"), "{e}");
    }

    #[test]
    fn a_column_that_is_not_what_the_schema_says_names_the_event_and_column() {
        let mut verifier = Verifier::new(None);
        let (mut text, mut at) = (Vec::new(), String::new());
        let mut fields: Fields<'_> = [None; col::COUNT];
        let seq = 7i64.to_be_bytes();
        fields[col::SEQ] = Some(&seq);
        let e = check_fields(&mut verifier, &fields, &mut text, &mut at)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("event 7: column `at` is NULL or not 8 bytes"),
            "{e}"
        );

        let infinity = i64::MAX.to_be_bytes();
        fields[col::AT] = Some(&infinity);
        let e = check_fields(&mut verifier, &fields, &mut text, &mut at)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("event 7: column `at` is not a finite time"),
            "{e}"
        );

        let zero = 0i64.to_be_bytes();
        let v = hash_v::TEXT.to_be_bytes();
        fields[col::AT] = Some(&zero);
        fields[col::HASH_V] = Some(&v);
        fields[col::ID] = Some(b"\xff");
        let e = check_fields(&mut verifier, &fields, &mut text, &mut at)
            .unwrap_err()
            .to_string();
        assert!(e.contains("event 7: column `id` is not UTF-8 text"), "{e}");

        fields[col::ID] = Some(b"x");
        let e = check_fields(&mut verifier, &fields, &mut text, &mut at)
            .unwrap_err()
            .to_string();
        assert!(e.contains("event 7: column `actor` is NULL"), "{e}");
        assert_eq!(verifier.finish().checked, 0, "nothing was fed");
    }
}
