//! What a lab agent does with its config file when it starts: HCL 1's rules for the
//! `key = value` lines and blocks an agent config is made of (Nomad reads its agent config
//! with HCL 1), enough to refuse what the agent would refuse and to say where, in HCL 1's
//! words (`At 3:22: Unknown token: 3:22 IDENT flase`).
//!
//! The lab's config files hold one statement per line: an assignment (`key = value`, the
//! value a quoted string, a number, `true`, `false`, a `[...]` list on that line), a block
//! opening (`client {`) or a block's end (`}`). Comments start with `#` or `//`.

/// Checks `text` as an agent reads it at start; the error is HCL 1's, with the position.
pub fn check(text: &str) -> Result<(), String> {
    let mut open_blocks = 0usize;
    let mut last_line = 0;
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        last_line = line;
        let statement = without_comment(raw).trim();
        if statement.is_empty() {
            continue;
        }
        let column = raw.find(statement).unwrap_or(0) + 1;
        if statement == "}" {
            if open_blocks == 0 {
                return Err(format!(
                    "At {line}:{column}: expected: IDENT | STRING got: RBRACE"
                ));
            }
            open_blocks -= 1;
            continue;
        }
        match statement.split_once('=') {
            Some((_, value)) => {
                let value = value.trim();
                let at = raw.rfind(value).unwrap_or(0) + 1;
                if value == "{" {
                    open_blocks += 1;
                } else {
                    check_value(value, line, at)?;
                }
            }
            None if statement.ends_with('{') => open_blocks += 1,
            None => {
                let key = statement.split_whitespace().next().unwrap_or(statement);
                return Err(format!(
                    "At {line}:{column}: key '{key}' expected start of object ('{{') or assignment ('=')"
                ));
            }
        }
    }
    if open_blocks > 0 {
        return Err(format!(
            "At {}:1: object expected closing RBRACE got: EOF",
            last_line + 1
        ));
    }
    Ok(())
}

/// The line up to its comment (a `#` or `//` outside a quoted string).
fn without_comment(line: &str) -> &str {
    let mut quoted = false;
    let bytes = line.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'"' => quoted = !quoted,
            b'#' if !quoted => return &line[..i],
            b'/' if !quoted && bytes.get(i + 1) == Some(&b'/') => return &line[..i],
            _ => {}
        }
    }
    line
}

/// One assigned value: a string, a number, a boolean or a one-line list.
fn check_value(value: &str, line: usize, column: usize) -> Result<(), String> {
    let quoted = value.len() >= 2 && value.starts_with('"') && value.ends_with('"');
    let list = value.starts_with('[') && value.ends_with(']');
    let number = value.parse::<f64>().is_ok();
    if quoted || list || number || value == "true" || value == "false" {
        return Ok(());
    }
    let token = value.split_whitespace().next().unwrap_or(value);
    if token.starts_with('"') {
        return Err(format!("At {line}:{column}: literal not terminated"));
    }
    Err(format!(
        "At {line}:{column}: Unknown token: {line}:{column} IDENT {token}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "# Nomad agent\ndata_dir  = \"/opt/nomad/data\"\nbind_addr = \"0.0.0.0\" // all\nserver {\n  enabled          = true\n  bootstrap_expect = 3\n}\nclient {\n  enabled = true\n  servers = [\"10.0.0.101\", \"10.0.0.103\"]\n}\n";

    #[test]
    fn a_config_as_nomad_writes_it_passes() {
        assert_eq!(check(GOOD), Ok(()));
        assert_eq!(check(""), Ok(()));
    }

    #[test]
    fn a_misspelt_boolean_is_an_unknown_token_at_its_place() {
        let text = format!("{GOOD}leave_on_terminate = flase\n");
        assert_eq!(
            check(&text),
            Err("At 12:22: Unknown token: 12:22 IDENT flase".into())
        );
    }

    #[test]
    fn a_line_without_assignment_or_block_is_refused() {
        assert_eq!(
            check("leave_on_terminate false\n"),
            Err(
                "At 1:1: key 'leave_on_terminate' expected start of object ('{') or assignment ('=')"
                    .into()
            )
        );
    }

    #[test]
    fn blocks_must_close_and_not_close_twice() {
        assert_eq!(
            check("client {\n  enabled = true\n"),
            Err("At 3:1: object expected closing RBRACE got: EOF".into())
        );
        assert_eq!(
            check("}\n"),
            Err("At 1:1: expected: IDENT | STRING got: RBRACE".into())
        );
    }

    #[test]
    fn an_unterminated_string_is_refused() {
        assert_eq!(
            check("data_dir = \"/opt/nomad\n"),
            Err("At 1:12: literal not terminated".into())
        );
    }
}
