//! `emisar join-token`: the tokens with which runners join.

use clap::Subcommand;

use super::{DbArg, cli_actor};
use crate::server::audit::AuditLog;

#[derive(Subcommand)]
pub enum JoinTokenCommand {
    /// Issue a join token. It is printed once.
    Issue {
        #[arg(long, default_value = "1h")]
        ttl: String,
        #[command(flatten)]
        db: DbArg,
    },
}

/// `emisar join-token …`.
pub async fn join_token(command: JoinTokenCommand) -> anyhow::Result<()> {
    match command {
        JoinTokenCommand::Issue { ttl, db } => {
            let ttl = crate::server::tokens::parse_ttl(&ttl).map_err(anyhow::Error::msg)?;
            let db = db.connect().await?;
            let audit = AuditLog::start(db.clone());
            let (id, token) =
                crate::server::fleet::issue_join_token(&db, &audit, ttl, &cli_actor()).await?;
            println!("join token id: {id}");
            println!("join token:    {token}");
            eprintln!(
                "The token is shown once. Runners join with: emisar runner --config runner.toml --server URL --join-token TOKEN"
            );
        }
    }
    Ok(())
}
