//! jq programs (the jaq crate) that shape an action's raw result into what an agent reads.
//!
//! Programs are checked when a pack loads (a pack with a bad program does not load) and run
//! synchronously: jaq values are reference-counted and not `Send`, so a run never spans an
//! `.await`. The compiled form is kept only from a program's first run on: each compiled
//! program carries its own compiled copy of jq's standard library (tens of KiB of heap), and
//! the stock packs hold dozens of programs, most of which a given node never runs. Compiling
//! every one eagerly and keeping it was about half of an idle runner's heap.
//!
//! The stock packs' programs are not even compiled to check them when a process starts
//! ([`JqProgram::stock`]): they are part of the binary, and a unit test compiles every one
//! (`pack::resolve::tests::every_stock_program_compiles`). Each compile parses and compiles
//! jq's standard library again (~0.5 ms), and checking the stock packs' ~60 programs was
//! four fifths of a runner's start-up CPU: a fleet of 1,000 starting on one machine spent
//! half a minute of CPU on it.

use jaq_core::load::{Arena, File, Loader};
use jaq_core::{Compiler, Ctx, Vars, data};
use jaq_json::Val;
use serde_json::Value;

type Data = data::JustLut<Val>;

/// The most outputs one program may produce; more is a pack bug, not a result.
const MAX_OUTPUTS: usize = 1000;

pub struct JqProgram {
    source: String,
    /// Compiled on the first run; `compile` has already shown that this succeeds.
    filter: std::sync::OnceLock<jaq_core::Filter<Data>>,
}

impl std::fmt::Debug for JqProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("JqProgram").field(&self.source).finish()
    }
}

impl JqProgram {
    /// Checks that `code` compiles; the compiled form is dropped now and built again on the
    /// first run (see the module docs).
    pub fn compile(code: &str) -> Result<Self, String> {
        compile_filter(code)?;
        Ok(Self::stock(code))
    }

    /// A program of a stock pack, kept as text and compiled on its first run: the unit test
    /// named in the module docs has shown that it compiles.
    pub(super) fn stock(code: &str) -> Self {
        JqProgram {
            source: code.to_owned(),
            filter: std::sync::OnceLock::new(),
        }
    }

    fn filter(&self) -> Result<&jaq_core::Filter<Data>, String> {
        if let Some(filter) = self.filter.get() {
            return Ok(filter);
        }
        // Two threads may compile at once the first time; one result is kept.
        let filter = compile_filter(&self.source)?;
        Ok(self.filter.get_or_init(|| filter))
    }
}

/// Compiles `code` with jq's standard library.
fn compile_filter(code: &str) -> Result<jaq_core::Filter<Data>, String> {
    let defs = jaq_core::defs()
        .chain(jaq_std::defs())
        .chain(jaq_json::defs());
    let funs = jaq_core::funs()
        .chain(jaq_std::funs())
        .chain(jaq_json::funs());
    let arena = Arena::default();
    let modules = Loader::new(defs)
        .load(&arena, File { code, path: () })
        .map_err(|errs| {
            let msgs: Vec<String> = errs
                .into_iter()
                .flat_map(|(_, e)| match e {
                    jaq_core::load::Error::Lex(v) => v
                        .into_iter()
                        .map(|(x, at)| {
                            format!("expected {} at offset {}", x.as_str(), offset(code, at))
                        })
                        .collect::<Vec<_>>(),
                    jaq_core::load::Error::Parse(v) => v
                        .into_iter()
                        .map(|(x, at)| {
                            format!("expected {} at offset {}", x.as_str(), offset(code, at))
                        })
                        .collect(),
                    jaq_core::load::Error::Io(v) => {
                        v.into_iter().map(|(p, e)| format!("{p}: {e}")).collect()
                    }
                })
                .collect();
            format!("jq program `{code}`: {}", msgs.join("; "))
        })?;
    Compiler::default()
        .with_funs(funs)
        .compile(modules)
        .map_err(|errs| {
            let msgs: Vec<String> = errs
                .into_iter()
                .flat_map(|(_, es)| es)
                .map(|(name, _)| format!("undefined `{name}` at offset {}", offset(code, name)))
                .collect();
            format!("jq program `{code}`: {}", msgs.join("; "))
        })
}

