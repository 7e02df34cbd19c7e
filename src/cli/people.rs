//! `emisar user` and `emisar token`: the people who approve and audit, and bearer tokens.

use anyhow::Context;
use clap::Subcommand;

use super::table::{self, Col};
use super::{DbArg, cli_actor};
use crate::server::audit::AuditLog;

#[derive(Subcommand)]
pub enum UserCommand {
    /// Add a person. The password comes from stdin (one line), or is generated and printed.
    #[command(
        after_help = "Example: emisar user add alice --role approver --password-stdin < alice.pw"
    )]
    Add {
        /// The person's user name (letters, digits, `_ . @ -`).
        name: String,
        /// approver, auditor or admin.
        #[arg(long)]
        role: String,
        /// Read the password from the first line of stdin instead of generating one.
        #[arg(long)]
        password_stdin: bool,
        #[command(flatten)]
        db: DbArg,
    },
    /// Remove a person: their sessions end and their API tokens are revoked.
    #[command(after_help = "Example: emisar user remove alice")]
    Remove {
        /// The person's user name.
        name: String,
        #[command(flatten)]
        db: DbArg,
    },
    /// List people: name, role, when added, open portal sessions (never a password hash).
    #[command(after_help = "Example: emisar user list --database postgres://emisar@db/emisar")]
    List {
        #[command(flatten)]
        db: DbArg,
    },
    /// Change a person's role. Their portal sessions end and their API tokens are revoked
    /// (a token keeps the role it was issued with).
    #[command(after_help = "Example: emisar user set-role alice --role admin")]
    SetRole {
        /// The person's user name.
        name: String,
        /// approver, auditor or admin.
        #[arg(long)]
        role: String,
        #[command(flatten)]
        db: DbArg,
    },
    /// Change a person's password, read from the first line of stdin. Their portal sessions
    /// end; their API tokens stay.
    #[command(
        after_help = "Example: printf '%s\\n' \"$NEW_PASSWORD\" | emisar user set-password alice"
    )]
    SetPassword {
        /// The person's user name.
        name: String,
        #[command(flatten)]
        db: DbArg,
    },
    /// Issue an API token that acts as this person (for `emisar approvals` and scripts).
    #[command(after_help = "Example: emisar user token alice --ttl 12h")]
    Token {
        /// The person's user name.
        name: String,
        /// Lifetime: 90s, 30m, 12h, 30d.
        #[arg(long, default_value = "30d")]
        ttl: String,
        #[command(flatten)]
        db: DbArg,
    },
}

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Issue a bearer token. The token is printed once.
    #[command(
        after_help = "Example: emisar token issue --agent claude --selector role=edge --ttl 30d"
    )]
    Issue {
        /// The name the token is issued to (an agent, or an auditor with --role auditor).
        #[arg(long)]
        agent: String,
        /// `agent` (calls tools over MCP) or `auditor` (reads GET /api/audit).
        #[arg(long, default_value = "agent")]
        role: String,
        /// Limit the token to the runners whose labels match, e.g. role=edge,dc=dc1.
        #[arg(long)]
        selector: Option<String>,
        /// Lifetime: 90s, 30m, 12h, 30d.
        #[arg(long, default_value = "30d")]
        ttl: String,
        #[command(flatten)]
        db: DbArg,
    },
    /// List tokens (never the tokens themselves): id, name, role, selector, created,
    /// expires, state.
    #[command(after_help = "Example: emisar token list --database postgres://emisar@db/emisar")]
    List {
        #[command(flatten)]
        db: DbArg,
    },
    /// Revoke a token by its id.
    #[command(after_help = "Example: emisar token revoke 6d1e…")]
    Revoke {
        /// The token's id (from `emisar token list`).
        id: String,
        #[command(flatten)]
        db: DbArg,
    },
}

