//! The audit log's activity over time: how many events, calls, refusals and approvals fell
//! in each bucket of a recent window, counted by the store in one query (`GET
//! /api/audit/activity`, the portal's chart above the audit table).
//!
//! Invariants: the window is bounded ([`MAX_BUCKETS`] buckets, [`MAX_SPAN_SECS`] in all) and
//! a bad parameter is refused with a message naming it and the rule; the counts are an
//! aggregate read in one statement (never the events themselves); every bucket of the window
//! is answered, an empty one with zeros; a bucket holds the events with `start <= at < end`.

use chrono::{DateTime, TimeZone, Utc};
use sqlx::AssertSqlSafe;

use super::chain::{format_at, kind};
use crate::server::db::Db;
use crate::with_pool;

/// The most buckets one answer holds.
pub const MAX_BUCKETS: i64 = 360;
/// The widest bucket: an hour.
pub const MAX_BUCKET_SECS: i64 = 3600;
/// The narrowest bucket.
pub const MIN_BUCKET_SECS: i64 = 10;
/// The longest window (`buckets` × `bucket_seconds`): seven days.
pub const MAX_SPAN_SECS: i64 = 7 * 86_400;

/// The query string as given: both optional (60 buckets of 60 s, the last hour).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActivityParams {
    pub buckets: Option<String>,
    pub bucket_seconds: Option<String>,
}

/// A checked window: `buckets` buckets of `bucket_seconds`, the last one ending at `end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub buckets: i64,
    pub bucket_seconds: i64,
    /// The end of the last bucket (exclusive), a multiple of `bucket_seconds` since the epoch.
    pub end: i64,
}

impl Window {
    /// The window `params` ask for that holds `now` in its last bucket, or a message naming
    /// the field and the rule it broke.
    pub fn from_params(params: &ActivityParams, now: DateTime<Utc>) -> Result<Window, String> {
        let buckets = whole_number("buckets", params.buckets.as_deref(), 60, 1, MAX_BUCKETS)?;
        let bucket_seconds = whole_number(
            "bucket_seconds",
            params.bucket_seconds.as_deref(),
            60,
            MIN_BUCKET_SECS,
            MAX_BUCKET_SECS,
        )?;
        if buckets * bucket_seconds > MAX_SPAN_SECS {
            return Err(format!(
                "`buckets` × `bucket_seconds` must be at most {MAX_SPAN_SECS} seconds (7 days); {buckets} × {bucket_seconds} is {}",
                buckets * bucket_seconds
            ));
        }
        let end = (now.timestamp().div_euclid(bucket_seconds) + 1) * bucket_seconds;
        Ok(Window {
            buckets,
            bucket_seconds,
            end,
        })
    }

    /// The start of the first bucket, in seconds since the epoch.
    pub fn start(&self) -> i64 {
        self.end - self.buckets * self.bucket_seconds
    }
}

/// `field` as a whole number in `min..=max`, `default` when absent.
fn whole_number(
    field: &str,
    value: Option<&str>,
    default: i64,
    min: i64,
    max: i64,
) -> Result<i64, String> {
    let Some(text) = value else {
        return Ok(default);
    };
    match text.parse::<i64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "`{field}` must be a whole number from {min} to {max}, not `{}`",
            text.chars().take(32).collect::<String>()
        )),
    }
}

/// The counts of one bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Bucket {
    /// The bucket's start, RFC 3339 UTC.
    pub start: String,
    /// Every event.
    pub events: i64,
    /// `tool.called`: calls that passed the checks.
    pub calls: i64,
    /// `tool.rejected` events, plus the `count` of refusals each `refusal.repeated` stands for.
    pub refusals: i64,
    /// `approval.approved`.
    pub approvals: i64,
}

/// The answer: the window and every bucket of it, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Activity {
    pub start: String,
    pub end: String,
    pub bucket_seconds: i64,
    pub buckets: Vec<Bucket>,
}

/// One row of the aggregate: a bucket's index and its counts.
type Counts = (i64, i64, i64, i64, i64);

/// The per-bucket counts, one statement per backend. The bucket of an event is
/// floor((its time − the window's start) / width). Only the bind placeholders and the kinds
/// (constants) are in the text; every value is bound.
fn sql(pg: bool) -> String {
    let refusal_count = if pg {
        "COALESCE((detail::jsonb->>'count')::bigint, 1)"
    } else {
        "COALESCE(CAST(json_extract(detail, '$.count') AS INTEGER), 1)"
    };
    let (bucket, since, until, sum) = if pg {
        (
            "floor((extract(epoch FROM at) - $1::bigint) / $2::bigint)::bigint",
            "$3::timestamptz",
            "$4::timestamptz",
            "::bigint",
        )
    } else {
        (
            "(CAST(strftime('%s', at) AS INTEGER) - $1) / $2",
            "$3",
            "$4",
            "",
        )
    };
    format!(
        "SELECT {bucket} AS b, COUNT(*){sum}, \
         SUM(CASE WHEN kind = '{called}' THEN 1 ELSE 0 END){sum}, \
         SUM(CASE WHEN kind = '{rejected}' THEN 1 WHEN kind = '{repeated}' THEN {refusal_count} ELSE 0 END){sum}, \
         SUM(CASE WHEN kind = '{approved}' THEN 1 ELSE 0 END){sum} \
         FROM audit_events WHERE at >= {since} AND at < {until} GROUP BY b",
        called = kind::TOOL_CALLED,
        rejected = kind::TOOL_REJECTED,
        repeated = kind::REFUSAL_REPEATED,
        approved = kind::APPROVAL_APPROVED,
    )
}

