//! Insertion order for table constructors: the compile-time half of Karmada-faithful `pairs`.
//!
//! gopher-lua iterates a table's non-array keys in the order they were inserted, and a table
//! constructor inserts its fields in source order. Lua 5.4 keeps no such order, so before a
//! script is compiled every table constructor is rewritten into a call that hands the table
//! and its keys, in source order, to the sandbox (`sandbox.lua` keeps the order from there):
//!
//! ```text
//! {type = c.type, status = "True"}   ->  __lifeboat_table({type = c.type, status = "True"}, "type", "status")
//! {[k] = v, n = 1}                    ->  __lifeboat_table({[__lifeboat_key(k)] = v, n = 1}, true, "n")
//! f{a = 1}                            ->  f(__lifeboat_table({a = 1}, "a"))
//! ```
//!
//! `__lifeboat_key` records a computed key as it is evaluated (`true` marks its place among the
//! named keys). The rewrite inserts text on the constructor's own line only, so error lines do
//! not move. Braces only ever open table constructors in Lua, so a lexer (strings, long
//! strings, comments) and bracket matching are enough; `function ... end` bodies inside a
//! constructor are skipped when looking for its fields.

/// The hidden parameter names; scripts may not use names with this prefix.
pub const TABLE_HOOK: &str = "__lifeboat_table";
pub const KEY_HOOK: &str = "__lifeboat_key";
const RESERVED_PREFIX: &str = "__lifeboat_";

/// Named keys passed per constructor at most: a Lua call takes fewer than 250 arguments. A
/// larger constructor gets no key list and orders its keys by value, as a converted object does.
const MAX_NAMED_KEYS: usize = 200;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Name,
    Keyword,
    String,
    Number,
    Symbol,
}

#[derive(Debug, Clone, Copy)]
struct Token {
    kind: Kind,
    start: usize,
    end: usize,
}

const KEYWORDS: &[&str] = &[
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if", "in",
    "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
];

/// Splits Lua source into significant tokens (comments and whitespace dropped). Malformed
/// input (an unfinished string, a stray byte) still yields tokens; the Lua compiler reports it.
fn tokenize(source: &str) -> Vec<Token> {
    let bytes = source.as_bytes();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let start = i;
        let kind = match c {
            b' ' | b'\t' | b'\r' | b'\n' | 0x0b | 0x0c => {
                i += 1;
                continue;
            }
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                i += 2;
                if let Some(level) = long_bracket_level(bytes, i) {
                    i = skip_long_bracket(bytes, i, level);
                } else {
                    while i < bytes.len() && bytes[i] != b'\n' && bytes[i] != b'\r' {
                        i += 1;
                    }
                }
                continue;
            }
            b'[' => match long_bracket_level(bytes, i) {
                Some(level) => {
                    i = skip_long_bracket(bytes, i, level);
                    Kind::String
                }
                None => {
                    i += 1;
                    Kind::Symbol
                }
            },
            b'"' | b'\'' => {
                i += 1;
                while i < bytes.len() && bytes[i] != c && bytes[i] != b'\n' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i = (i + 1).min(bytes.len());
                Kind::String
            }
            b'0'..=b'9' => {
                i = skip_number(bytes, i);
                Kind::Number
            }
            b'.' if bytes.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                i = skip_number(bytes, i);
                Kind::Number
            }
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => {
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                if KEYWORDS.contains(&&source[start..i]) {
                    Kind::Keyword
                } else {
                    Kind::Name
                }
            }
            _ => {
                let two = bytes.get(i..i + 2).unwrap_or(&[]);
                i += if bytes.get(i..i + 3) == Some(b"...") {
                    3
                } else if matches!(
                    two,
                    b"==" | b"~=" | b"<=" | b">=" | b"//" | b".." | b"::" | b"<<" | b">>"
                ) {
                    2
                } else {
                    // One byte; a non-ASCII byte is kept whole with its continuation bytes.
                    source[i..].chars().next().map_or(1, char::len_utf8)
                };
                Kind::Symbol
            }
        };
        tokens.push(Token {
            kind,
            start,
            end: i.min(bytes.len()),
        });
    }
    tokens
}

/// `[[`, `[=[`, `[==[` ... at `i`: the number of `=`.
fn long_bracket_level(bytes: &[u8], i: usize) -> Option<usize> {
    if bytes.get(i) != Some(&b'[') {
        return None;
    }
    let mut j = i + 1;
    while bytes.get(j) == Some(&b'=') {
        j += 1;
    }
    (bytes.get(j) == Some(&b'[')).then_some(j - i - 1)
}