/// `emisar token …`.
pub(super) async fn token(command: TokenCommand) -> anyhow::Result<i32> {
    match command {
        TokenCommand::Issue {
            agent,
            role,
            selector,
            ttl,
            db,
        } => {
            let ttl = crate::server::tokens::parse_ttl(&ttl).map_err(anyhow::Error::msg)?;
            let db = db.connect().await?;
            let audit = AuditLog::start(db.clone());
            let role = crate::server::principal::Role::parse(&role).map_err(anyhow::Error::msg)?;
            if matches!(
                role,
                crate::server::principal::Role::Approver | crate::server::principal::Role::Admin
            ) {
                anyhow::bail!(
                    "--role {}: tokens for people come from `emisar user token NAME`, which checks the person exists",
                    role.as_str()
                );
            }
            let selector = selector
                .as_deref()
                .map(crate::selector::Selector::parse)
                .transpose()
                .map_err(anyhow::Error::msg)?;
            let t = crate::server::tokens::issue_scoped(
                &db,
                &audit,
                &agent,
                role,
                selector.as_ref(),
                ttl,
                &cli_actor(),
            )
            .await?;
            println!("token id:   {}", t.id);
            println!("agent:      {}", t.agent);
            println!("expires at: {}", t.expires_at);
            println!("token:      {}", t.token);
            eprintln!("The token is shown once; store it now.");
        }
        TokenCommand::List { db } => {
            let db = db.connect().await?;
            let tokens = crate::server::tokens::list(&db).await?;
            if tokens.is_empty() {
                println!("no tokens");
                return Ok(0);
            }
            let cols = [
                Col::Left(36),
                Col::Left(24),
                Col::Left(8),
                Col::Left(20),
                Col::Left(27),
                Col::Left(27),
                Col::Last,
            ];
            table::print(
                &cols,
                [
                    "ID", "NAME", "ROLE", "SELECTOR", "CREATED", "EXPIRES", "STATE",
                ],
            );
            for t in tokens {
                table::print(
                    &cols,
                    [
                        &t.id,
                        &t.name,
                        &t.role,
                        t.selector.as_deref().unwrap_or("-"),
                        &t.created_at,
                        &t.expires_at,
                        t.state,
                    ],
                );
            }
        }
        TokenCommand::Revoke { id, db } => {
            let db = db.connect().await?;
            let audit = AuditLog::start(db.clone());
            if !crate::server::tokens::revoke(&db, &audit, &id, &cli_actor()).await? {
                eprintln!("no live token has id {id}");
                return Ok(1);
            }
            println!("revoked {id}");
        }
    }
    Ok(0)
}

pub(super) async fn user(command: UserCommand) -> anyhow::Result<()> {
    use crate::server::principal::Role;
    match command {
        UserCommand::Add {
            name,
            role,
            password_stdin,
            db,
        } => {
            let role = Role::parse(&role).map_err(|e| anyhow::anyhow!("--role: {e}"))?;
            let (password, generated) = if password_stdin {
                (password_from_stdin()?, false)
            } else {
                (crate::server::users::random_token()?, true)
            };
            let db = db.connect().await?;
            let audit = AuditLog::start(db.clone());
            crate::server::users::add(&db, &audit, &name, role, &password, &cli_actor()).await?;
            println!("added {name} ({})", role.as_str());
            if generated {
                println!("password: {password}");
                eprintln!("The password is shown once; it is stored only as an argon2 hash.");
            }
        }
        UserCommand::Remove { name, db } => {
            let db = db.connect().await?;
            let audit = AuditLog::start(db.clone());
            crate::server::users::remove(&db, &audit, &name, &cli_actor()).await?;
            println!("removed {name}: sessions ended, API tokens revoked");
        }
        UserCommand::List { db } => {
            let db = db.connect().await?;
            let users = crate::server::users::list(&db).await?;
            if users.is_empty() {
                println!("no users");
                return Ok(());
            }
            let cols = [Col::Left(24), Col::Left(8), Col::Left(27), Col::Last];
            table::print(&cols, ["NAME", "ROLE", "CREATED", "SESSIONS"]);
            for u in users {
                let sessions = u.sessions.to_string();
                table::print(&cols, [&u.name, &u.role, &u.created_at, &sessions]);
            }
        }
        UserCommand::SetRole { name, role, db } => {
            let role = Role::parse(&role).map_err(|e| anyhow::anyhow!("--role: {e}"))?;
            let db = db.connect().await?;
            let audit = AuditLog::start(db.clone());
            let ended =
                crate::server::users::set_role(&db, &audit, &name, role, &cli_actor()).await?;
            println!(
                "{name} is now {}: {} portal session(s) ended, {} API token(s) revoked",
                role.as_str(),
                ended.sessions,
                ended.tokens
            );
        }
        UserCommand::SetPassword { name, db } => {
            let password = password_from_stdin()?;
            let db = db.connect().await?;
            let audit = AuditLog::start(db.clone());
            let ended =
                crate::server::users::set_password(&db, &audit, &name, &password, &cli_actor())
                    .await?;
            println!(
                "password of {name} changed: {} portal session(s) ended",
                ended.sessions
            );
        }
        UserCommand::Token { name, ttl, db } => {
            let ttl = crate::server::tokens::parse_ttl(&ttl).map_err(anyhow::Error::msg)?;
            let db = db.connect().await?;
            let audit = AuditLog::start(db.clone());
            let role = crate::server::users::role_of(&db, &name)
                .await?
                .with_context(|| format!("no user `{name}`: add them with `emisar user add`"))?;
            let t =
                crate::server::tokens::issue(&db, &audit, &name, role, ttl, &cli_actor()).await?;
            println!("token id:   {}", t.id);
            println!("user:       {name} ({})", role.as_str());
            println!("expires at: {}", t.expires_at);
            println!("token:      {}", t.token);
            eprintln!("The token is shown once. Use it as EMISAR_TOKEN for `emisar approvals`.");
        }
    }
    Ok(())
}

/// The first line of stdin, without its line ending: how a password reaches the CLI without
/// appearing in the process list or the shell history.
fn password_from_stdin() -> anyhow::Result<String> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("failed to read the password from stdin")?;
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}