/// The counts of every bucket of `window`, read from the store in one query.
pub async fn activity(db: &Db, window: Window) -> Result<Activity, sqlx::Error> {
    let start = window.start();
    let since = format_at(at(start));
    let until = format_at(at(window.end));
    let sql = sql(db.is_postgres());
    let rows: Vec<Counts> = db
        .guard(async {
            with_pool!(db, pool => {
                sqlx::query_as::<_, Counts>(AssertSqlSafe(sql.clone()))
                    .bind(start)
                    .bind(window.bucket_seconds)
                    .bind(&since)
                    .bind(&until)
                    .fetch_all(pool)
                    .await
            })
        })
        .await?;
    Ok(fill(window, rows))
}

/// Every bucket of `window`, with the counts of `rows` where the store found events.
fn fill(window: Window, rows: Vec<Counts>) -> Activity {
    let start = window.start();
    let mut buckets: Vec<Bucket> = (0..window.buckets)
        .map(|i| Bucket {
            start: at(start + i * window.bucket_seconds)
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            ..Bucket::default()
        })
        .collect();
    for (index, events, calls, refusals, approvals) in rows {
        if let Some(b) = usize::try_from(index).ok().and_then(|i| buckets.get_mut(i)) {
            b.events = events;
            b.calls = calls;
            b.refusals = refusals;
            b.approvals = approvals;
        }
    }
    Activity {
        start: at(start).to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        end: at(window.end).to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        bucket_seconds: window.bucket_seconds,
        buckets,
    }
}

/// `secs` since the epoch as a UTC time (every window lies well inside chrono's range).
fn at(secs: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(secs, 0).single().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(buckets: Option<&str>, bucket_seconds: Option<&str>) -> ActivityParams {
        ActivityParams {
            buckets: buckets.map(str::to_owned),
            bucket_seconds: bucket_seconds.map(str::to_owned),
        }
    }

    #[test]
    fn the_last_bucket_holds_now_and_the_window_is_aligned() {
        let now = Utc.with_ymd_and_hms(2026, 12, 6, 17, 0, 59).unwrap();
        let w = Window::from_params(&params(None, None), now).unwrap();
        assert_eq!((w.buckets, w.bucket_seconds), (60, 60));
        assert_eq!(
            at(w.end),
            Utc.with_ymd_and_hms(2026, 12, 6, 17, 1, 0).unwrap()
        );
        assert_eq!(
            at(w.start()),
            Utc.with_ymd_and_hms(2026, 12, 6, 16, 1, 0).unwrap()
        );
    }

    #[test]
    fn bad_bounds_name_the_field_and_the_rule() {
        let now = Utc::now();
        for (p, field) in [
            (
                params(Some("0"), None),
                "`buckets` must be a whole number from 1 to 360",
            ),
            (
                params(Some("361"), None),
                "`buckets` must be a whole number from 1 to 360",
            ),
            (
                params(Some("ten"), None),
                "`buckets` must be a whole number from 1 to 360",
            ),
            (
                params(None, Some("5")),
                "`bucket_seconds` must be a whole number from 10 to 3600",
            ),
            (
                params(None, Some("-60")),
                "`bucket_seconds` must be a whole number from 10 to 3600",
            ),
            (
                params(Some("360"), Some("3600")),
                "`buckets` × `bucket_seconds` must be at most 604800",
            ),
        ] {
            let err = Window::from_params(&p, now).unwrap_err();
            assert!(err.starts_with(field), "{p:?}: {err}");
        }
        assert!(Window::from_params(&params(Some("168"), Some("3600")), now).is_ok());
    }

    #[test]
    fn empty_buckets_are_zeros_and_rows_land_in_their_bucket() {
        let w = Window {
            buckets: 3,
            bucket_seconds: 60,
            end: 180,
        };
        let a = fill(w, vec![(1, 5, 2, 1, 1), (7, 9, 9, 9, 9)]);
        assert_eq!(a.buckets.len(), 3);
        assert_eq!(a.buckets[0].events, 0);
        assert_eq!(
            (
                a.buckets[1].events,
                a.buckets[1].calls,
                a.buckets[1].refusals,
                a.buckets[1].approvals
            ),
            (5, 2, 1, 1)
        );
        assert_eq!(a.buckets[1].start, "1970-01-01T00:01:00Z");
        assert_eq!(
            (a.start.as_str(), a.end.as_str()),
            ("1970-01-01T00:00:00Z", "1970-01-01T00:03:00Z")
        );
    }
}
