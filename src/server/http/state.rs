//! `HttpState`: what every HTTP handler shares (the store, the gateway, identity, login
//! limits, the runners' fleet) and the MCP sessions' bindings to tokens. Its own module so
//! that the router (`http`), the portal's handlers and the OpenID sign-in routes all import
//! it from here, and none of them imports another for it.
//!
//! Invariants: an MCP session id is bound only when this server opened the session (the
//! answer to a request that carried no session id), to the token that asked; an id the
//! server has not bound is unknown to every caller and is never bound by being presented.
//! A binding stays with its token until the session is closed or that same token opens more
//! than [`MAX_SESSIONS_PER_TOKEN`] (its own oldest is then closed): no caller can make
//! room by evicting another token's sessions.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

use crate::server::db::Db;
use crate::server::gateway::Gateway;
use crate::server::oidc::identity::Identity;

/// The most MCP sessions open at once on this server; past it a new one is refused (503)
/// rather than any open one forgotten.
pub(crate) const MAX_SESSIONS: usize = 100_000;
/// The most MCP sessions one token keeps open; opening another closes its own oldest.
pub(crate) const MAX_SESSIONS_PER_TOKEN: usize = 64;

#[derive(Clone)]
pub struct HttpState {
    pub db: Db,
    /// Login attempts: refused per client address and per (name, address), paced per user
    /// name and for the server (argon2 is slow on purpose; these keep a guesser slower and a
    /// flood from taking the server's CPU, without letting anyone lock a person out).
    pub logins: Arc<crate::server::login_limits::LoginLimits>,
    /// Cookies get `Secure` when the portal is served over TLS.
    pub secure_cookies: bool,
    pub gateway: Arc<Gateway>,
    /// The organisation's identity providers (`[oidc]`, `[oauth]`) and whether password
    /// login is on.
    pub identity: Arc<Identity>,
    /// Which token opened each MCP session.
    pub(crate) sessions: Arc<McpSessions>,
    /// Recently authenticated bearer tokens.
    pub(crate) tokens: Arc<crate::server::tokens::TokenCache>,
    /// Joins, re-registrations and heartbeats of runners.
    pub(crate) fleet: Arc<crate::server::fleet::Fleet>,
    /// The WebAuthn relying party passkeys are registered for (`[webauthn]`, or derived from
    /// `public_url`), or why there is none: said to whoever tries to register one.
    pub webauthn: Arc<Result<crate::protocol::approval::webauthn::RelyingParty, String>>,
}

impl HttpState {
    #[expect(
        clippy::too_many_arguments,
        reason = "each is a separate piece the composition root built; a struct would only rename them"
    )]
    pub(crate) fn new(
        db: Db,
        logins: Arc<crate::server::login_limits::LoginLimits>,
        secure_cookies: bool,
        gateway: Arc<Gateway>,
        identity: Arc<Identity>,
        fleet: Arc<crate::server::fleet::Fleet>,
        mcp_sessions: Arc<LocalSessionManager>,
        webauthn: Result<crate::protocol::approval::webauthn::RelyingParty, String>,
    ) -> Self {
        HttpState {
            db,
            logins,
            secure_cookies,
            gateway,
            identity,
            sessions: Arc::new(McpSessions::new(Some(mcp_sessions))),
            tokens: Arc::default(),
            fleet,
            webauthn: Arc::new(webauthn),
        }
    }
}

/// Whose an MCP session is, as far as this server knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// The presenting token opened it.
    Caller,
    /// Another token opened it, or the server never did: to the caller, it does not exist.
    Unknown,
}

/// MCP session id → the token that opened it, for the sessions this server opened.
pub(crate) struct McpSessions {
    bindings: Mutex<Bindings>,
    /// Where the sessions live, to close the ones a token's cap pushes out (absent in unit
    /// tests, which only look at the bindings).
    manager: Option<Arc<LocalSessionManager>>,
}

#[derive(Default)]
struct Bindings {
    /// Session id → token id.
    by_id: HashMap<String, String>,
    /// Token id → its sessions, oldest first.
    by_token: HashMap<String, VecDeque<String>>,
}

