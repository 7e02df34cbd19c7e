//! People's signed review of a break-glass window, after the incident (issue 47): which
//! window, the exact grant text it ran under, and what the reviewers say was done and why. A
//! window stays "unreviewed" until enough people sign one.
//!
//! ```text
//! emisar-review/v1
//! window 0193f4d0-…
//! grant sha256:<hex>
//! note "INC-42: restarted consul on edge-1 twice; the runbook now covers it"
//! reviewed 2026-12-07T09:00:00Z
//! ```
//!
//! One line per field, in this order, each ending in a newline. `window` is the window's
//! grant id; `grant` the SHA-256 of the window's grant text, so a review holds only for the
//! window people opened (not another grant with the same id); `note` a JSON string, never
//! empty or blank, at most [`MAX_NOTE`] bytes; `reviewed` when the review was proposed, UTC.
//! The first line is neither a statement's, a decision's nor a grant's, so no signature over
//! one is ever read as another.
//!
//! *Invariant:* a review counts only when it binds the window's grant text by its hash, the
//! grant is a break-glass window, the review was proposed no earlier than the window closed
//! (revoked or expired, as the log tells) and not in the future, and distinct people of the approvers file signed its text, at least as
//! many as the file's rule for [`REVIEW_TOOL`] and as the window itself needed (its
//! `required`, two at least): the people who close a window are as many as opened it
//! ([`check`]). Everything but the signatures is [`check_unsigned`], which the server also
//! holds a first signer's proposal to before it stores it, so no proposal that can never
//! count is ever stored.

use serde_json::Value;

use super::grant::Grant;
use super::statement::{StatementError, hash_text, parse_utc};
use super::{CLOCK_SKEW_SECS, Signature, Signed, issued_millis, verify_quorum};

/// The first line: the format and its version.
pub const VERSION_LINE: &str = "emisar-review/v1";
/// The longest note, in bytes (4 KiB).
pub const MAX_NOTE: usize = 4096;
/// The name whose approvers-file rule says how many people a review needs (beside the
/// window's own `required`): a file's `tools = "*"` rule covers it, and a rule of its own can
/// ask for more people or for SSH signatures.
pub const REVIEW_TOOL: &str = "emisar.break_glass.review";

/// A review of a break-glass window: every field is one line of [`Review::text`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Review {
    /// The window's grant id.
    pub window: String,
    /// Hex SHA-256 of the window's grant text.
    pub grant_sha256: String,
    /// What was done inside the window and why, as the reviewers sign it.
    pub note: String,
    /// RFC 3339 UTC: when the review was proposed.
    pub reviewed_at: String,
}

/// A review as people send it: its text and their signatures over it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReviewProof {
    pub text: String,
    #[serde(default)]
    pub signatures: Vec<Signature>,
}

fn err(msg: impl Into<String>) -> StatementError {
    StatementError(format!("review: {}", msg.into()))
}

/// Whether `c` shows nothing on a screen: whitespace, a control character, or an invisible
/// formatting or filler character (zero-width spaces and joiners, bidirectional marks,
/// overrides and isolates, the word joiner and invisible operators, soft hyphen, variation
/// selectors, Hangul fillers, tags, the Braille blank).
pub fn is_invisible(c: char) -> bool {
    c.is_whitespace()
        || c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{034F}'
                | '\u{061C}'
                | '\u{115F}'
                | '\u{1160}'
                | '\u{17B4}'
                | '\u{17B5}'
                | '\u{180B}'..='\u{180F}'
                | '\u{200B}'..='\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}'
                | '\u{2800}'
                | '\u{3164}'
                | '\u{FE00}'..='\u{FE0F}'
                | '\u{FEFF}'
                | '\u{FFA0}'
                | '\u{FFF0}'..='\u{FFFB}'
                | '\u{1BCA0}'..='\u{1BCA3}'
                | '\u{1D173}'..='\u{1D17A}'
                | '\u{E0000}'..='\u{E007F}'
                | '\u{E0100}'..='\u{E01EF}'
        )
}

