//! The statement a person signs to approve one risk:high write: one canonical, versioned text
//! that names exactly what will run.
//!
//! ```text
//! emisar-approval/v2
//! approval 0193f4c2-…
//! tool linux.systemctl_restart
//! pack sha256:<hex>
//! args sha256:<hex>
//! runner edge-1 preview none
//! runner edge-2 preview sha256:<hex>
//! runner edge-3 preview none
//! wave 1 edge-1
//! wave 2 edge-2,edge-3
//! pause 30
//! required 2
//! policy sha256:<hex>
//! requester agent:deploy-bot
//! expires 2026-12-03T14:00:00Z
//! ```
//!
//! One line per field, `key value`, in this order, runners sorted by name, each line ending in
//! a newline; a value never holds whitespace. `args` is the SHA-256 of the canonical JSON of the
//! [`signed_args`]: the arguments the runner receives, each secret param replaced by a salted
//! commitment (`commit:sha256:HEX`), so a signer recomputes the digest from arguments it can show
//! and the runner recomputes it from the values it receives and the salt the call carries;
//! a runner's `preview` is the SHA-256 of the canonical JSON of the preview values it sealed and
//! will execute with (`none` when the tool has no preview). The `wave` lines are the rollout's
//! [`Plan`]: the runners of each wave in order (each wave's names sorted, every runner in
//! exactly one wave), and `pause` the seconds between a wave's gate and the next wave; the
//! gate itself is the tool's `verify`, covered by the pack digest. The signed bytes are exactly
//! [`Statement::text`]; a passkey signs over [`Statement::hash`] (the WebAuthn challenge).
//!
//! *Invariant:* a runner accepts a signature only over the statement it rebuilds itself from
//! the call it received (approval id from the server's signed token, tool, its own pack digest,
//! the digest of the arguments and of the preview values in the request), so nothing between
//! the person and the node can change a byte of what runs without the signature failing.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// The first line: the format and its version. A runner refuses any other. v2 added the
/// rollout's plan (`wave` and `pause`).
pub const VERSION_LINE: &str = "emisar-approval/v2";

/// The most waves a plan may have (one per runner of the largest request).
pub const MAX_WAVES: usize = 1000;

/// How an approved write rolls out: wave by wave, in order; each wave's runners at once,
/// then its health gate, then `pause_secs`, then the next. A runner executes only in the wave
/// the plan places it in (`CallRequest::wave`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Plan {
    /// The waves in order, each the names of its runners, sorted.
    pub waves: Vec<Vec<String>>,
    /// Seconds between a wave's gate passing and the next wave starting.
    pub pause_secs: u32,
}

impl Plan {
    /// Every runner in one wave, no pause: a request with one runner.
    pub fn one_wave<'a>(runners: impl IntoIterator<Item = &'a String>) -> Plan {
        let mut wave: Vec<String> = runners.into_iter().cloned().collect();
        wave.sort();
        Plan {
            waves: vec![wave],
            pause_secs: 0,
        }
    }

    /// The wave (1-based) that places `runner`, if any.
    pub fn wave_of(&self, runner: &str) -> Option<u32> {
        self.waves
            .iter()
            .position(|w| w.iter().any(|r| r == runner))
            .map(|i| i as u32 + 1)
    }

    /// The plan's rule, against the statement's runners: at least one wave, none empty, each
    /// sorted, every runner in exactly one wave and no other name.
    fn check(&self, runners: &BTreeMap<String, Option<String>>) -> Result<(), StatementError> {
        if self.waves.is_empty() || self.waves.len() > MAX_WAVES {
            return Err(err(format!("`wave`: a plan has 1 to {MAX_WAVES} waves")));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, wave) in self.waves.iter().enumerate() {
            let n = i + 1;
            if wave.is_empty() {
                return Err(err(format!("`wave {n}` names no runner")));
            }
            if !wave.is_sorted() {
                return Err(err(format!("`wave {n}`: its runners must be sorted")));
            }
            for runner in wave {
                if !runners.contains_key(runner) {
                    return Err(err(format!(
                        "`wave {n}` names `{runner}`, which no `runner` line names"
                    )));
                }
                if !seen.insert(runner.as_str()) {
                    return Err(err(format!("runner `{runner}` is in two waves")));
                }
            }
        }
        if let Some(missing) = runners.keys().find(|r| !seen.contains(r.as_str())) {
            return Err(err(format!("runner `{missing}` is in no wave")));
        }
        Ok(())
    }
}

