//! Multi-document YAML reading that accepts what Kubernetes' YAML reader accepts.
//!
//! serde-saphyr follows YAML 1.2 strictly and rejects a quoted scalar whose continuation line is
//! not indented past its key, which go-yaml (and so Karmada's test files) accepts. Indenting such a
//! continuation line does not change the scalar (leading blanks of continuation lines are folded
//! away), so the reader re-indents the reported line and retries.

use serde_json::Value;

const QUOTED_INDENT_ERROR: &str = "invalid indentation in multiline quoted scalar";
const MAX_REPAIRS: usize = 1000;

/// Parses every non-empty document of a YAML (or JSON) text.
pub fn parse_documents(text: &str) -> Result<Vec<Value>, String> {
    let mut text = std::borrow::Cow::Borrowed(text);
    for _ in 0..MAX_REPAIRS {
        match serde_saphyr::from_multiple::<Value>(&text) {
            Ok(docs) => return Ok(docs.into_iter().filter(|d| !d.is_null()).collect()),
            Err(e) => {
                let message = e.to_string();
                let line = e.location().map(|l| l.line() as usize);
                match line.filter(|_| message.contains(QUOTED_INDENT_ERROR)) {
                    Some(line) if line >= 1 => match reindent(&text, line - 1) {
                        Some(fixed) => text = std::borrow::Cow::Owned(fixed),
                        None => return Err(message),
                    },
                    _ => return Err(message),
                }
            }
        }
    }
    Err("YAML needs too many indentation repairs".to_string())
}

fn indentation(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// Indents line `index` one column past the previous non-blank line.
fn reindent(text: &str, index: usize) -> Option<String> {
    let lines: Vec<&str> = text.split('\n').collect();
    let current = *lines.get(index)?;
    let previous = lines[..index].iter().rev().find(|l| !l.trim().is_empty())?;
    let wanted = (indentation(previous) + 1).max(indentation(current) + 1);
    let mut out = String::with_capacity(text.len() + wanted);
    for (i, line) in lines.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        if i == index {
            out.push_str(&" ".repeat(wanted - indentation(line)));
        }
        out.push_str(line);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_under_indented_quoted_continuations_like_go_yaml() {
        let text =
            "items:\n  - message: 'a ''b''\n    and c'\n    reason: x\n---\n---\nname: two\n";
        let docs = parse_documents(text).unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0]["items"][0]["message"], "a 'b' and c");
        assert_eq!(docs[0]["items"][0]["reason"], "x");
    }

    #[test]
    fn other_errors_are_reported() {
        assert!(parse_documents("a: [1, 2\n").is_err());
    }
}
