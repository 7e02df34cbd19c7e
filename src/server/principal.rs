//! Who is calling: the [`Role`]s a caller may hold and the [`Principal`] a request runs as,
//! whatever authenticated it (an `emt_` token, a portal session, a provider's ID or access
//! token). The vocabulary the pure policy decides in.
//!
//! Invariant: pure; no SQL, no IO, no clock. The stores that turn credentials into a
//! principal (`tokens`, `users`, `oidc`) import this module, never the other way round.

use crate::selector::Selector;

/// How every audit identity of a person from the organisation's identity provider begins
/// (`person:<id>`). Local names and agent names are identifiers (no `:`), so a name with this
/// prefix can only come from a provider's sign-in.
pub const PERSON_PREFIX: &str = "person:";

/// What a caller may do: a token, a local user and a provider's person each hold roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Calls tools over MCP.
    Agent,
    /// Reads the audit log over the HTTP API.
    Auditor,
    /// A human who decides approval requests (and reads the audit log).
    Approver,
    /// A human who may do everything an approver and an auditor may.
    Admin,
    /// A person signed in through the organisation's OpenID provider whose groups map to no
    /// role: they may see who they are and log out, nothing else. Never stored for a token or
    /// a local user ([`Role::parse`] refuses it).
    None,
}

impl Role {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Auditor => "auditor",
            Role::Approver => "approver",
            Role::Admin => "admin",
            Role::None => "none",
        }
    }

    /// How broad a role is, for picking the one that decides which paths a person with
    /// several roles may use: an admin may do what an approver may, who may do what an
    /// auditor may.
    fn breadth(self) -> u8 {
        match self {
            Role::None => 0,
            Role::Agent | Role::Auditor => 1,
            Role::Approver => 2,
            Role::Admin => 3,
        }
    }

    /// The broadest of `roles` (people only), or [`Role::None`] when there is none.
    pub(crate) fn broadest(roles: &[Role]) -> Role {
        roles
            .iter()
            .copied()
            .filter(|r| *r != Role::Agent)
            .max_by_key(|r| r.breadth())
            .unwrap_or(Role::None)
    }

    pub(crate) fn parse(s: &str) -> Result<Role, String> {
        match s {
            "agent" => Ok(Role::Agent),
            "auditor" => Ok(Role::Auditor),
            "approver" => Ok(Role::Approver),
            "admin" => Ok(Role::Admin),
            other => Err(format!(
                "role `{other}` must be agent, auditor, approver or admin"
            )),
        }
    }
}

/// The authenticated caller of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Principal {
    /// The caller's name: the agent or person a token was issued to, a local user, an OAuth
    /// agent's name from its access token, or `person:<id>` for a person signed in through
    /// the OpenID provider. Policies, rate limits and self-approval compare this name. Only
    /// the provider's people have a `:` in it: every other name is an identifier.
    pub name: String,
    /// What an MCP session is bound to: the token (or, for OAuth agents, the client and
    /// subject, so a refreshed token keeps its session).
    pub token_id: String,
    /// The broadest role the caller holds: it decides which paths the caller may use.
    pub role: Role,
    /// Every role the caller holds, `role` among them (empty for [`Role::None`]). A person
    /// from the provider may hold several, and under the policy an approver and an admin
    /// may approve different tools.
    pub roles: Vec<Role>,
    /// Runners outside this selector do not exist for this caller.
    pub selector: Option<Selector>,
    /// The person an OAuth agent acts for (`person:<id>`, from its access token): audited
    /// with its calls, and never the approver of a request it made.
    pub on_behalf_of: Option<String>,
}

impl Principal {
    /// A caller with one role, acting for nobody: a token's, or a local user's.
    pub(crate) fn new(
        name: String,
        token_id: String,
        role: Role,
        selector: Option<Selector>,
    ) -> Self {
        Principal {
            name,
            token_id,
            role,
            roles: vec![role],
            selector,
            on_behalf_of: None,
        }
    }

    /// How the audit log names this caller: `<role>:<name>`, or a provider person's own
    /// `person:<id>` (their roles at sign-in are in their `login` event).
    pub(crate) fn actor(&self) -> String {
        if self.name.starts_with(PERSON_PREFIX) {
            return self.name.clone();
        }
        format!("{}:{}", self.role.as_str(), self.name)
    }
}
