//! `emisar packs`: check, list and show the tool packs.

use std::path::PathBuf;

use clap::Subcommand;

use crate::pack::PackSet;

#[derive(Subcommand)]
pub enum PacksCommand {
    /// Validate every pack; fails on any error, such as a free-form string param.
    #[command(after_help = "Example: emisar packs check --dir /etc/emisar/packs")]
    Check {
        /// A directory of pack files that add to or replace the stock packs.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// One line per tool: name, risk, scope, description.
    #[command(after_help = "Example: emisar packs list | grep risk:high")]
    List {
        /// A directory of pack files that add to or replace the stock packs.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Run the packs' example calls (`DIR/tests/<pack>.yaml`, or the stock packs' own) through
    /// the runner's engine with recorded service answers: no fleet, no network. Exits 1 when
    /// any case fails.
    #[command(after_help = "Example: emisar packs test ./packs")]
    Test {
        /// A packs directory (as `packs_dir`); its cases are in `DIR/tests/`.
        dir: Option<PathBuf>,
    },
    /// A tool's input schema, action and example.
    #[command(after_help = "Example: emisar packs show linux.systemctl_restart")]
    Show {
        /// The tool's name, e.g. traefik.services.
        tool: String,
        /// A directory of pack files that add to or replace the stock packs.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

pub(super) async fn run(command: PacksCommand) -> anyhow::Result<i32> {
    match command {
        PacksCommand::Test { dir } => return super::packs_test::run(dir.as_deref()).await,
        PacksCommand::Check { dir } => {
            let set = PackSet::load(dir.as_deref())?;
            for p in set.packs() {
                let n = set.tools().filter(|t| t.pack == p.name).count();
                println!(
                    "ok  {:<10} {n:>2} tools  {}  {}",
                    p.name,
                    &p.digest[..12],
                    p.origin
                );
            }
        }
        PacksCommand::List { dir } => {
            let set = PackSet::load(dir.as_deref())?;
            println!("{:<28} {:<5} {:<8} DESCRIPTION", "TOOL", "RISK", "SCOPE");
            for t in set.tools() {
                let first_sentence = t.description.split(". ").next().unwrap_or_default();
                let scope = serde_json::to_value(t.scope)?;
                println!(
                    "{:<28} {:<5} {:<8} {}",
                    t.name,
                    t.risk.as_str(),
                    scope.as_str().unwrap_or_default(),
                    first_sentence
                );
            }
        }
        PacksCommand::Show { tool, dir } => {
            let set = PackSet::load(dir.as_deref())?;
            let Some(t) = set.tool(&tool) else {
                anyhow::bail!("no tool named `{tool}` (see `emisar packs list`)");
            };
            let steps: Vec<serde_json::Value> =
                t.steps.iter().map(crate::pack::Step::describe).collect();
            let preview: Option<Vec<serde_json::Value>> = t
                .preview
                .as_ref()
                .map(|p| p.steps.iter().map(crate::pack::Step::describe).collect());
            let shown = serde_json::json!({
                "tool": t.name,
                "description": t.description,
                "risk": t.risk,
                "scope": t.scope,
                "input_schema": crate::pack::input_schema(t),
                "steps": steps,
                "preview": preview,
                "verify": shown_verify(t),
                "output": t.output.as_ref().map(|o| o.source()),
                "example": t.example,
            });
            println!("{}", serde_json::to_string_pretty(&shown)?);
        }
    }
    Ok(0)
}

/// A write's health gate as `packs show` prints it: its deadline and steps, or the pack's
/// reason why it has none; null for a read.
fn shown_verify(t: &crate::pack::Tool) -> serde_json::Value {
    match (&t.verify, &t.no_verify) {
        (Some(v), _) => serde_json::json!({
            "within_s": v.within.as_secs(),
            "steps": v.steps.iter().map(crate::pack::Step::describe).collect::<Vec<_>>(),
        }),
        (None, Some(reason)) => serde_json::json!({"none": reason}),
        (None, None) => serde_json::Value::Null,
    }
}
