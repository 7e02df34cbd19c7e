//! `emisar join-token` and `emisar runner list|remove`: the tokens with which runners join,
//! and the runners that did.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::table::{self, Col};
use super::{DbArg, cli_actor};
use crate::server::audit::AuditLog;
use crate::server::config::ServerConfig;
use crate::server::db::Db;
use crate::server::fleet::{self, JoinTokenSpec, NameRule};

#[derive(Subcommand)]
pub enum JoinTokenCommand {
    /// Issue a join token. It is printed once.
    #[command(
        after_help = "Example: emisar join-token issue --server-config /etc/emisar/emisar.toml --name edge-1 --label role=edge --pack traefik --pack linux"
    )]
    Issue {
        /// Lifetime: 90s, 30m, 12h, at most 30d.
        #[arg(long, default_value = "1h")]
        ttl: String,
        /// How many runners may join with it.
        #[arg(long, default_value_t = 1)]
        uses: u32,
        /// The one runner name it admits.
        #[arg(long, conflicts_with = "name_pattern")]
        name: Option<String>,
        /// The runner names it admits, as a glob, e.g. `edge-*`.
        #[arg(long)]
        name_pattern: Option<String>,
        /// A label the runner gets, KEY=VALUE (repeat for more). A runner gets exactly its
        /// join token's labels.
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// A pack the runner may serve (repeat for more). A runner is sent calls only for the
        /// packs it announces that its join token grants; none by default.
        #[arg(long = "pack", value_name = "PACK")]
        packs: Vec<String>,
        #[command(flatten)]
        key: ServerKeyArg,
        #[command(flatten)]
        db: DbArg,
    },
    /// List join tokens (never the tokens themselves): uses, bounds and state.
    #[command(
        after_help = "Example: emisar join-token list --database postgres://emisar@db/emisar"
    )]
    List {
        #[command(flatten)]
        db: DbArg,
    },
    /// Revoke a join token by its id: no runner joins with it again.
    #[command(
        after_help = "Example: emisar join-token revoke 0b6c…-… --database postgres://emisar@db/emisar"
    )]
    Revoke {
        /// The join token's id (from `emisar join-token list`).
        id: String,
        #[command(flatten)]
        db: DbArg,
    },
}

/// Where the fingerprint a join token carries comes from.
#[derive(Args)]
#[group(required = true, multiple = false)]
pub struct ServerKeyArg {
    /// The server's config (emisar.toml): the token carries the fingerprint of its signing
    /// key, and its database_url is used unless --database is given.
    #[arg(long)]
    server_config: Option<PathBuf>,
    /// The server's public key (the `--public` file of `emisar keygen`), when the config
    /// is not at hand.
    #[arg(long)]
    server_public_key: Option<PathBuf>,
}

impl ServerKeyArg {
    /// The server's public key (SPKI PEM) and its config, when one was given.
    fn load(&self) -> anyhow::Result<(String, Option<ServerConfig>)> {
        if let Some(path) = &self.server_config {
            let config = ServerConfig::load(path)?;
            let private = std::fs::read_to_string(&config.signing_key_file).with_context(|| {
                format!(
                    "failed to read signing key {} (signing_key_file of {})",
                    config.signing_key_file.display(),
                    path.display()
                )
            })?;
            let public = crate::protocol::signing::public_pem_of(&private)?;
            return Ok((public, Some(config)));
        }
        let path = self
            .server_public_key
            .as_ref()
            .context("give --server-config or --server-public-key")?;
        let public = std::fs::read_to_string(path)
            .with_context(|| format!("failed to read {}", path.display()))?;
        Ok((public, None))
    }
}

/// Connects to `--database`, else the config's `database_url`.
async fn connect(db: &DbArg, config: Option<&ServerConfig>) -> anyhow::Result<Db> {
    match (
        db.database.as_deref(),
        config.and_then(|c| c.database_url.as_deref()),
    ) {
        (Some(url), _) | (None, Some(url)) => Db::connect(url).await,
        (None, None) => db.connect().await,
    }
}