/// Whether `note` is a review's note: at least one visible character (not [`is_invisible`]),
/// at most [`MAX_NOTE`] bytes. The error names `note` and the rule, for the CLI and the API to
/// pass on.
pub fn check_note(note: &str) -> Result<(), StatementError> {
    if note.trim().is_empty() {
        return Err(err(
            "`note` is required: say what was done inside the window and why",
        ));
    }
    if note.chars().all(is_invisible) {
        return Err(err(
            "`note` has no visible character (only spaces, controls or invisible formatting such as U+200B): say what was done inside the window and why",
        ));
    }
    if note.len() > MAX_NOTE {
        return Err(err(format!(
            "`note` is {} bytes, more than the {MAX_NOTE} allowed",
            note.len()
        )));
    }
    Ok(())
}

impl Review {
    /// The review of the window whose grant text is `window_text`, proposed at `reviewed_at`.
    pub fn of(window_text: &str, note: &str, reviewed_at: &str) -> Result<Review, StatementError> {
        let grant = Grant::parse(window_text)?;
        let review = Review {
            window: grant.id,
            grant_sha256: hex::encode(hash_text(window_text)),
            note: note.to_owned(),
            reviewed_at: reviewed_at.to_owned(),
        };
        review.check()?;
        Ok(review)
    }

    /// The canonical text, the bytes a signature covers.
    pub fn text(&self) -> Result<String, StatementError> {
        self.check()?;
        Ok(format!(
            "{VERSION_LINE}\nwindow {}\ngrant sha256:{}\nnote {}\nreviewed {}\n",
            self.window,
            self.grant_sha256,
            Value::String(self.note.clone()),
            self.reviewed_at,
        ))
    }

    /// SHA-256 of [`Review::text`]: the WebAuthn challenge, and what the CLI shows.
    pub fn hash(&self) -> Result<[u8; 32], StatementError> {
        Ok(hash_text(&self.text()?))
    }

    /// `reviewed_at` as seconds since the Unix epoch.
    pub fn reviewed_unix(&self) -> Result<u64, StatementError> {
        parse_utc(&self.reviewed_at)
            .ok_or_else(|| err("`reviewed` must be UTC as YYYY-MM-DDTHH:MM:SSZ"))
    }

    fn check(&self) -> Result<(), StatementError> {
        if self.window.is_empty()
            || self.window.len() > 128
            || self
                .window
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(err(
                "`window` must be 1 to 128 bytes without whitespace or a control character",
            ));
        }
        if self.grant_sha256.len() != 64
            || !self
                .grant_sha256
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(err("`grant` must be a SHA-256 in lowercase hex"));
        }
        check_note(&self.note)?;
        self.reviewed_unix()?;
        Ok(())
    }

    /// Reads a review back from its text; only text [`Review::text`] would write (the same
    /// bytes) is accepted.
    pub fn parse(text: &str) -> Result<Review, StatementError> {
        if text.len() > 2 * MAX_NOTE + 1024 {
            return Err(err("longer than a review can be"));
        }
        let body = text
            .strip_suffix('\n')
            .ok_or_else(|| err("must end with a newline"))?;
        let mut lines = body.split('\n');
        if lines.next() != Some(VERSION_LINE) {
            return Err(err(format!("the first line must be `{VERSION_LINE}`")));
        }
        let mut take = |key: &str| -> Result<&str, StatementError> {
            match lines.next().map(|l| l.split_once(' ')) {
                Some(Some((k, v))) if k == key => Ok(v),
                Some(Some((k, _))) => Err(err(format!("expected `{key}`, found `{k}`"))),
                Some(None) => Err(err("every line after the first is `key value`")),
                None => Err(err(format!("`{key}` is missing"))),
            }
        };
        let window = take("window")?.to_owned();
        let grant_sha256 = take("grant")?
            .strip_prefix("sha256:")
            .ok_or_else(|| err("`grant` must be `sha256:HEX`"))?
            .to_owned();
        let note: String =
            serde_json::from_str(take("note")?).map_err(|_| err("`note` must be a JSON string"))?;
        let reviewed_at = take("reviewed")?.to_owned();
        if lines.next().is_some() {
            return Err(err("a line follows `reviewed`"));
        }
        let review = Review {
            window,
            grant_sha256,
            note,
            reviewed_at,
        };
        if review.text()? != text {
            return Err(err("not in canonical form"));
        }
        Ok(review)
    }
}

