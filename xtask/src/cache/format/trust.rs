//! The values of trust settings a manifest and trust.toml hold: the policy
//! (`require`, `warn`, `off`), trust.toml's fields and a cache manifest's
//! `[trust]` table. Pure data; reading the trust root and judging keys is
//! `crate::trust`.

use serde::Deserialize;

/// What a restore does with a key whose signature does not hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Refuse it (exit 12) before a chunk is fetched.
    Require,
    /// Check, say what is wrong on stderr, and restore anyway.
    Warn,
    /// Check nothing.
    Off,
}

impl Policy {
    pub fn name(self) -> &'static str {
        match self {
            Policy::Require => "require",
            Policy::Warn => "warn",
            Policy::Off => "off",
        }
    }
}

/// `cache-manifests/trust.toml`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustFile {
    pub policy: Policy,
    /// Gate records count only where an allowed signer signed them: every
    /// cache's `[publish] gates`, `gates check` and `gates run --skip-green`
    /// (a cache manifest's `[trust] signed_gates` asks it for one cache).
    #[serde(default)]
    pub signed_gates: bool,
}

/// The `[trust]` table of `cache-manifests/<name>.toml`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheTrust {
    /// Overrides trust.toml's policy for this cache.
    pub policy: Option<Policy>,
    /// Only these principals of allowed_signers may sign this cache (all when empty).
    #[serde(default)]
    pub principals: Vec<String>,
    /// With `require`, accept keys published `--allow-ungated`.
    #[serde(default)]
    pub allow_ungated: bool,
    /// A publish accepts only gate entries signed by an allowed signer
    /// (also set for every cache by trust.toml's `signed_gates`).
    #[serde(default)]
    pub signed_gates: bool,
}