/// `emisar join-token …`; the exit code is 1 when there was nothing to revoke.
pub(super) async fn join_token(command: JoinTokenCommand) -> anyhow::Result<i32> {
    match command {
        JoinTokenCommand::Issue {
            ttl,
            uses,
            name,
            name_pattern,
            labels,
            packs,
            key,
            db,
        } => {
            let ttl = crate::server::tokens::parse_ttl(&ttl).map_err(anyhow::Error::msg)?;
            let name = NameRule::parse(name.as_deref(), name_pattern.as_deref())
                .map_err(anyhow::Error::msg)?;
            let labels = labels
                .iter()
                .map(|l| fleet::parse_label(l))
                .collect::<Result<BTreeMap<_, _>, _>>()
                .map_err(anyhow::Error::msg)?;
            let spec = JoinTokenSpec {
                ttl,
                max_uses: uses,
                name,
                labels,
                packs: packs.into_iter().collect(),
            };
            spec.check().map_err(anyhow::Error::msg)?;
            let (public, config) = key.load()?;
            if let Some(config) = &config {
                // With the server's config at hand, a pack it does not know is a typo: the
                // token would grant nothing by that name.
                let known = crate::pack::PackSet::load(config.packs_dir.as_deref())?;
                if let Some(unknown) = spec.packs.iter().find(|p| known.pack(p).is_none()) {
                    let names: Vec<&str> = known.packs().map(|p| p.name.as_str()).collect();
                    anyhow::bail!(
                        "--pack {unknown}: the server has no such pack (it has {})",
                        names.join(", ")
                    );
                }
            }
            let pins = crate::protocol::ServerPins {
                key_sha256: crate::protocol::signing::key_fingerprint(&public)?,
            };
            let db = connect(&db, config.as_ref()).await?;
            let audit = AuditLog::start(db.clone());
            let issued = fleet::issue_join_token(&db, &audit, &spec, pins, &cli_actor()).await?;
            println!("join token id: {}", issued.id);
            println!("expires at:    {}", issued.expires_at);
            println!("uses:          {}", spec.max_uses);
            println!("admits:        {}", spec.name);
            println!("labels:        {}", labels_text(&spec.labels));
            println!("packs:         {}", packs_text(&spec.packs));
            println!("join token:    {}", issued.token);
            for warning in spec.warnings() {
                eprintln!("warning: {warning}");
            }
            eprintln!(
                "The token is shown once. Put the server in the runner's runner.toml ([join] server = \"URL\") and start it once with --join-token TOKEN (or EMISAR_JOIN_TOKEN); it keeps a credential in state_dir and restarts from runner.toml alone"
            );
        }
        JoinTokenCommand::List { db } => {
            let db = db.connect().await?;
            let tokens = fleet::list_join_tokens(&db).await?;
            if tokens.is_empty() {
                println!("no join tokens");
                return Ok(0);
            }
            let cols = [
                Col::Left(36),
                Col::Left(27),
                Col::Left(27),
                Col::Right(11),
                Col::Left(24),
                Col::Left(24),
                Col::Left(24),
                Col::Last,
            ];
            table::print(
                &cols,
                [
                    "ID", "CREATED", "EXPIRES", "USES", "ADMITS", "LABELS", "PACKS", "STATE",
                ],
            );
            for t in tokens {
                table::print(
                    &cols,
                    [
                        &t.id,
                        &t.created_at,
                        &t.expires_at,
                        &format!("{}/{}", t.uses, t.max_uses),
                        &t.name.to_string(),
                        &labels_text(&t.labels),
                        &packs_text(&t.packs),
                        t.state.as_str(),
                    ],
                );
            }
        }
        JoinTokenCommand::Revoke { id, db } => {
            let db = db.connect().await?;
            let audit = AuditLog::start(db.clone());
            if !fleet::revoke_join_token(&db, &audit, &id, &cli_actor()).await? {
                eprintln!("no unrevoked join token has id {id}");
                return Ok(1);
            }
            println!("revoked join token {id}");
        }
    }
    Ok(0)
}

