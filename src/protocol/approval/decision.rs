//! People's decision on a halted rollout, signed like an approval: resume it (run the runners
//! it never called, in their signed waves), retry it (run the runner whose write or gate
//! failed again, then the rest), or abort it.
//!
//! ```text
//! emisar-rollout-decision/v1
//! decision 0193f4d0-…
//! approval 0193f4c2-…
//! statement sha256:<hex>
//! halted 2
//! choice retry
//! runners edge-2,edge-4,edge-5
//! expires 2026-12-03T14:20:00Z
//! ```
//!
//! One line per field, in this order, each ending in a newline. `decision` is the decision's
//! own UUIDv7 (its time is when it was proposed, so its lifetime is bounded as an approval's
//! is); `statement` the SHA-256 of the approval's statement text, so a decision holds only for
//! the write people signed; `halted` the wave the rollout stopped in; `runners` the runners
//! the decision lets run, sorted (`-` for an abort). The first line is not a statement's, and
//! a statement's is not this one's, so no signature over one is ever read as the other.
//!
//! *Invariant:* a runner runs under a decision only when the decision names it, binds the
//! statement it carries and is signed, by distinct people of its approvers file, as many as
//! the approval itself needed, before the decision's expiry ([`check`]).

use super::statement::{self, StatementError, hash_text, parse_utc};
use super::{Signature, Signed, check_lifetime, verify_quorum};

/// The first line: the format and its version.
pub const VERSION_LINE: &str = "emisar-rollout-decision/v1";

/// What people decided about a halted rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Choice {
    /// Run the runners the halt left unrun, in their waves; the failed one stays as it is.
    Resume,
    /// Run the runner whose write or gate failed again, then the runners left unrun.
    Retry,
    /// Run nothing more: the rollout ends where it halted.
    Abort,
}

impl Choice {
    pub fn as_str(self) -> &'static str {
        match self {
            Choice::Resume => "resume",
            Choice::Retry => "retry",
            Choice::Abort => "abort",
        }
    }

    pub fn parse(s: &str) -> Result<Choice, String> {
        match s {
            "resume" => Ok(Choice::Resume),
            "retry" => Ok(Choice::Retry),
            "abort" => Ok(Choice::Abort),
            _ => Err(format!(
                "`choice` must be resume, retry or abort, not `{s}`"
            )),
        }
    }
}

/// A decision on a halted rollout: every field is one line of [`Decision::text`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The decision's own id, a UUIDv7.
    pub id: String,
    pub approval_id: String,
    /// Hex SHA-256 of the approval's statement text.
    pub statement_sha256: String,
    /// The wave (1-based) the rollout halted in.
    pub halted_wave: u32,
    pub choice: Choice,
    /// The runners it lets run, sorted; empty for an abort.
    pub runners: Vec<String>,
    /// RFC 3339 UTC: no runner runs under this decision after it.
    pub expires_at: String,
}

/// A decision as an execution carries it to a runner: its text and people's signatures over
/// it (none where the runners do not check signatures).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionProof {
    pub text: String,
    #[serde(default)]
    pub signatures: Vec<Signature>,
}

fn err(msg: impl Into<String>) -> StatementError {
    StatementError(format!("rollout decision: {}", msg.into()))
}

impl Decision {
    /// The canonical text, the bytes a signature covers.
    pub fn text(&self) -> Result<String, StatementError> {
        self.check()?;
        let runners = if self.runners.is_empty() {
            "-".to_owned()
        } else {
            self.runners.join(",")
        };
        Ok(format!(
            "{VERSION_LINE}\ndecision {}\napproval {}\nstatement sha256:{}\nhalted {}\nchoice {}\nrunners {runners}\nexpires {}\n",
            self.id,
            self.approval_id,
            self.statement_sha256,
            self.halted_wave,
            self.choice.as_str(),
            self.expires_at,
        ))
    }

    /// `expires_at` as seconds since the Unix epoch.
    pub fn expires_unix(&self) -> Result<u64, StatementError> {
        parse_utc(&self.expires_at).ok_or_else(|| err("`expires` must be YYYY-MM-DDTHH:MM:SSZ"))
    }

