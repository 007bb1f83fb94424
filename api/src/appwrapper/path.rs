//! PodSet paths: where a PodTemplateSpec sits inside a component (reference §1.1).
//!
//! Grammar: the literal `template` (the component's wrapped object) followed by any mix of
//! `.field` and `[index]` segments, e.g. `template.spec.replicatedJobs[0].template.spec.template`.
//! Indexes are non-negative decimal integers. Parsing catches the syntax errors; resolution
//! against an object catches missing fields, out-of-range indexes and type mismatches (an array
//! used as a map, a map indexed as an array). Every error names the path and the reason.

use serde_json::Value;

/// One step of a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    /// `.name`: look up a field of an object.
    Field(String),
    /// `[n]`: take an element of an array.
    Index(usize),
}

/// A parsed podSet path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSetPath {
    text: String,
    segments: Vec<Segment>,
}

/// Why a path is malformed or does not resolve.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathErrorReason {
    #[error("the path is empty")]
    Empty,
    #[error("the path must start with `template`")]
    MissingTemplatePrefix,
    #[error("empty field name at byte {at}")]
    EmptyField { at: usize },
    #[error("unterminated `[` at byte {at}: missing `]`")]
    UnterminatedBracket { at: usize },
    #[error("index `{index}` at byte {at} is not a non-negative integer")]
    NonIntegerIndex { at: usize, index: String },
    #[error("index {index} at byte {at} is negative")]
    NegativeIndex { at: usize, index: String },
    #[error("unexpected `{found}` at byte {at}: expected `.field` or `[index]`")]
    UnexpectedCharacter { at: usize, found: char },
    #[error("`{prefix}` has no field `{field}`")]
    FieldNotFound { prefix: String, field: String },
    #[error("`{prefix}` is {found}, not a map: cannot look up field `{field}`")]
    NotAMap {
        prefix: String,
        field: String,
        found: &'static str,
    },
    #[error("`{prefix}` is {found}, not an array: cannot take index [{index}]")]
    NotAnArray {
        prefix: String,
        index: usize,
        found: &'static str,
    },
    #[error("index [{index}] is out of range: `{prefix}` has {len} elements")]
    IndexOutOfRange {
        prefix: String,
        index: usize,
        len: usize,
    },
}

/// A malformed or unresolvable podSet path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("path `{path}`: {reason}")]
pub struct PathError {
    /// The path as written.
    pub path: String,
    /// What is wrong with it.
    pub reason: PathErrorReason,
}

const ROOT: &str = "template";

impl PodSetPath {
    /// Parses a path; syntax errors only (resolution is [`PodSetPath::get`]).
    pub fn parse(text: &str) -> Result<Self, PathError> {
        let fail = |reason| PathError {
            path: text.to_string(),
            reason,
        };
        if text.is_empty() {
            return Err(fail(PathErrorReason::Empty));
        }
        let Some(mut rest) = text.strip_prefix(ROOT) else {
            return Err(fail(PathErrorReason::MissingTemplatePrefix));
        };
        let mut segments = Vec::new();
        while let Some(first) = rest.chars().next() {
            let at = text.len() - rest.len();
            match first {
                '.' => {
                    let after = &rest[1..];
                    let end = after.find(['.', '[']).unwrap_or(after.len());
                    let field = &after[..end];
                    if field.is_empty() {
                        return Err(fail(PathErrorReason::EmptyField { at: at + 1 }));
                    }
                    // `]` inside a field name is a stray bracket, e.g. `template.a]`.
                    if let Some(pos) = field.find(']') {
                        return Err(fail(PathErrorReason::UnexpectedCharacter {
                            at: at + 1 + pos,
                            found: ']',
                        }));
                    }
                    segments.push(Segment::Field(field.to_string()));
                    rest = &after[end..];
                }
                '[' => {
                    let Some(close) = rest.find(']') else {
                        return Err(fail(PathErrorReason::UnterminatedBracket { at }));
                    };
                    let inner = &rest[1..close];
                    if inner.starts_with('-')
                        && inner.len() > 1
                        && inner[1..].bytes().all(|b| b.is_ascii_digit())
                    {
                        return Err(fail(PathErrorReason::NegativeIndex {
                            at: at + 1,
                            index: inner.to_string(),
                        }));
                    }
                    // Digits only: `+1`, ` 1` and `1e2` are not indexes.
                    let index = if !inner.is_empty() && inner.bytes().all(|b| b.is_ascii_digit()) {
                        inner.parse::<usize>().ok()
                    } else {
                        None
                    };
                    let Some(index) = index else {
                        return Err(fail(PathErrorReason::NonIntegerIndex {
                            at: at + 1,
                            index: inner.to_string(),
                        }));
                    };
                    segments.push(Segment::Index(index));
                    rest = &rest[close + 1..];
                }
                found => {
                    return Err(fail(PathErrorReason::UnexpectedCharacter { at, found }));
                }
            }
        }
        Ok(PodSetPath {
            text: text.to_string(),
            segments,
        })
    }