#[derive(Subcommand)]
pub enum RunnerCommand {
    /// List runners: those that joined (from the database) and, with --server-config,
    /// those in the server's config.
    #[command(after_help = "Example: emisar runner list --server-config /etc/emisar/emisar.toml")]
    List {
        /// The server's config (emisar.toml), for its `[[runners]]` (and its database_url).
        #[arg(long)]
        server_config: Option<PathBuf>,
        #[command(flatten)]
        db: DbArg,
    },
    /// Remove a runner that joined: its credential stops working at once, and every
    /// replica forgets it at its next sync. Runners in the server's config are removed by
    /// editing the config.
    #[command(
        after_help = "Example: emisar runner remove edge-1 --database postgres://emisar@db/emisar"
    )]
    Remove {
        /// The joined runner's name.
        name: String,
        #[command(flatten)]
        db: DbArg,
    },
    /// Print the fingerprint (sha256:…) of the certificate this runner serves, creating its
    /// self-signed certificate if it has none yet: the `tls_fingerprint` of its entry in
    /// emisar.toml.
    #[command(after_help = "Example: emisar runner fingerprint --config /etc/emisar/runner.toml")]
    Fingerprint {
        /// The runner's settings (runner.toml).
        #[arg(long)]
        config: PathBuf,
    },
}

/// `emisar runner list|remove|fingerprint`; the exit code is 1 when there was nothing to
/// remove.
pub(super) async fn runner(command: RunnerCommand) -> anyhow::Result<i32> {
    match command {
        RunnerCommand::Fingerprint { config } => {
            let config = crate::node::config::RunnerConfig::load_for_tls(&config)?;
            println!("{}", crate::node::tls::fingerprint(&config)?);
        }
        RunnerCommand::List { server_config, db } => {
            let config = server_config
                .as_deref()
                .map(ServerConfig::load)
                .transpose()?;
            let db = connect(&db, config.as_ref()).await?;
            let joined = fleet::joined_runners(&db).await?;
            let configured = config
                .as_ref()
                .map(|c| c.runners.clone())
                .unwrap_or_default();
            let cols = [
                Col::Left(24),
                Col::Left(7),
                Col::Left(32),
                Col::Left(24),
                Col::Left(27),
                Col::Last,
            ];
            table::print(
                &cols,
                [
                    "NAME",
                    "ORIGIN",
                    "URL",
                    "LABELS",
                    "JOINED AT",
                    "LAST HEARTBEAT",
                ],
            );
            for r in &configured {
                let labels = labels_text(&r.labels);
                table::print(&cols, [&r.name, "config", &r.url, &labels, "-", "-"]);
            }
            for r in &joined {
                // A joined runner named like a configured one is ignored by the server.
                let shadowed = configured.iter().any(|c| c.name == r.name);
                let last = format!(
                    "{}{}",
                    r.last_heartbeat.as_deref().unwrap_or("-"),
                    if shadowed {
                        "  (ignored: the config has a runner of this name)"
                    } else {
                        ""
                    }
                );
                let labels = labels_text(&r.labels);
                table::print(
                    &cols,
                    [&r.name, "joined", &r.url, &labels, &r.joined_at, &last],
                );
            }
            if config.is_none() {
                eprintln!(
                    "Runners in the server's config are listed too with --server-config emisar.toml."
                );
            }
        }
        RunnerCommand::Remove { name, db } => {
            let db = db.connect().await?;
            let audit = AuditLog::start(db.clone());
            if !fleet::remove_runner(&db, &audit, &name, &cli_actor()).await? {
                eprintln!(
                    "no joined runner is named {name} (runners in the server's config are removed by editing it)"
                );
                return Ok(1);
            }
            println!(
                "removed {name}: its credential is revoked; every server replica forgets it within 10 s"
            );
        }
    }
    Ok(0)
}

fn packs_text(packs: &std::collections::BTreeSet<String>) -> String {
    if packs.is_empty() {
        return "none".into();
    }
    packs.iter().cloned().collect::<Vec<_>>().join(",")
}

fn labels_text(labels: &BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return "-".into();
    }
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}