    fn check(&self) -> Result<(), StatementError> {
        let word = |field: &str, v: &str| {
            if v.is_empty()
                || v.len() > 512
                || v.chars()
                    .any(|c| c.is_whitespace() || c.is_control() || c == ',')
            {
                return Err(err(format!(
                    "`{field}` must be 1 to 512 bytes without whitespace, a control character or a comma"
                )));
            }
            Ok(())
        };
        word("decision", &self.id)?;
        word("approval", &self.approval_id)?;
        self.expires_unix()?;
        if self.statement_sha256.len() != 64
            || !self
                .statement_sha256
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(err("`statement` must be a SHA-256 in lowercase hex"));
        }
        if self.halted_wave == 0 || self.halted_wave as usize > statement::MAX_WAVES {
            return Err(err(format!(
                "`halted` must be a wave, 1 to {}",
                statement::MAX_WAVES
            )));
        }
        for r in &self.runners {
            word("runners", r)?;
        }
        if !self.runners.is_sorted() || self.runners.windows(2).any(|w| w[0] == w[1]) {
            return Err(err("`runners` must be sorted, each once"));
        }
        match (self.choice, self.runners.is_empty()) {
            (Choice::Abort, false) => Err(err("`runners`: an abort lets no runner run: `-`")),
            (Choice::Resume | Choice::Retry, true) => Err(err(format!(
                "`runners`: a {} names the runners it lets run",
                self.choice.as_str()
            ))),
            _ => Ok(()),
        }
    }

    /// Reads a decision back from its text; only text [`Decision::text`] would write (the
    /// same bytes) is accepted.
    pub fn parse(text: &str) -> Result<Decision, StatementError> {
        if text.len() > 64 * 1024 {
            return Err(err("longer than 64 KiB"));
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
        let id = take("decision")?.to_owned();
        let approval_id = take("approval")?.to_owned();
        let statement_sha256 = take("statement")?
            .strip_prefix("sha256:")
            .ok_or_else(|| err("`statement` must be `sha256:HEX`"))?
            .to_owned();
        let halted_wave = take("halted")?
            .parse::<u32>()
            .map_err(|_| err("`halted` must be a wave number"))?;
        let choice = Choice::parse(take("choice")?).map_err(err)?;
        let runners = match take("runners")? {
            "-" => Vec::new(),
            names => names.split(',').map(str::to_owned).collect(),
        };
        let expires_at = take("expires")?.to_owned();
        if lines.next().is_some() {
            return Err(err("a line follows `expires`"));
        }
        let decision = Decision {
            id,
            approval_id,
            statement_sha256,
            halted_wave,
            choice,
            runners,
            expires_at,
        };
        if decision.text()? != text {
            return Err(err("not in canonical form"));
        }
        Ok(decision)
    }
}

/// What a checker knows of the call a decision must hold for.
pub struct Held<'a> {
    pub tool: &'a str,
    pub approval_id: &'a str,
    /// The approval's statement text, as the call carries it (its own signatures are checked
    /// beside this).
    pub statement: &'a str,
    /// How many people the approval needed (its statement's `required`).
    pub required: u32,
    /// The runner the call runs on (None: any, for an offline check).
    pub runner: Option<&'a str>,
}

/// The one check of a signed decision, which the server (when a person signs), the runner
/// (before a write runs under it) and an offline audit use: it parses, binds this approval and
/// its statement, names the runner, lets it run (not an abort), lives within `max_lifetime`
/// and has not expired at `now`, and is signed by enough distinct people of `approvers`: the
/// file's rule for the tool and the approval's own count.
pub fn check(
    approvers: &super::Approvers,
    held: &Held<'_>,
    proof: &DecisionProof,
    now: u64,
    max_lifetime: u64,
) -> Result<(Decision, Vec<Signed>), String> {
    let decision = bound(held, &proof.text, now, max_lifetime)?;
    let signed = verify_quorum(
        approvers,
        held.tool,
        &proof.text,
        &proof.signatures,
        held.required,
    )
    .map_err(|e| format!("the rollout decision: {e}"))?;
    Ok((decision, signed))
}

/// A decision's text, read and held to the call (everything [`check`] does but the
/// signatures): for a runner that does not check people's signatures, and for [`check`].
pub fn bound(held: &Held<'_>, text: &str, now: u64, max_lifetime: u64) -> Result<Decision, String> {
    let decision = Decision::parse(text).map_err(|e| e.to_string())?;
    if decision.approval_id != held.approval_id {
        return Err(format!(
            "the rollout decision is about approval {}, not {}",
            decision.approval_id, held.approval_id
        ));
    }
    if decision.statement_sha256 != hex::encode(hash_text(held.statement)) {
        return Err(
            "the rollout decision binds another statement than the one this call carries".into(),
        );
    }
    if decision.choice == Choice::Abort {
        return Err("the rollout decision is an abort: nothing runs under it".into());
    }
    if let Some(runner) = held.runner
        && !decision.runners.iter().any(|r| r == runner)
    {
        return Err(format!(
            "the rollout decision does not name this runner (`{runner}`)"
        ));
    }
    let expires = decision.expires_unix().map_err(|e| e.to_string())?;
    check_lifetime(&decision.id, expires, now, max_lifetime).map_err(|e| {
        format!(
            "the rollout decision: {}",
            e.replace("`approval`", "`decision`")
        )
    })?;
    Ok(decision)
}

#[cfg(test)]
mod tests {
    use super::super::approvers::tests::file_with;
    use super::super::sshsig::tests::{sign, test_key};
    use super::super::tests::id_at;
    use super::super::{Approvers, sshsig};
    use super::*;

    const T: u64 = 1_796_551_200;

    fn sample() -> Decision {
        Decision {
            id: id_at(T),
            approval_id: id_at(T - 600),
            statement_sha256: hex::encode(hash_text("the statement\n")),
            halted_wave: 2,
            choice: Choice::Retry,
            runners: vec!["edge-2".into(), "edge-4".into()],
            expires_at: "2026-12-06T10:20:00Z".into(),
        }
    }