    /// The path as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The segments after `template`.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The value at this path inside `template` (the component's wrapped object).
    pub fn get<'v>(&self, template: &'v Value) -> Result<&'v Value, PathError> {
        let mut cursor = template;
        let mut prefix = String::from(ROOT);
        for segment in &self.segments {
            cursor = self.step(cursor, segment, &prefix)?;
            push_segment(&mut prefix, segment);
        }
        Ok(cursor)
    }

    /// Mutable access to the value at this path inside `template`.
    pub fn get_mut<'v>(&self, template: &'v mut Value) -> Result<&'v mut Value, PathError> {
        // Resolve read-only first so the error carries the same context as `get`, then walk
        // mutably knowing every step succeeds.
        self.get(template)?;
        let mut cursor = template;
        for segment in &self.segments {
            cursor = match (segment, cursor) {
                (Segment::Field(field), Value::Object(map)) => match map.get_mut(field) {
                    Some(next) => next,
                    None => return Err(self.internal_error()),
                },
                (Segment::Index(index), Value::Array(items)) => match items.get_mut(*index) {
                    Some(next) => next,
                    None => return Err(self.internal_error()),
                },
                _ => return Err(self.internal_error()),
            };
        }
        Ok(cursor)
    }

    fn step<'v>(
        &self,
        cursor: &'v Value,
        segment: &Segment,
        prefix: &str,
    ) -> Result<&'v Value, PathError> {
        let fail = |reason| PathError {
            path: self.text.clone(),
            reason,
        };
        match segment {
            Segment::Field(field) => match cursor {
                Value::Object(map) => map.get(field).ok_or_else(|| {
                    fail(PathErrorReason::FieldNotFound {
                        prefix: prefix.to_string(),
                        field: field.clone(),
                    })
                }),
                other => Err(fail(PathErrorReason::NotAMap {
                    prefix: prefix.to_string(),
                    field: field.clone(),
                    found: json_type(other),
                })),
            },
            Segment::Index(index) => match cursor {
                Value::Array(items) => items.get(*index).ok_or_else(|| {
                    fail(PathErrorReason::IndexOutOfRange {
                        prefix: prefix.to_string(),
                        index: *index,
                        len: items.len(),
                    })
                }),
                other => Err(fail(PathErrorReason::NotAnArray {
                    prefix: prefix.to_string(),
                    index: *index,
                    found: json_type(other),
                })),
            },
        }
    }

    // Unreachable after a successful read-only walk; reported rather than panicking.
    fn internal_error(&self) -> PathError {
        PathError {
            path: self.text.clone(),
            reason: PathErrorReason::FieldNotFound {
                prefix: ROOT.to_string(),
                field: self.text.clone(),
            },
        }
    }
}

impl std::fmt::Display for PodSetPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

fn push_segment(prefix: &mut String, segment: &Segment) {
    match segment {
        Segment::Field(field) => {
            prefix.push('.');
            prefix.push_str(field);
        }
        Segment::Index(index) => {
            prefix.push('[');
            prefix.push_str(&index.to_string());
            prefix.push(']');
        }
    }
}

/// "an array", "a string", … for error messages.
pub(crate) fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "a map",
    }
}

/// Parses `path` and returns the value it names inside `template`.
pub fn get<'v>(template: &'v Value, path: &str) -> Result<&'v Value, PathError> {
    PodSetPath::parse(path)?.get(template)
}

