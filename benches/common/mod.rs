//! What every benchmark here shares: settings from the environment, progress on stderr,
//! millisecond formatting and the Markdown + `key=value` output.

/// A numeric setting from the environment (`_` and `,` allowed as separators).
pub fn env_num(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .replace(['_', ','], "")
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, got `{v}`")),
        Err(_) => default,
    }
}

pub fn log(msg: impl AsRef<str>) {
    eprintln!("[bench] {}", msg.as_ref());
}

/// Milliseconds for a table cell (`n/a` when there were no samples).
pub fn ms(v: f64) -> String {
    if v.is_nan() {
        "n/a".into()
    } else if v < 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.1}")
    }
}

/// Markdown for stdout and `key=value` lines for `BENCH_SUMMARY`.
#[derive(Default)]
pub struct Out {
    pub report: String,
    pub summary: String,
}

impl Out {
    pub fn kv(&mut self, prefix: &str, key: &str, value: impl std::fmt::Display) {
        use std::fmt::Write;
        let _ = writeln!(self.summary, "{prefix}.{key}={value}");
    }
}