/// What a person approves. Every field is one line of [`Statement::text`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    pub approval_id: String,
    pub tool: String,
    /// Hex SHA-256 of the pack the tool comes from.
    pub pack_sha256: String,
    /// Hex SHA-256 of the canonical JSON of the arguments the runners receive.
    pub args_sha256: String,
    /// Every target runner, with the hex SHA-256 of the canonical JSON of the preview values it
    /// sealed (None: the tool has no preview).
    pub runners: BTreeMap<String, Option<String>>,
    /// The rollout: which runners run in which wave, and the pause between waves.
    pub plan: Plan,
    /// How many people's approvals the request needed when it was made.
    pub required: u32,
    /// Hex SHA-256 of the policy that set `required`.
    pub policy_sha256: String,
    /// The audit actor who asked, e.g. `agent:deploy-bot`.
    pub requester: String,
    /// RFC 3339 UTC: no runner executes under this statement after it.
    pub expires_at: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("approval statement: {0}")]
pub struct StatementError(pub String);

fn err(msg: impl Into<String>) -> StatementError {
    StatementError(msg.into())
}

impl Statement {
    /// The canonical text, the bytes a signature covers. Fails when a field could not be read
    /// back the same (whitespace or a control character in a value, no runner).
    pub fn text(&self) -> Result<String, StatementError> {
        self.check()?;
        let mut out = String::with_capacity(512);
        out.push_str(VERSION_LINE);
        out.push('\n');
        let mut line = |k: &str, v: &str| {
            out.push_str(k);
            out.push(' ');
            out.push_str(v);
            out.push('\n');
        };
        line("approval", &self.approval_id);
        line("tool", &self.tool);
        line("pack", &format!("sha256:{}", self.pack_sha256));
        line("args", &format!("sha256:{}", self.args_sha256));
        for (runner, preview) in &self.runners {
            let preview = preview
                .as_ref()
                .map_or_else(|| "none".to_owned(), |d| format!("sha256:{d}"));
            line("runner", &format!("{runner} preview {preview}"));
        }
        for (i, wave) in self.plan.waves.iter().enumerate() {
            line("wave", &format!("{} {}", i + 1, wave.join(",")));
        }
        line("pause", &self.plan.pause_secs.to_string());
        line("required", &self.required.to_string());
        line("policy", &format!("sha256:{}", self.policy_sha256));
        line("requester", &self.requester);
        line("expires", &self.expires_at);
        Ok(out)
    }

    /// `expires_at` as seconds since the Unix epoch.
    pub fn expires_unix(&self) -> Result<u64, StatementError> {
        parse_utc(&self.expires_at)
            .ok_or_else(|| err("`expires` must be UTC as YYYY-MM-DDTHH:MM:SSZ"))
    }

    /// SHA-256 of [`Statement::text`]: the WebAuthn challenge, and what the portal shows.
    pub fn hash(&self) -> Result<[u8; 32], StatementError> {
        Ok(hash_text(&self.text()?))
    }