/// Parses `path` and returns mutable access to the value it names inside `template`.
pub fn get_mut<'v>(template: &'v mut Value, path: &str) -> Result<&'v mut Value, PathError> {
    PodSetPath::parse(path)?.get_mut(template)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn jobset() -> Value {
        json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "spec": {"replicatedJobs": [
                {"name": "a", "template": {"spec": {"template": {"spec": {"containers": []}}}}},
                {"name": "b", "template": {"spec": {"template": {"spec": {"containers": []}}}}}
            ]}
        })
    }

    fn reason(path: &str) -> PathErrorReason {
        match get(&jobset(), path) {
            Ok(v) => panic!("{path} resolved to {v}"),
            Err(err) => {
                assert_eq!(err.path, path);
                err.reason
            }
        }
    }

    #[test]
    fn resolves_fields_and_indexes() {
        let t = jobset();
        assert_eq!(get(&t, "template").unwrap(), &t);
        assert_eq!(
            get(&t, "template.spec.replicatedJobs[1].name").unwrap(),
            &json!("b")
        );
        assert!(
            get(&t, "template.spec.replicatedJobs[0].template.spec.template")
                .unwrap()
                .get("spec")
                .is_some()
        );
    }

    #[test]
    fn get_mut_edits_in_place() {
        let mut t = jobset();
        *get_mut(&mut t, "template.spec.replicatedJobs[0].name").unwrap() = json!("renamed");
        assert_eq!(t["spec"]["replicatedJobs"][0]["name"], json!("renamed"));
        let err = get_mut(&mut t, "template.spec.replicatedJobs[2]").unwrap_err();
        assert!(matches!(
            err.reason,
            PathErrorReason::IndexOutOfRange {
                index: 2,
                len: 2,
                ..
            }
        ));
    }

    #[test]
    fn syntax_errors_name_the_reason() {
        assert_eq!(
            PodSetPath::parse("").unwrap_err().reason,
            PathErrorReason::Empty
        );
        assert_eq!(
            reason("spec.template"),
            PathErrorReason::MissingTemplatePrefix
        );
        assert_eq!(
            reason("templates.spec"),
            PathErrorReason::UnexpectedCharacter { at: 8, found: 's' }
        );
        assert_eq!(
            reason("template.spec.replicatedJobs[1"),
            PathErrorReason::UnterminatedBracket { at: 28 }
        );
        assert_eq!(
            reason("template.spec.replicatedJobs[1]].template"),
            PathErrorReason::UnexpectedCharacter { at: 31, found: ']' }
        );
        assert_eq!(
            reason("template.spec.replicatedJobs[-1]"),
            PathErrorReason::NegativeIndex {
                at: 29,
                index: "-1".into()
            }
        );
        assert_eq!(
            reason("template.spec.replicatedJobs[a10]"),
            PathErrorReason::NonIntegerIndex {
                at: 29,
                index: "a10".into()
            }
        );
        assert!(matches!(
            reason("template.spec.replicatedJobs[]"),
            PathErrorReason::NonIntegerIndex { .. }
        ));
        assert!(matches!(
            reason("template.spec.replicatedJobs[+1]"),
            PathErrorReason::NonIntegerIndex { .. }
        ));
        assert_eq!(
            reason("template..spec"),
            PathErrorReason::EmptyField { at: 9 }
        );
        assert!(matches!(
            reason("template.spec."),
            PathErrorReason::EmptyField { .. }
        ));
    }

    #[test]
    fn resolution_errors_name_where_and_why() {
        assert_eq!(
            reason("template.spec.replicatedJobs.template"),
            PathErrorReason::NotAMap {
                prefix: "template.spec.replicatedJobs".into(),
                field: "template".into(),
                found: "an array"
            }
        );
        assert_eq!(
            reason("template.spec.replicatedJobs[0].template[0].spec"),
            PathErrorReason::NotAnArray {
                prefix: "template.spec.replicatedJobs[0].template".into(),
                index: 0,
                found: "a map"
            }
        );
        assert_eq!(
            reason("template.spec.replicatedJobs[10]"),
            PathErrorReason::IndexOutOfRange {
                prefix: "template.spec.replicatedJobs".into(),
                index: 10,
                len: 2
            }
        );
        assert_eq!(
            reason("template.spec.missing"),
            PathErrorReason::FieldNotFound {
                prefix: "template.spec".into(),
                field: "missing".into()
            }
        );
        let message = get(&jobset(), "template.spec.replicatedJobs.template")
            .unwrap_err()
            .to_string();
        assert_eq!(
            message,
            "path `template.spec.replicatedJobs.template`: `template.spec.replicatedJobs` is an \
             array, not a map: cannot look up field `template`"
        );
    }
}