impl JqProgram {
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Runs the program on `input`. One output is returned as is, several as an array.
    pub fn run(&self, input: &Value) -> Result<Value, String> {
        let filter = self.filter()?;
        let input: Val = serde_json::from_value(input.clone()).map_err(|e| e.to_string())?;
        let ctx = Ctx::<Data>::new(&filter.lut, Vars::new([]));
        let mut outputs = Vec::new();
        for result in filter.id.run((ctx, input)).take(MAX_OUTPUTS + 1) {
            match result {
                // jaq values print as JSON text; parsing it back is the supported conversion.
                Ok(v) => {
                    outputs.push(serde_json::from_str(&v.to_string()).map_err(|e| e.to_string())?)
                }
                // Never `unwrap_valr`: on `halt` it would exit the whole process.
                Err(exn) => {
                    return Err(match exn.get_err() {
                        Ok(e) => format!("jq error: {e}"),
                        Err(_) => "jq program halted".to_owned(),
                    });
                }
            }
        }
        if outputs.len() > MAX_OUTPUTS {
            return Err(format!(
                "jq program produced more than {MAX_OUTPUTS} outputs"
            ));
        }
        Ok(if outputs.len() == 1 {
            outputs.pop().unwrap_or(Value::Null)
        } else {
            Value::Array(outputs)
        })
    }
}

/// Byte offset of `part` inside `code` (jaq reports positions as sub-slices of the source).
fn offset(code: &str, part: &str) -> usize {
    (part.as_ptr() as usize).saturating_sub(code.as_ptr() as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn shapes_json() {
        let p = JqProgram::compile(
            r#"[.[] | select(.serverStatus) | {name, servers: (.serverStatus | to_entries | map({url: .key, status: .value}))}]"#,
        )
        .unwrap();
        let out = p
            .run(&json!([{"name": "app@file", "serverStatus": {"http://a": "UP", "http://b": "DOWN"}}, {"name": "api@internal"}]))
            .unwrap();
        assert_eq!(
            out,
            json!([{"name": "app@file", "servers": [{"url": "http://a", "status": "UP"}, {"url": "http://b", "status": "DOWN"}]}])
        );
    }

    /// A loaded program keeps no compiled form until it runs: an idle node holds the stock
    /// packs' dozens of programs as text, not as compiled copies of jq's standard library.
    #[test]
    fn keeps_the_compiled_form_only_from_the_first_run() {
        let p = JqProgram::compile("{n: (.a | length)}").unwrap();
        assert!(p.filter.get().is_none(), "compiled at load");
        assert_eq!(p.run(&json!({"a": [1, 2]})).unwrap(), json!({"n": 2}));
        assert!(p.filter.get().is_some(), "not kept after the first run");
        assert_eq!(p.run(&json!({"a": []})).unwrap(), json!({"n": 0}));
    }

    #[test]
    fn reports_errors() {
        assert!(
            JqProgram::compile(".a | map(")
                .unwrap_err()
                .contains("offset")
        );
        assert!(
            JqProgram::compile("nosuchfn(1)")
                .unwrap_err()
                .contains("nosuchfn")
        );
        assert!(
            JqProgram::compile(r#""s" + 1"#)
                .unwrap()
                .run(&json!(null))
                .unwrap_err()
                .contains("jq error")
        );
        assert_eq!(
            JqProgram::compile(".[]")
                .unwrap()
                .run(&json!([1, 2]))
                .unwrap(),
            json!([1, 2])
        );
        assert!(JqProgram::compile("halt").unwrap().run(&json!(1)).is_err());
    }
}
