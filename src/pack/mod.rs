//! Tool packs: declarative YAML files that define every tool emisar offers.
//!
//! `raw` is the serde shape of the file (an action or step is an enum of its kinds there, and
//! serde refuses a file with none or several), `resolve` turns it into checked [`Tool`]s,
//! `action` checks actions and steps, `params` owns the typed parameters and their JSON
//! Schema, `template` fills path, query and argv templates, `jq` compiles and runs the
//! output-shaping programs.
//!
//! A new kind of action touches this module (`raw.rs`, `action.rs`), the node's engine that
//! runs it (`node/engine.rs` and its `Answers`, and so `emisar packs test`'s recorded answers)
//! and the docs (docs/pack-author-guide.md).

mod action;
mod jq;
mod params;
mod raw;
mod resolve;
mod template;

pub use action::{AcceptStatus, Action, ExecAction, HttpAction, Step, StepKind};
pub use jq::JqProgram;
pub use params::{Param, ParamType};
pub use params::{allowlist_admits, shown_value, template_text};
pub use resolve::{PackError, PackInfo, PackSet, Preview, Risk, Scope, Tool, ToolRef};
pub use template::Template;

pub use params::validate as validate_args;
pub use resolve::{
    REASON_MAX_CHARS, input_schema, input_validator, reason_schema, with_runner_names,
};