    fn check(&self) -> Result<(), StatementError> {
        let word = |field: &str, v: &str| {
            if v.is_empty() || v.len() > 512 {
                return Err(err(format!("`{field}` must be 1 to 512 bytes")));
            }
            if v.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(err(format!(
                    "`{field}` must hold no whitespace or control character"
                )));
            }
            Ok(())
        };
        word("approval", &self.approval_id)?;
        word("tool", &self.tool)?;
        word("requester", &self.requester)?;
        word("expires", &self.expires_at)?;
        self.expires_unix()?;
        hex_digest("pack", &self.pack_sha256)?;
        hex_digest("args", &self.args_sha256)?;
        hex_digest("policy", &self.policy_sha256)?;
        if self.runners.is_empty() {
            return Err(err("`runner`: a statement names at least one runner"));
        }
        for (runner, preview) in &self.runners {
            word("runner", runner)?;
            if let Some(d) = preview {
                hex_digest("runner preview", d)?;
            }
        }
        self.plan.check(&self.runners)?;
        if self.required == 0 {
            return Err(err("`required` must be at least 1"));
        }
        Ok(())
    }

    /// Reads a statement back from its text; only text [`Statement::text`] would write (the
    /// same bytes) is accepted.
    pub fn parse(text: &str) -> Result<Statement, StatementError> {
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
        let mut fields = Vec::new();
        for line in lines {
            let (k, v) = line
                .split_once(' ')
                .ok_or_else(|| err("every line after the first is `key value`"))?;
            fields.push((k, v));
        }
        let mut fields = fields.into_iter().peekable();
        let take = |fields: &mut std::iter::Peekable<std::vec::IntoIter<(&str, &str)>>,
                    key: &str| match fields.next() {
            Some((k, v)) if k == key => Ok(v.to_owned()),
            Some((k, _)) => Err(err(format!("expected `{key}`, found `{k}`"))),
            None => Err(err(format!("`{key}` is missing"))),
        };
        let approval_id = take(&mut fields, "approval")?;
        let tool = take(&mut fields, "tool")?;
        let pack_sha256 = strip_sha256("pack", &take(&mut fields, "pack")?)?;
        let args_sha256 = strip_sha256("args", &take(&mut fields, "args")?)?;
        let mut runners = BTreeMap::new();
        while let Some((_, v)) = fields.next_if(|(k, _)| *k == "runner") {
            let mut parts = v.split(' ');
            let (Some(name), Some("preview"), Some(preview), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err(err(
                    "a runner line is `runner NAME preview none|sha256:HEX`",
                ));
            };
            let preview = match preview {
                "none" => None,
                d => Some(strip_sha256("runner preview", d)?),
            };
            if runners.insert(name.to_owned(), preview).is_some() {
                return Err(err(format!("runner `{name}` is named twice")));
            }
        }
        let mut waves = Vec::new();
        while let Some((_, v)) = fields.next_if(|(k, _)| *k == "wave") {
            let want = (waves.len() + 1).to_string();
            let Some((n, names)) = v.split_once(' ') else {
                return Err(err("a wave line is `wave N RUNNER,RUNNER…`"));
            };
            if n != want {
                return Err(err(format!("expected `wave {want}`, found `wave {n}`")));
            }
            waves.push(names.split(',').map(str::to_owned).collect::<Vec<_>>());
        }
        let pause_secs = take(&mut fields, "pause")?
            .parse::<u32>()
            .map_err(|_| err("`pause` must be a whole number of seconds"))?;
        let plan = Plan { waves, pause_secs };
        let required = take(&mut fields, "required")?
            .parse::<u32>()
            .map_err(|_| err("`required` must be a whole number"))?;
        let policy_sha256 = strip_sha256("policy", &take(&mut fields, "policy")?)?;
        let requester = take(&mut fields, "requester")?;
        let expires_at = take(&mut fields, "expires")?;
        if fields.next().is_some() {
            return Err(err("a line follows `expires`"));
        }
        let statement = Statement {
            approval_id,
            tool,
            pack_sha256,
            args_sha256,
            runners,
            plan,
            required,
            policy_sha256,
            requester,
            expires_at,
        };
        if statement.text()? != text {
            return Err(err(
                "not in canonical form (runners sorted, one space between words)",
            ));
        }
        Ok(statement)
    }
}

/// The prefix of a secret param's value in [`signed_args`].
pub const COMMIT_PREFIX: &str = "commit:sha256:";

/// The arguments as a statement's `args` digest covers them: every secret param's value
/// replaced by `commit:sha256:HEX`, the SHA-256 of the salt, a NUL and the value's canonical
/// JSON. The salt is the server's, random to anyone without its audit key, per approval; it
/// travels with the call to the runner and never into the audit log, so the commitment hides
/// a short secret from everyone who reads the log or the statement. A tool with secret params
/// needs a salt: without one, an error names the param.
pub fn signed_args(
    args: &serde_json::Map<String, serde_json::Value>,
    secret: &[&str],
    salt: Option<&str>,
) -> Result<serde_json::Map<String, serde_json::Value>, StatementError> {
    let mut out = args.clone();
    for name in secret {
        let Some(value) = out.get_mut(*name) else {
            continue;
        };
        let salt = salt.filter(|s| !s.is_empty()).ok_or_else(|| {
            err(format!(
                "`{name}` is a secret param and the call carries no salt for its commitment"
            ))
        })?;
        let mut h = Sha256::new();
        h.update(salt.as_bytes());
        h.update([0u8]);
        h.update(crate::digest::canonical_json(value).as_bytes());
        *value = serde_json::Value::String(format!("{COMMIT_PREFIX}{}", hex::encode(h.finalize())));
    }
    Ok(out)
}