/// The end of a long string or comment opened at `i` with `level` equals signs.
fn skip_long_bracket(bytes: &[u8], i: usize, level: usize) -> usize {
    let mut j = i + level + 2;
    while j < bytes.len() {
        if bytes[j] == b']'
            && bytes
                .get(j + 1..j + 1 + level)
                .is_some_and(|eq| eq.iter().all(|&b| b == b'='))
            && bytes.get(j + 1 + level) == Some(&b']')
        {
            return j + level + 2;
        }
        j += 1;
    }
    bytes.len()
}

/// The end of a numeral: digits, letters, dots and the sign of an exponent.
fn skip_number(bytes: &[u8], mut i: usize) -> usize {
    while let Some(&c) = bytes.get(i) {
        let exponent_sign =
            (c == b'+' || c == b'-') && matches!(bytes[i - 1], b'e' | b'E' | b'p' | b'P');
        if !(c.is_ascii_alphanumeric() || c == b'.' || c == b'_' || exponent_sign) {
            break;
        }
        i += 1;
    }
    i
}

/// One named or computed field of a constructor being scanned.
enum Key {
    Named(String),
    Computed,
}

/// A constructor being scanned.
struct Frame {
    /// Whether the constructor is a call argument without parentheses (`f{...}`).
    sugar: bool,
    keys: Vec<Key>,
    /// Open `(` and `[` inside the constructor (its own field level is 0).
    brackets: usize,
    /// Open `function`/`do`/`if`/`repeat` blocks inside the constructor.
    blocks: usize,
    /// The next token starts a field.
    field_start: bool,
    /// `brackets` value inside a computed key's `[ ]`, to find its `]`.
    computed_key_at: Option<usize>,
}

