//! The agent API's credentials as the hub, `lifeboatctl join` and the test fleets write and read
//! them.
//!
//! - A **bootstrap token** is a Secret of type [`BOOTSTRAP_TOKEN_TYPE`] in the hub namespace
//!   (data [`BOOTSTRAP_TOKEN_KEY`], optional [`BOOTSTRAP_EXPIRATION_KEY`] in RFC 3339 and
//!   [`BOOTSTRAP_CLUSTER_NAME_KEY`]); it lets an agent register.
//! - A **cluster token** is minted at registration ([`mint_token`]) and handed to the agent
//!   once; the hub keeps only its SHA-256, under [`CREDENTIAL_HASH_KEY`] in a Secret of type
//!   [`CLUSTER_CREDENTIAL_TYPE`].

use ring::rand::{SecureRandom, SystemRandom};

/// Secret type of bootstrap tokens.
pub const BOOTSTRAP_TOKEN_TYPE: &str = "lifeboat.dev/bootstrap-token";
/// Secret type of the stored hash of a cluster token.
pub const CLUSTER_CREDENTIAL_TYPE: &str = "lifeboat.dev/cluster-credential";
/// Bootstrap token data keys.
pub const BOOTSTRAP_TOKEN_KEY: &str = "token";
pub const BOOTSTRAP_EXPIRATION_KEY: &str = "expiration";
pub const BOOTSTRAP_CLUSTER_NAME_KEY: &str = "cluster-name";
/// Credential data key: the hex SHA-256 of the cluster token.
pub const CREDENTIAL_HASH_KEY: &str = "token-sha256";
/// The shortest bootstrap token accepted (bytes of its text).
pub const MIN_BOOTSTRAP_TOKEN_BYTES: usize = 32;

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// A fresh token: 32 bytes from the system's secure random source, hex-encoded.
pub fn mint_token(rng: &SystemRandom) -> Result<String, ring::error::Unspecified> {
    let mut bytes = [0u8; 32];
    rng.fill(&mut bytes)?;
    Ok(hex(&bytes))
}

/// A fresh token ([`mint_token`]) from a new handle on the system's random source: for one-off
/// callers such as `lifeboatctl join`.
pub fn fresh_token() -> Result<String, ring::error::Unspecified> {
    mint_token(&SystemRandom::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_64_hex_digits_and_differ() {
        let a = fresh_token().expect("random");
        assert_eq!(a.len(), 64);
        assert!(
            a.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert!(a.len() >= MIN_BOOTSTRAP_TOKEN_BYTES);
        assert_ne!(a, fresh_token().expect("random"));
    }
}