/// The hex SHA-256 a statement's `args` line carries for `args` ([`signed_args`]).
pub fn args_digest(
    args: &serde_json::Map<String, serde_json::Value>,
    secret: &[&str],
    salt: Option<&str>,
) -> Result<String, StatementError> {
    Ok(crate::digest::json_digest(&serde_json::Value::Object(
        signed_args(args, secret, salt)?,
    )))
}

/// SHA-256 of a statement's text.
pub fn hash_text(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

/// Seconds since the epoch of `YYYY-MM-DDTHH:MM:SSZ`, the one form a statement's expiry takes
/// (by hand: the runner links no date library, and this is the days-from-civil formula).
pub fn parse_utc(t: &str) -> Option<u64> {
    let b = t.as_bytes();
    if b.len() != 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
        || b[19] != b'Z'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = t.get(r)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days_in_month = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&m)
        || d < 1
        || d > days_in_month[(m - 1) as usize]
        || hh > 23
        || mm > 59
        || ss > 59
    {
        return None;
    }
    let (y2, m2) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * m2 + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss).ok()
}

fn hex_digest(field: &str, v: &str) -> Result<(), StatementError> {
    if v.len() == 64 && v.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(())
    } else {
        Err(err(format!("`{field}` must be a SHA-256 in lowercase hex")))
    }
}