    fn held(runner: Option<&'static str>) -> Held<'static> {
        Held {
            tool: "t.x",
            approval_id: Box::leak(id_at(T - 600).into_boxed_str()),
            statement: "the statement\n",
            required: 2,
            runner,
        }
    }

    fn signed_by(seeds: &[u8], text: &str) -> DecisionProof {
        DecisionProof {
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

    fn two_people() -> Approvers {
        Approvers::parse(&file_with(
            &[("alice", 1), ("bob", 2)],
            "[[rule]]\ntools = \"*\"\napprovals = 2\n",
        ))
        .unwrap()
    }

    #[test]
    fn the_text_reads_back_the_same_and_nothing_else_does() {
        let d = sample();
        let text = d.text().unwrap();
        assert!(text.starts_with("emisar-rollout-decision/v1\ndecision "));
        assert!(text.contains("\nhalted 2\nchoice retry\nrunners edge-2,edge-4\n"));
        assert_eq!(Decision::parse(&text).unwrap(), d);
        let abort = Decision {
            choice: Choice::Abort,
            runners: vec![],
            ..sample()
        };
        assert!(abort.text().unwrap().contains("\nrunners -\n"));
        assert_eq!(Decision::parse(&abort.text().unwrap()).unwrap(), abort);
        for (from, to, why) in [
            ("runners edge-2,edge-4", "runners edge-4,edge-2", "sorted"),
            (
                "runners edge-2,edge-4",
                "runners edge-2,edge-2",
                "each once",
            ),
            ("choice retry", "choice rerun", "`choice`"),
            ("halted 2", "halted 0", "`halted`"),
            ("halted 2", "halted  2", "wave number"),
            (
                "emisar-rollout-decision/v1",
                "emisar-approval/v2",
                "first line",
            ),
            ("runners edge-2,edge-4", "runners -", "names the runners"),
        ] {
            let bad = text.replacen(from, to, 1);
            let e = Decision::parse(&bad).unwrap_err().to_string();
            assert!(e.contains(why), "{from} → {to}: {e}");
        }
        assert!(Decision::parse(&format!("{text}extra x\n")).is_err());
        assert!(Decision::parse(text.trim_end()).is_err());
        // A statement is never read as a decision.
        let statement = super::super::statement::tests::sample().text().unwrap();
        assert!(Decision::parse(&statement).is_err());
    }

    #[test]
    fn a_decision_holds_only_for_its_approval_statement_and_runners_signed_by_enough_people() {
        let text = sample().text().unwrap();
        let now = T + 10;
        let a = two_people();
        let (d, signed) = check(
            &a,
            &held(Some("edge-2")),
            &signed_by(&[1, 2], &text),
            now,
            1260,
        )
        .unwrap();
        assert_eq!(d.choice, Choice::Retry);
        assert_eq!(signed.len(), 2);
        let refused = |held: &Held<'_>, proof: &DecisionProof, now: u64| {
            check(&a, held, proof, now, 1260).unwrap_err()
        };
        let e = refused(&held(Some("edge-3")), &signed_by(&[1, 2], &text), now);
        assert!(e.contains("does not name this runner"), "{e}");
        let e = refused(&held(Some("edge-2")), &signed_by(&[1], &text), now);
        assert!(e.contains("needs 2"), "{e}");
        let other = Held {
            statement: "another statement\n",
            ..held(Some("edge-2"))
        };
        let e = refused(&other, &signed_by(&[1, 2], &text), now);
        assert!(e.contains("another statement"), "{e}");
        let other = Held {
            approval_id: "0193f4c2-7a10-7cc0-9f00-000000000001",
            ..held(Some("edge-2"))
        };
        let e = refused(&other, &signed_by(&[1, 2], &text), now);
        assert!(e.contains("about approval"), "{e}");
        let e = refused(&held(Some("edge-2")), &signed_by(&[1, 2], &text), T + 3600);
        assert!(e.contains("expired"), "{e}");
        // Signatures over another decision's text do not count for this one.
        let mut proof = signed_by(&[1, 2], &text);
        proof.signatures = signed_by(&[1, 2], &text.replace("retry", "resume")).signatures;
        let e = refused(&held(Some("edge-2")), &proof, now);
        assert!(e.contains("signature"), "{e}");
        let abort = Decision {
            choice: Choice::Abort,
            runners: vec![],
            ..sample()
        }
        .text()
        .unwrap();
        let e = refused(&held(None), &signed_by(&[1, 2], &abort), now);
        assert!(e.contains("abort"), "{e}");
        let long = Decision {
            expires_at: "2026-12-06T12:00:00Z".into(),
            ..sample()
        }
        .text()
        .unwrap();
        let e = refused(&held(Some("edge-2")), &signed_by(&[1, 2], &long), now);
        assert!(e.contains("`expires`"), "{e}");
    }
}
