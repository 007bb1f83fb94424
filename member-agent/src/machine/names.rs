//! The names of the objects an AppWrapper creates.

/// The string at `path` in a JSON object, if there is one.
pub(super) fn str_at(value: &serde_json::Value, path: &[&str]) -> Option<String> {
    let mut v = value;
    for p in path {
        v = v.get(p)?;
    }
    v.as_str().map(str::to_string)
}

/// The name a component's object gets: `metadata.name`, or for `generateName` a name chosen
/// here (stable for this AppWrapper and component), so that it is recorded before the create
/// and a create repeated after a crash finds the same object.
pub fn component_name(template: &serde_json::Value, uid: &str, index: usize) -> String {
    if let Some(name) = str_at(template, &["metadata", "name"]).filter(|n| !n.is_empty()) {
        return name;
    }
    match str_at(template, &["metadata", "generateName"]) {
        Some(prefix) if !prefix.is_empty() => format!("{prefix}{}", stable_suffix(uid, index)),
        _ => String::new(),
    }
}

/// Five characters from Kubernetes' generateName alphabet, derived from (uid, index) (FNV-1a).
fn stable_suffix(uid: &str, index: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in uid.bytes().chain(index.to_le_bytes()) {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (0..5)
        .map(|i| ALPHABET[((hash >> (i * 8)) % ALPHABET.len() as u64) as usize] as char)
        .collect()
}
