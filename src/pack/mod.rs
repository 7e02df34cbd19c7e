//! Tool packs: declarative YAML files that define every tool emisar offers.
//!
//! `raw` is the serde shape of the file, `resolve` turns it into checked [`Tool`]s, `params`
//! owns the typed parameters and their JSON Schema, `template` fills path, query and argv
//! templates, `jq` compiles and runs the output-shaping programs.

mod jq;
mod params;
mod raw;
mod resolve;
mod template;

pub use jq::JqProgram;
pub use params::is_identifier;
pub use params::{Param, ParamType};
pub use resolve::{
    Action, ExecAction, HttpAction, PackError, PackInfo, PackSet, Risk, Scope, Tool, ToolRef,
};
pub use template::Template;

pub use params::validate as validate_args;
pub use resolve::{input_schema, input_validator};