/// Everything [`check`] holds a review to but its signatures: the review `text` parses, binds
/// the window whose grant text is `window_text` (its id and SHA-256), the window is a
/// break-glass window, and the review was proposed no earlier than `closed` (when the window
/// was revoked or expired, seconds since the epoch: a review signed while the window was open
/// vouches for calls not yet made) and no later than `now` (give or take [`CLOCK_SKEW_SECS`]).
/// The server holds a first signer's proposal to it before storing it.
pub fn check_unsigned(
    window_text: &str,
    text: &str,
    now: u64,
    closed: u64,
) -> Result<(Review, Grant), String> {
    let review = Review::parse(text).map_err(|e| e.to_string())?;
    let window = Grant::parse(window_text).map_err(|e| e.to_string())?;
    if !window.break_glass {
        return Err(format!(
            "`window`: the grant {} is not a break-glass window",
            window.id
        ));
    }
    if review.window != window.id {
        return Err(format!(
            "`window`: the review is of window {}, not {}",
            review.window, window.id
        ));
    }
    if review.grant_sha256 != hex::encode(hash_text(window_text)) {
        return Err(
            "`grant`: the review binds another grant text than the window's (sha256 differs)"
                .into(),
        );
    }
    let reviewed = review.reviewed_unix().map_err(|e| e.to_string())?;
    let opened = issued_millis(&window.id).map(|ms| ms / 1000).unwrap_or(0);
    if reviewed < opened {
        return Err(format!(
            "`reviewed`: {} is before the window was asked for",
            review.reviewed_at
        ));
    }
    if reviewed < closed {
        return Err(format!(
            "`reviewed`: {} is before the window closed (at {closed}, unix seconds): a review is signed after the window, of what ran inside it",
            review.reviewed_at,
        ));
    }
    if reviewed > now + CLOCK_SKEW_SECS {
        return Err(format!(
            "`reviewed`: {} is in the future of this clock",
            review.reviewed_at
        ));
    }
    Ok((review, window))
}

