//! `HttpState`: what every HTTP handler shares (the store, the gateway, identity, login
//! limits, the runners' fleet) and the MCP sessions' bindings to tokens. Its own module so
//! that the router (`http`), the portal's handlers and the OpenID sign-in routes all import
//! it from here, and none of them imports another for it.
//!
//! Invariant: an MCP session id, once bound, stays bound to the one token that opened it
//! until it is closed or forgotten to make room.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::server::db::Db;
use crate::server::gateway::Gateway;
use crate::server::oidc::identity::Identity;
use crate::server::tokens::Principal;

/// The most session bindings remembered; past it the oldest half is forgotten (a forgotten
/// session is bound again to the next token that uses it).
const MAX_SESSIONS: usize = 100_000;

#[derive(Clone)]
pub struct HttpState {
    pub db: Db,
    /// Login attempts per client address, for the server and per user name (argon2 is slow
    /// on purpose; these keep a guesser slower and a flood from taking the server's CPU).
    pub logins: Arc<crate::server::login_limits::LoginLimits>,
    /// Cookies get `Secure` when the portal is served over TLS.
    pub secure_cookies: bool,
    pub gateway: Arc<Gateway>,
    /// The organisation's identity providers (`[oidc]`, `[oauth]`) and whether password
    /// login is on.
    pub identity: Arc<Identity>,
    /// MCP session id → (token id, order of binding).
    sessions: Arc<Mutex<HashMap<String, (String, u64)>>>,
    /// Recently authenticated bearer tokens.
    pub(crate) tokens: Arc<crate::server::tokens::TokenCache>,
    /// Joins, re-registrations and heartbeats of runners.
    pub(crate) fleet: Arc<crate::server::fleet::Fleet>,
    next_binding: Arc<std::sync::atomic::AtomicU64>,
}

impl HttpState {
    pub fn new(
        db: Db,
        logins: Arc<crate::server::login_limits::LoginLimits>,
        secure_cookies: bool,
        gateway: Arc<Gateway>,
        identity: Arc<Identity>,
        fleet: Arc<crate::server::fleet::Fleet>,
    ) -> Self {
        HttpState {
            db,
            logins,
            secure_cookies,
            gateway,
            identity,
            sessions: Arc::default(),
            tokens: Arc::default(),
            fleet,
            next_binding: Arc::default(),
        }
    }

    /// Binds `session` to the principal's token, or checks it is bound to it already.
    pub(crate) fn bind_session(&self, session: &str, principal: &Principal) -> bool {
        let mut map = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((token_id, _)) = map.get(session) {
            return *token_id == principal.token_id;
        }
        if map.len() >= MAX_SESSIONS {
            let mut orders: Vec<u64> = map.values().map(|(_, o)| *o).collect();
            orders.sort_unstable();
            let cutoff = orders[orders.len() / 2];
            map.retain(|_, (_, o)| *o > cutoff);
        }
        let order = self
            .next_binding
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        map.insert(session.to_owned(), (principal.token_id.clone(), order));
        true
    }

    /// Forgets `session`: its client closed it.
    pub(crate) fn forget_session(&self, session: &str) {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(session);
    }
}
