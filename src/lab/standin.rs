//! The stand-in side of a lab node command: `emisar lab-exec --control URL --node NODE --
//! PROGRAM ARGS…`, which a lab runner's exec action reaches through the small script the lab
//! writes as `PROGRAM` first on that runner's PATH. It sends the argv to the lab process,
//! prints what comes back on stdout and stderr, and exits with its exit code.
//!
//! The lab's token comes in the `EMISAR_LAB_TOKEN` environment variable, set by the script
//! (the runner clears the environment of exec actions).

use std::io::Write;

use serde_json::json;

use super::node::Output;

pub const TOKEN_ENV: &str = "EMISAR_LAB_TOKEN";

/// Runs `argv` on `node` through the lab at `control`; returns the exit code to exit with.
pub async fn run(control: &str, node: &str, argv: &[String]) -> i32 {
    let program = argv.first().map_or("?", String::as_str);
    let token = std::env::var(TOKEN_ENV).unwrap_or_default();
    let answer = async {
        let res = reqwest::Client::new()
            .post(format!("{}/v1/exec", control.trim_end_matches('/')))
            .bearer_auth(token)
            .json(&json!({"node": node, "argv": argv}))
            .send()
            .await
            .map_err(|e| {
                // reqwest's own message hides the cause ("error sending request").
                let mut text = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    text.push_str(&format!(": {s}"));
                    source = s.source();
                }
                text
            })?;
        if !res.status().is_success() {
            let status = res.status();
            let body = res.text().await.unwrap_or_default();
            return Err(format!("HTTP {status}: {body}"));
        }
        res.json::<Output>().await.map_err(|e| e.to_string())
    };
    match answer.await {
        Ok(out) => {
            let _ = std::io::stdout().write_all(out.stdout.as_bytes());
            let _ = std::io::stdout().flush();
            let _ = std::io::stderr().write_all(out.stderr.as_bytes());
            out.code
        }
        Err(e) => {
            eprintln!(
                "{program} (emisar lab stand-in on {node}): the lab at {control} did not answer: {e}"
            );
            // What a shell reports for a command it could not run.
            126
        }
    }
}
