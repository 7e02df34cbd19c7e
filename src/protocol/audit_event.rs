//! An audit event as stored and hashed: what the server appends and what a runner checks
//! when a call carries a witnessed proof of its approval (`protocol::witnessed`). Pure.
//!
//! The event text is written directly ([`EventText::write`]): the keys are fixed, so they are
//! emitted in sorted order into one buffer, strings escaped by serde_json, and `args` and
//! `detail` spliced in as canonical JSON text. `hash = sha256(event text)` (see
//! `server/audit/chain.rs` for the chain built from it).

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::digest::canonical_json;

/// A stored event.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct Event {
    pub seq: i64,
    pub id: String,
    /// RFC 3339 UTC with microseconds, the exact text that was hashed.
    pub at: String,
    pub actor: String,
    pub kind: String,
    pub tool: Option<String>,
    pub runner: Option<String>,
    pub args: Option<Value>,
    pub reason: Option<String>,
    pub call_id: Option<String>,
    pub approval_id: Option<String>,
    pub outcome: Option<String>,
    pub result_digest: Option<String>,
    pub detail: Option<Value>,
    pub prev_hash: String,
    pub hash: String,
    /// The format of the hash input (see `server::audit::hash_v`).
    pub hash_v: i16,
}

impl Event {
    /// The hash this event should carry, from its other fields (its JSON fields as they are
    /// in memory, canonicalised).
    pub fn compute_hash(&self) -> String {
        let args = self.args.as_ref().map(canonical_json);
        let detail = self.detail.as_ref().map(canonical_json);
        hex::encode(
            self.text(args.as_deref(), detail.as_deref())
                .hash(&mut Vec::new()),
        )
    }

    /// The fields as hashed, with `args` and `detail` given as their canonical JSON text.
    pub fn text<'a>(&'a self, args: Option<&'a str>, detail: Option<&'a str>) -> EventText<'a> {
        EventText {
            seq: self.seq,
            id: &self.id,
            at: &self.at,
            actor: &self.actor,
            kind: &self.kind,
            tool: self.tool.as_deref(),
            runner: self.runner.as_deref(),
            args,
            reason: self.reason.as_deref(),
            call_id: self.call_id.as_deref(),
            approval_id: self.approval_id.as_deref(),
            outcome: self.outcome.as_deref(),
            result_digest: self.result_digest.as_deref(),
            detail,
            prev_hash: &self.prev_hash,
        }
    }
}

/// Every field an event's hash covers, borrowed; `args` and `detail` as canonical JSON text.
#[derive(Debug, Clone, Copy)]
pub struct EventText<'a> {
    pub seq: i64,
    pub id: &'a str,
    pub at: &'a str,
    pub actor: &'a str,
    pub kind: &'a str,
    pub tool: Option<&'a str>,
    pub runner: Option<&'a str>,
    pub args: Option<&'a str>,
    pub reason: Option<&'a str>,
    pub call_id: Option<&'a str>,
    pub approval_id: Option<&'a str>,
    pub outcome: Option<&'a str>,
    pub result_digest: Option<&'a str>,
    pub detail: Option<&'a str>,
    pub prev_hash: &'a str,
}

impl EventText<'_> {
    /// Appends the event text to `out`: the canonical JSON object of all fields, written
    /// directly. The keys are fixed, so they are written in sorted order as literals; this
    /// replaces building a `json!` object (a dozen cloned strings) and sorting its keys for
    /// every event, which was most of the cost of verifying a long log.
    pub fn write(&self, out: &mut Vec<u8>) {
        fn string(out: &mut Vec<u8>, s: &str) {
            // serde_json's escaping, the same `canonical_json` uses for every string.
            serde_json::to_writer(&mut *out, s).expect("writing to a Vec cannot fail");
        }
        fn opt(out: &mut Vec<u8>, s: Option<&str>) {
            match s {
                Some(s) => string(out, s),
                None => out.extend_from_slice(b"null"),
            }
        }
        fn raw(out: &mut Vec<u8>, json: Option<&str>) {
            out.extend_from_slice(json.unwrap_or("null").as_bytes());
        }
        out.extend_from_slice(b"{\"actor\":");
        string(out, self.actor);
        out.extend_from_slice(b",\"approval_id\":");
        opt(out, self.approval_id);
        out.extend_from_slice(b",\"args\":");
        raw(out, self.args);
        out.extend_from_slice(b",\"at\":");
        string(out, self.at);
        out.extend_from_slice(b",\"call_id\":");
        opt(out, self.call_id);
        out.extend_from_slice(b",\"detail\":");
        raw(out, self.detail);
        out.extend_from_slice(b",\"id\":");
        string(out, self.id);
        out.extend_from_slice(b",\"kind\":");
        string(out, self.kind);
        out.extend_from_slice(b",\"outcome\":");
        opt(out, self.outcome);
        out.extend_from_slice(b",\"prev_hash\":");
        string(out, self.prev_hash);
        out.extend_from_slice(b",\"reason\":");
        opt(out, self.reason);
        out.extend_from_slice(b",\"result_digest\":");
        opt(out, self.result_digest);
        out.extend_from_slice(b",\"runner\":");
        opt(out, self.runner);
        out.extend_from_slice(b",\"seq\":");
        serde_json::to_writer(&mut *out, &self.seq).expect("writing to a Vec cannot fail");
        out.extend_from_slice(b",\"tool\":");
        opt(out, self.tool);
        out.push(b'}');
    }

    /// SHA-256 of the event text; `buf` is scratch space, reused across calls.
    pub fn hash(&self, buf: &mut Vec<u8>) -> [u8; 32] {
        buf.clear();
        self.write(buf);
        Sha256::digest(&buf[..]).into()
    }
}
