//! User labels set by the defaulting webhook (reference §4.1).

use std::collections::BTreeMap;

use super::constants::{QUEUE_NAME_LABEL, USER_ID_LABEL, USER_NAME_LABEL};

/// Maximum length of a label value.
pub const MAX_LABEL_VALUE_LEN: usize = 63;

/// Turns an arbitrary string (a user name, a UID) into a valid label value, as upstream's
/// `SanitizeLabel`: keep the first 63 bytes, replace every character outside `[-_.A-Za-z0-9]`
/// with `_`, then trim `-`, `_` and `.` from both ends (a label value must start and end with an
/// alphanumeric). A multi-byte character cut by the truncation becomes one `_`.
pub fn sanitize_label(value: &str) -> String {
    let bytes = value.as_bytes();
    let cut = &bytes[..bytes.len().min(MAX_LABEL_VALUE_LEN)];
    let replaced: String = String::from_utf8_lossy(cut)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    replaced.trim_matches(['-', '_', '.']).to_string()
}

/// Applies the create-time defaulting to an AppWrapper's labels: the default queue when the user
/// set none (a user-supplied queue wins), and the user name and UID from the admission request
/// (these override whatever the user wrote, so they can be trusted).
pub fn default_labels(
    labels: &mut BTreeMap<String, String>,
    default_queue: Option<&str>,
    user_name: &str,
    user_id: &str,
) {
    if let Some(queue) = default_queue.filter(|q| !q.is_empty()) {
        labels
            .entry(QUEUE_NAME_LABEL.to_string())
            .or_insert_with(|| queue.to_string());
    }
    labels.insert(USER_NAME_LABEL.to_string(), sanitize_label(user_name));
    labels.insert(USER_ID_LABEL.to_string(), sanitize_label(user_id));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitises_like_upstream() {
        assert_eq!(sanitize_label("limited-user"), "limited-user");
        assert_eq!(
            sanitize_label("system:serviceaccount:ns:sa"),
            "system_serviceaccount_ns_sa"
        );
        assert_eq!(sanitize_label("alice@example.com"), "alice_example.com");
        assert_eq!(sanitize_label("--.x.__"), "x");
        assert_eq!(sanitize_label(":::"), "");
        assert_eq!(sanitize_label("é"), "");
        assert_eq!(sanitize_label("aé b"), "a__b");
        let long = "a".repeat(70);
        assert_eq!(sanitize_label(&long).len(), 63);
        // truncation first, then trimming: a `-` at byte 63 is trimmed
        let dash_at_end = format!("{}-{}", "b".repeat(62), "c".repeat(10));
        assert_eq!(sanitize_label(&dash_at_end), "b".repeat(62));
        let uid = "8da0fcfe-6d7f-4f44-b433-d91d22cc1b8c";
        assert_eq!(sanitize_label(uid), uid);
    }

    #[test]
    fn defaulting_overrides_user_labels_but_not_the_queue() {
        let mut labels = BTreeMap::from([
            (USER_NAME_LABEL.to_string(), "bad".to_string()),
            (USER_ID_LABEL.to_string(), "bad".to_string()),
            (
                QUEUE_NAME_LABEL.to_string(),
                "user-provided-queue".to_string(),
            ),
        ]);
        default_labels(
            &mut labels,
            Some("system-default-queue"),
            "limited-user",
            "u:1",
        );
        assert_eq!(labels[USER_NAME_LABEL], "limited-user");
        assert_eq!(labels[USER_ID_LABEL], "u_1");
        assert_eq!(labels[QUEUE_NAME_LABEL], "user-provided-queue");

        let mut labels = BTreeMap::new();
        default_labels(&mut labels, Some("system-default-queue"), "u", "1");
        assert_eq!(labels[QUEUE_NAME_LABEL], "system-default-queue");
        let mut labels = BTreeMap::new();
        default_labels(&mut labels, None, "u", "1");
        assert!(!labels.contains_key(QUEUE_NAME_LABEL));
    }
}