/// Rewrites every table constructor of `source` (see the module docs). Errors when the source
/// uses a reserved name.
pub fn rewrite_constructors(source: &str) -> Result<String, String> {
    let tokens = tokenize(source);
    let text = |t: &Token| &source[t.start..t.end];
    if let Some(t) = tokens
        .iter()
        .find(|t| t.kind == Kind::Name && text(t).starts_with(RESERVED_PREFIX))
    {
        return Err(format!(
            "names starting with {RESERVED_PREFIX} are reserved for the interpreter, found {}",
            text(t)
        ));
    }
    // (offset, text to insert there), in source order.
    let mut inserts: Vec<(usize, String)> = Vec::new();
    let mut frames: Vec<Frame> = Vec::new();
    let mut previous: Option<&Token> = None;
    for (index, token) in tokens.iter().enumerate() {
        let t = text(token);
        if token.kind == Kind::Symbol && t == "{" {
            // `name{`, `f(x){`, `t[i]{`, `"s"{`, `f{}{`: a call with the table as its argument.
            let sugar = previous.is_some_and(|p| {
                matches!(p.kind, Kind::Name | Kind::String)
                    || (p.kind == Kind::Symbol && matches!(text(p), ")" | "]" | "}"))
            });
            inserts.push((
                token.start,
                format!("{}{TABLE_HOOK}(", if sugar { "(" } else { "" }),
            ));
            if let Some(outer) = frames.last_mut() {
                outer.field_start = false;
            }
            frames.push(Frame {
                sugar,
                keys: Vec::new(),
                brackets: 0,
                blocks: 0,
                field_start: true,
                computed_key_at: None,
            });
            previous = Some(token);
            continue;
        }
        if token.kind == Kind::Symbol && t == "}" {
            if let Some(frame) = frames.pop() {
                let mut closing = String::new();
                if frame.keys.len() <= MAX_NAMED_KEYS {
                    for key in &frame.keys {
                        match key {
                            Key::Named(name) => {
                                closing.push_str(", \"");
                                closing.push_str(name);
                                closing.push('"');
                            }
                            Key::Computed => closing.push_str(", true"),
                        }
                    }
                }
                closing.push(')');
                if frame.sugar {
                    closing.push(')');
                }
                inserts.push((token.end, closing));
            }
            previous = Some(token);
            continue;
        }
        let Some(frame) = frames.last_mut() else {
            previous = Some(token);
            continue;
        };
        let at_field_level = frame.brackets == 0 && frame.blocks == 0;
        if at_field_level && frame.field_start {
            if token.kind == Kind::Name
                && tokens
                    .get(index + 1)
                    .is_some_and(|next| next.kind == Kind::Symbol && text(next) == "=")
            {
                frame.keys.push(Key::Named(t.to_string()));
            } else if token.kind == Kind::Symbol && t == "[" {
                frame.keys.push(Key::Computed);
                frame.computed_key_at = Some(1);
                inserts.push((token.end, format!("{KEY_HOOK}(")));
            }
        }
        frame.field_start = false;
        match (token.kind, t) {
            (Kind::Symbol, "(" | "[") => frame.brackets += 1,
            (Kind::Symbol, ")" | "]") => {
                if t == "]" && frame.computed_key_at == Some(frame.brackets) {
                    frame.computed_key_at = None;
                    inserts.push((token.start, ")".to_string()));
                }
                frame.brackets = frame.brackets.saturating_sub(1);
            }
            (Kind::Symbol, "," | ";") if at_field_level => frame.field_start = true,
            (Kind::Keyword, "function" | "do" | "if" | "repeat") => frame.blocks += 1,
            (Kind::Keyword, "end" | "until") => frame.blocks = frame.blocks.saturating_sub(1),
            _ => {}
        }
        previous = Some(token);
    }
    let extra: usize = inserts.iter().map(|(_, s)| s.len()).sum();
    let mut out = String::with_capacity(source.len() + extra);
    let mut copied = 0;
    // Inserts are in source order except that a constructor's closing text and an insert at
    // the same offset (`}{`) must keep push order: a stable sort by offset does that.
    inserts.sort_by_key(|(offset, _)| *offset);
    for (offset, insert) in inserts {
        out.push_str(&source[copied..offset]);
        out.push_str(&insert);
        copied = offset;
    }
    out.push_str(&source[copied..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewrite(source: &str) -> String {
        rewrite_constructors(source).unwrap()
    }

    #[test]
    fn named_fields_are_listed_in_source_order() {
        assert_eq!(
            rewrite("return {b = 1, a = {x = 2}, 3}"),
            "return __lifeboat_table({b = 1, a = __lifeboat_table({x = 2}, \"x\"), 3}, \"b\", \"a\")"
        );
        assert_eq!(rewrite("local t = {}"), "local t = __lifeboat_table({})");
        assert_eq!(
            rewrite("x = {a = 1; b == 2, c = 3}"),
            "x = __lifeboat_table({a = 1; b == 2, c = 3}, \"a\", \"c\")"
        );
    }

    #[test]
    fn computed_keys_are_recorded_as_evaluated() {
        assert_eq!(
            rewrite("t = {[k] = 1, n = 2, [f(x)[1]] = 3}"),
            "t = __lifeboat_table({[__lifeboat_key(k)] = 1, n = 2, [__lifeboat_key(f(x)[1])] = 3}, true, \"n\", true)"
        );
    }

    #[test]
    fn call_sugar_keeps_its_meaning() {
        assert_eq!(rewrite("f{a = 1}"), "f(__lifeboat_table({a = 1}, \"a\"))");
        assert_eq!(
            rewrite("obj:m{} g(){}{}"),
            "obj:m(__lifeboat_table({})) g()(__lifeboat_table({}))(__lifeboat_table({}))"
        );
        assert_eq!(
            rewrite("return {x}, not {y}"),
            "return __lifeboat_table({x}), not __lifeboat_table({y})"
        );
    }

    #[test]
    fn strings_comments_and_function_bodies_are_not_fields() {
        let source = "local s = \"{a = 1}\" -- {b = 2}\n--[[ {c = 3} ]] local l = [==[{d = 4}]==]\nreturn {f = function(a, b) local x; x, y = 1, 2; if a then z = 3 end end, g = 'x{'}";
        let out = rewrite(source);
        assert!(out.starts_with(
            "local s = \"{a = 1}\" -- {b = 2}\n--[[ {c = 3} ]] local l = [==[{d = 4}]==]\n"
        ));
        assert!(out.ends_with("end, g = 'x{'}, \"f\", \"g\")"), "{out}");
        assert_eq!(out.lines().count(), source.lines().count());
    }

    #[test]
    fn escapes_and_numbers_do_not_confuse_the_lexer() {
        assert_eq!(
            rewrite("t = {a = \"q\\\"{\", b = 1e+5, c = 0x1p-2, d = .5}"),
            "t = __lifeboat_table({a = \"q\\\"{\", b = 1e+5, c = 0x1p-2, d = .5}, \"a\", \"b\", \"c\", \"d\")"
        );
    }

    #[test]
    fn reserved_names_are_rejected() {
        let err = rewrite_constructors("local __lifeboat_table = 1").unwrap_err();
        assert!(err.contains("reserved"), "{err}");
        assert!(rewrite_constructors("local s = '__lifeboat_table'").is_ok());
    }

    #[test]
    fn huge_constructors_get_no_key_list() {
        let fields: Vec<String> = (0..=MAX_NAMED_KEYS)
            .map(|i| format!("k{i} = {i}"))
            .collect();
        let source = format!("return {{{}}}", fields.join(", "));
        assert!(rewrite(&source).ends_with("})"));
    }
}