fn strip_sha256(field: &str, v: &str) -> Result<String, StatementError> {
    let d = v
        .strip_prefix("sha256:")
        .ok_or_else(|| err(format!("`{field}` must be `sha256:HEX`")))?;
    hex_digest(field, d)?;
    Ok(d.to_owned())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample() -> Statement {
        Statement {
            approval_id: "0193f4c2-7a10-7cc0-9f00-000000000001".into(),
            tool: "linux.systemctl_restart".into(),
            pack_sha256: "a".repeat(64),
            args_sha256: "b".repeat(64),
            runners: BTreeMap::from([
                ("edge-2".to_owned(), Some("c".repeat(64))),
                ("edge-1".to_owned(), None),
                ("edge-3".to_owned(), None),
            ]),
            plan: Plan {
                waves: vec![
                    vec!["edge-1".into()],
                    vec!["edge-2".into(), "edge-3".into()],
                ],
                pause_secs: 30,
            },
            required: 2,
            policy_sha256: "d".repeat(64),
            requester: "agent:deploy-bot".into(),
            expires_at: "2026-12-03T14:00:00Z".into(),
        }
    }

    #[test]
    fn text_is_one_line_per_field_in_order_with_runners_sorted() {
        let text = sample().text().unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "emisar-approval/v2");
        assert_eq!(lines[1], "approval 0193f4c2-7a10-7cc0-9f00-000000000001");
        assert_eq!(lines[5], "runner edge-1 preview none");
        assert_eq!(
            lines[6],
            format!("runner edge-2 preview sha256:{}", "c".repeat(64))
        );
        assert_eq!(lines[8], "wave 1 edge-1");
        assert_eq!(lines[9], "wave 2 edge-2,edge-3");
        assert_eq!(lines[10], "pause 30");
        assert_eq!(lines[14], "expires 2026-12-03T14:00:00Z");
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn parse_reads_back_exactly_what_text_writes() {
        let s = sample();
        let text = s.text().unwrap();
        assert_eq!(Statement::parse(&text).unwrap(), s);
        assert_eq!(hash_text(&text), s.hash().unwrap());
    }

    #[test]
    fn parse_refuses_anything_but_the_canonical_text() {
        let text = sample().text().unwrap();
        let cases = [
            text.replace("emisar-approval/v2", "emisar-approval/v1"),
            // The plan: waves out of order, a runner moved or left out, a bad pause.
            text.replace("wave 1 edge-1\nwave 2", "wave 2 edge-1\nwave 1"),
            text.replace("wave 2 edge-2,edge-3", "wave 2 edge-3,edge-2"),
            text.replace("wave 1 edge-1", "wave 1 edge-1,edge-2"),
            text.replace("wave 2 edge-2,edge-3", "wave 2 edge-2"),
            text.replace("wave 2 edge-2,edge-3\n", ""),
            text.replace("pause 30", "pause -1"),
            text.replace("pause 30\n", ""),
            text.trim_end().to_owned(),
            text.replace("required 2", "required  2"),
            text.replace("required 2", "required two"),
            text.replace("args sha256:", "args md5:"),
            text.replace("tool linux", "tool  linux"),
            format!("{text}extra line\n"),
            // Runners out of order.
            text.replace("edge-1 preview none", "edge-3 preview none"),
        ];
        for case in cases {
            assert!(Statement::parse(&case).is_err(), "accepted:\n{case}");
        }
    }

    #[test]
    fn expiry_is_read_as_utc_seconds() {
        assert_eq!(parse_utc("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_utc("2026-12-03T14:00:00Z"), Some(1_796_306_400));
        assert_eq!(parse_utc("2024-02-29T23:59:59Z"), Some(1_709_251_199));
        for bad in [
            "2026-02-30T00:00:00Z",
            "2026-12-03T14:00:00",
            "2026-12-03 14:00:00Z",
            "2026-13-01T00:00:00Z",
            "+026-12-03T14:00:00Z",
        ] {
            assert_eq!(parse_utc(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_secret_is_signed_as_a_salted_commitment() {
        let args = serde_json::json!({"unit": "cron", "password": "hunter2"});
        let args = args.as_object().unwrap();
        let a = signed_args(args, &["password"], Some("salt-1")).unwrap();
        assert_eq!(a["unit"], "cron");
        let c = a["password"].as_str().unwrap();
        assert!(
            c.starts_with(COMMIT_PREFIX) && !c.contains("hunter2"),
            "{c}"
        );
        // Another salt or another value is another commitment; the same ones, the same.
        let b = signed_args(args, &["password"], Some("salt-2")).unwrap();
        assert_ne!(a["password"], b["password"]);
        assert_eq!(a, signed_args(args, &["password"], Some("salt-1")).unwrap());
        let other = serde_json::json!({"unit": "cron", "password": "hunter3"});
        let o = signed_args(other.as_object().unwrap(), &["password"], Some("salt-1")).unwrap();
        assert_ne!(a["password"], o["password"]);
        let e = signed_args(args, &["password"], None).unwrap_err();
        assert!(e.0.contains("`password`"), "{e}");
        // No secret param: the arguments themselves.
        assert_eq!(&signed_args(args, &[], None).unwrap(), args);
    }

    #[test]
    fn the_plan_places_each_runner_in_one_wave() {
        let s = sample();
        assert_eq!(s.plan.wave_of("edge-1"), Some(1));
        assert_eq!(s.plan.wave_of("edge-3"), Some(2));
        assert_eq!(s.plan.wave_of("edge-9"), None);
        let mut two = sample();
        two.plan.waves[1].insert(0, "edge-1".into());
        assert!(two.text().unwrap_err().0.contains("two waves"));
        let mut none = sample();
        none.plan.waves.pop();
        assert!(none.text().unwrap_err().0.contains("in no wave"));
        let mut stranger = sample();
        stranger.plan.waves[0].push("edge-9".into());
        assert!(stranger.text().unwrap_err().0.contains("no `runner` line"));
        let one = Plan::one_wave(s.runners.keys());
        assert_eq!(one.waves, vec![vec!["edge-1", "edge-2", "edge-3"]]);
    }

    #[test]
    fn text_refuses_values_that_would_not_read_back() {
        let mut s = sample();
        s.requester = "agent:x\nrequired 1".into();
        assert!(s.text().unwrap_err().0.contains("requester"));
        let mut s = sample();
        s.runners.clear();
        assert!(s.text().is_err());
        let mut s = sample();
        s.args_sha256 = "B".repeat(64);
        assert!(s.text().unwrap_err().0.contains("args"));
    }
}