impl McpSessions {
    pub(crate) fn new(manager: Option<Arc<LocalSessionManager>>) -> Self {
        McpSessions {
            bindings: Mutex::default(),
            manager,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Bindings> {
        self.bindings.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `session` belongs to `token_id`. Looking never binds.
    pub(crate) fn owner(&self, session: &str, token_id: &str) -> Owner {
        match self.lock().by_id.get(session) {
            Some(owner) if owner == token_id => Owner::Caller,
            _ => Owner::Unknown,
        }
    }

    /// Whether a new session may be opened now: false once [`MAX_SESSIONS`] are open.
    pub(crate) fn has_room(&self) -> bool {
        self.lock().by_id.len() < MAX_SESSIONS
    }

    /// The server just opened `session` for `token_id`. Past the token's cap its own oldest
    /// session is closed; past the server's cap (a race with [`has_room`](Self::has_room))
    /// the new one is closed instead. Returns whether it was bound.
    pub(crate) fn opened(&self, session: &str, token_id: &str) -> bool {
        let mut closing = Vec::new();
        let bound = {
            let mut b = self.lock();
            if b.by_id.contains_key(session) {
                // The server never issues an id twice; should it, the first owner keeps it.
                return false;
            }
            if b.by_id.len() >= MAX_SESSIONS {
                closing.push(session.to_owned());
                false
            } else {
                b.by_id.insert(session.to_owned(), token_id.to_owned());
                let own = b.by_token.entry(token_id.to_owned()).or_default();
                own.push_back(session.to_owned());
                let mut evicted = Vec::new();
                while own.len() > MAX_SESSIONS_PER_TOKEN {
                    evicted.extend(own.pop_front());
                }
                for id in &evicted {
                    b.by_id.remove(id);
                }
                closing.extend(evicted);
                true
            }
        };
        self.close_all(closing);
        bound
    }

    /// Forgets `session`: its client closed it.
    pub(crate) fn closed(&self, session: &str) {
        let mut b = self.lock();
        if let Some(token) = b.by_id.remove(session)
            && let Some(own) = b.by_token.get_mut(&token)
        {
            own.retain(|id| id != session);
            if own.is_empty() {
                b.by_token.remove(&token);
            }
        }
    }

    /// How many sessions are bound.
    #[cfg(test)]
    fn bound(&self) -> usize {
        self.lock().by_id.len()
    }

    /// Closes sessions nobody may reach any more, so they do not linger until reaped.
    fn close_all(&self, ids: Vec<String>) {
        let Some(manager) = self.manager.clone() else {
            return;
        };
        if ids.is_empty() {
            return;
        }
        tokio::spawn(async move {
            for id in ids {
                if let Err(error) = manager.close_session(&Arc::from(id.as_str())).await {
                    tracing::debug!(%error, "could not close an MCP session past its token's cap");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presenting_an_id_never_binds_it() {
        let s = McpSessions::new(None);
        assert_eq!(s.owner("made-up", "token-a"), Owner::Unknown);
        assert_eq!(s.owner("made-up", "token-a"), Owner::Unknown);
        assert_eq!(s.bound(), 0);
        assert!(s.opened("s1", "token-a"));
        assert_eq!(s.owner("s1", "token-a"), Owner::Caller);
        assert_eq!(s.owner("s1", "token-b"), Owner::Unknown);
        // Opened again (the server never does): the first owner keeps it.
        assert!(!s.opened("s1", "token-b"));
        assert_eq!(s.owner("s1", "token-a"), Owner::Caller);
        s.closed("s1");
        assert_eq!(s.owner("s1", "token-a"), Owner::Unknown);
        assert_eq!(s.bound(), 0);
    }

    #[test]
    fn a_token_that_opens_many_sessions_pushes_out_only_its_own() {
        let s = McpSessions::new(None);
        assert!(s.opened("victim", "token-a"));
        for i in 0..10 * MAX_SESSIONS_PER_TOKEN {
            assert!(s.opened(&format!("flood-{i}"), "token-b"));
        }
        assert_eq!(s.owner("victim", "token-a"), Owner::Caller);
        assert_eq!(s.bound(), 1 + MAX_SESSIONS_PER_TOKEN);
        // Its newest stay; its oldest were closed.
        let last = 10 * MAX_SESSIONS_PER_TOKEN - 1;
        assert_eq!(s.owner(&format!("flood-{last}"), "token-b"), Owner::Caller);
        assert_eq!(s.owner("flood-0", "token-b"), Owner::Unknown);
    }

    #[test]
    fn past_the_server_cap_new_sessions_are_refused_and_none_forgotten() {
        let s = McpSessions::new(None);
        for i in 0..MAX_SESSIONS {
            assert!(s.opened(
                &format!("s{i}"),
                &format!("token-{}", i / MAX_SESSIONS_PER_TOKEN)
            ));
        }
        assert!(!s.has_room());
        assert!(!s.opened("one-more", "token-new"));
        assert_eq!(s.owner("s0", "token-0"), Owner::Caller);
        assert_eq!(s.owner("one-more", "token-new"), Owner::Unknown);
        assert_eq!(s.bound(), MAX_SESSIONS);
    }
}