/// The one check of a signed review of the window whose grant text is `window_text`, which
/// the server (before it writes a review to the log), the listing of windows (before it counts
/// a `break_glass.reviewed` event) and an offline audit use: [`check_unsigned`] at `now` for a
/// window closed at `closed`, and distinct people of `approvers` signed it: as many as the
/// file's rule for [`REVIEW_TOOL`] and the window's `required`.
pub fn check(
    approvers: &super::Approvers,
    window_text: &str,
    proof: &ReviewProof,
    now: u64,
    closed: u64,
) -> Result<(Review, Vec<Signed>), String> {
    let (review, window) = check_unsigned(window_text, &proof.text, now, closed)?;
    let signed = verify_quorum(
        approvers,
        REVIEW_TOOL,
        &proof.text,
        &proof.signatures,
        window.required,
    )
    .map_err(|e| format!("the review: {e}"))?;
    Ok((review, signed))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::approvers::tests::file_with;
    use super::super::grant::Runners;
    use super::super::sshsig::tests::{sign, test_key};
    use super::super::tests::id_at;
    use super::super::{Approvers, sshsig};
    use super::*;

    /// 2026-12-06T10:00:00Z.
    const T: u64 = 1_796_551_200;

    fn window() -> Grant {
        Grant {
            id: id_at(T),
            agent: "agent:deploy-bot".into(),
            break_glass: true,
            tools: vec!["*".into()],
            runners: Runners::Names(vec!["edge-1".into(), "edge-2".into()]),
            args: BTreeMap::new(),
            max_calls: 100,
            max_calls_per_runner: 100,
            required: 2,
            reason: "INC-42: the edge is down".into(),
            expires_at: "2026-12-06T11:00:00Z".into(),
        }
    }

    fn sample(window_text: &str) -> Review {
        Review::of(
            window_text,
            "INC-42: restarted \"consul\" on edge-1\nrunbook updated",
            "2026-12-06T12:00:00Z",
        )
        .unwrap()
    }

    fn signed_by(seeds: &[u8], text: &str) -> ReviewProof {
        ReviewProof {
            text: text.to_owned(),
            signatures: seeds
                .iter()
                .map(|s| Signature::Ssh {
                    signer: format!("p{s}"),
                    signature: sign(&test_key(*s), sshsig::APPROVAL_NAMESPACE, text.as_bytes()),
                })
                .collect(),
        }
    }

    fn people(rules: &str) -> Approvers {
        Approvers::parse(&file_with(&[("alice", 1), ("bob", 2), ("carol", 3)], rules)).unwrap()
    }

    #[test]
    fn the_text_reads_back_the_same_and_nothing_else_does() {
        let window_text = window().text().unwrap();
        let review = sample(&window_text);
        let text = review.text().unwrap();
        assert_eq!(
            text,
            format!(
                "emisar-review/v1\nwindow {}\ngrant sha256:{}\nnote \"INC-42: restarted \\\"consul\\\" on edge-1\\nrunbook updated\"\nreviewed 2026-12-06T12:00:00Z\n",
                id_at(T),
                hex::encode(hash_text(&window_text))
            )
        );
        assert_eq!(Review::parse(&text).unwrap(), review);
        for (from, to, why) in [
            ("emisar-review/v1", "emisar-grant/v1", "first line"),
            ("\nwindow ", "\nwindows ", "expected `window`"),
            (
                "grant sha256:",
                "grant sha256:00",
                "`grant` must be a SHA-256",
            ),
            ("grant sha256:", "grant ", "`sha256:HEX`"),
            ("note \"INC-42", "note INC-42", "JSON string"),
            (
                "\"INC-42: restarted \\\"consul\\\" on edge-1\\nrunbook updated\"",
                "\"\"",
                "`note` is required",
            ),
            (
                "\"INC-42: restarted \\\"consul\\\" on edge-1\\nrunbook updated\"",
                "\"  \\n \"",
                "`note` is required",
            ),
            (
                "reviewed 2026-12-06T12:00:00Z",
                "reviewed today",
                "`reviewed`",
            ),
            ("\nreviewed ", "\nreviewed_at ", "expected `reviewed`"),
        ] {
            let bad = text.replacen(from, to, 1);
            assert_ne!(bad, text, "{from} is in the text");
            let e = Review::parse(&bad).unwrap_err().to_string();
            assert!(e.contains(why), "{from} → {to}: {e}");
        }
        assert!(Review::parse(&format!("{text}extra x\n")).is_err());
        assert!(Review::parse(text.trim_end()).is_err());
        // A JSON string with its own escapes for plain letters is not canonical.
        let e = Review::parse(&text.replace("INC-42", "\\u0049NC-42"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("canonical"), "{e}");
        // A note of 4 KiB is taken, one byte more is refused, naming `note`.
        let long = "n".repeat(MAX_NOTE);
        Review::of(&window_text, &long, "2026-12-06T12:00:00Z").unwrap();
        let e = Review::of(&window_text, &format!("{long}n"), "2026-12-06T12:00:00Z")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`note` is 4097 bytes"), "{e}");
        let e = Review::of(&window_text, "", "2026-12-06T12:00:00Z")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`note` is required"), "{e}");
        // A note with nothing visible (a zero-width space, a bidirectional override, a Hangul
        // filler, a word joiner among spaces) is refused, naming `note`; one visible letter
        // among them is a note.
        for invisible in [
            "\u{200B}",
            "\u{202E}",
            " \u{2060}\n\u{FEFF} ",
            "\u{3164}",
            "\u{E0041}",
        ] {
            let e = Review::of(&window_text, invisible, "2026-12-06T12:00:00Z")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("`note` has no visible character"),
                "{invisible:?}: {e}"
            );
            let bad = text.replacen(
                "\"INC-42: restarted \\\"consul\\\" on edge-1\\nrunbook updated\"",
                &Value::String(invisible.into()).to_string(),
                1,
            );
            assert_ne!(bad, text);
            let e = Review::parse(&bad).unwrap_err().to_string();
            assert!(e.contains("`note`"), "{invisible:?}: {e}");
        }
        Review::of(&window_text, "\u{200B}x", "2026-12-06T12:00:00Z").unwrap();
        // Neither a statement, a decision nor a grant is ever read as a review, nor a review
        // as one of them.
        let statement = super::super::statement::tests::sample().text().unwrap();
        assert!(Review::parse(&statement).is_err());
        assert!(Review::parse(&window_text).is_err());
        assert!(Grant::parse(&text).is_err());
        assert!(super::super::Statement::parse(&text).is_err());
        assert!(super::super::Decision::parse(&text).is_err());
    }

    #[test]
    fn a_review_counts_only_for_its_window_signed_by_as_many_people_as_opened_it() {
        let window_text = window().text().unwrap();
        let text = sample(&window_text).text().unwrap();
        let a = people("[[rule]]\ntools = \"*\"\napprovals = 1\n");
        let now = T + 7200;
        // Revoked at 10:30, before its expiry.
        let closed = T + 1800;
        let (review, signed) =
            check(&a, &window_text, &signed_by(&[1, 2], &text), now, closed).unwrap();
        assert_eq!(review.window, id_at(T));
        assert_eq!(signed.len(), 2);
        let refused = |window_text: &str, proof: &ReviewProof| {
            check(&a, window_text, proof, now, closed).unwrap_err()
        };
        // One person alone does not close a window two opened, whatever the file's own count.
        let e = refused(&window_text, &signed_by(&[1], &text));
        assert!(e.contains("`required 2`"), "{e}");
        let e = refused(&window_text, &signed_by(&[1, 1], &text));
        assert!(e.contains("count once"), "{e}");
        // Signatures over another note do not count for this review.
        let mut proof = signed_by(&[1, 2], &text);
        proof.signatures = signed_by(&[1, 2], &text.replace("runbook", "nothing")).signatures;
        let e = refused(&window_text, &proof);
        assert!(e.contains("signature"), "{e}");
        // The same id over another grant text (a wider window) is another window.
        let wider = Grant {
            runners: Runners::Names(vec!["edge-1".into(), "edge-2".into(), "edge-3".into()]),
            ..window()
        }
        .text()
        .unwrap();
        let e = refused(&wider, &signed_by(&[1, 2], &text));
        assert!(
            e.contains("`grant`: the review binds another grant text"),
            "{e}"
        );
        let other = Grant {
            id: id_at(T + 1),
            ..window()
        }
        .text()
        .unwrap();
        let e = refused(&other, &signed_by(&[1, 2], &text));
        assert!(e.contains("`window`: the review is of window"), "{e}");
        let plain = Grant {
            break_glass: false,
            ..window()
        }
        .text()
        .unwrap();
        let e = refused(&plain, &signed_by(&[1, 2], &sample(&plain).text().unwrap()));
        assert!(e.contains("not a break-glass window"), "{e}");
        // A review from before the window, or from the future, is refused.
        let early = Review::of(&window_text, "x", "2026-12-06T09:59:59Z")
            .unwrap()
            .text()
            .unwrap();
        let e = refused(&window_text, &signed_by(&[1, 2], &early));
        assert!(e.contains("before the window"), "{e}");
        let e = check(
            &a,
            &window_text,
            &signed_by(&[1, 2], &text),
            T + 3600,
            closed,
        )
        .unwrap_err();
        assert!(e.contains("in the future"), "{e}");
        // A review signed while the window was still open (before its close) is refused,
        // naming `reviewed`, whoever signed it; at the close it holds.
        let while_open = Review::of(&window_text, "x", "2026-12-06T10:29:59Z")
            .unwrap()
            .text()
            .unwrap();
        let e = refused(&window_text, &signed_by(&[1, 2], &while_open));
        assert!(
            e.contains("`reviewed`: 2026-12-06T10:29:59Z is before the window closed"),
            "{e}"
        );
        let e = check_unsigned(&window_text, &while_open, now, closed).unwrap_err();
        assert!(e.contains("before the window closed"), "{e}");
        let at_close = Review::of(&window_text, "x", "2026-12-06T10:30:00Z")
            .unwrap()
            .text()
            .unwrap();
        check(
            &a,
            &window_text,
            &signed_by(&[1, 2], &at_close),
            now,
            closed,
        )
        .unwrap();
        // The file's rule for reviews holds above the window's count.
        let three = people(
            "[[rule]]\ntools = \"emisar.break_glass.review\"\napprovals = 3\n[[rule]]\ntools = \"*\"\napprovals = 1\n",
        );
        let e = check(
            &three,
            &window_text,
            &signed_by(&[1, 2], &text),
            now,
            closed,
        )
        .unwrap_err();
        assert!(e.contains("needs 3"), "{e}");
        check(
            &three,
            &window_text,
            &signed_by(&[1, 2, 3], &text),
            now,
            closed,
        )
        .unwrap();
        // A key outside the file does not count.
        let e = refused(&window_text, &signed_by(&[1, 7], &text));
        assert!(e.contains("not in the approvers file"), "{e}");
    }
}
