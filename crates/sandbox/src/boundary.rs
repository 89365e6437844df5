//! The extra boundary a user approved for a session, beyond the workspace.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// What a managed command may do beyond its workspace and private temporary directory:
/// exact extra paths to read or to write, and whether it may use the network. The default
/// grants nothing extra. Apply it with [`CommandSpec::boundary`](crate::CommandSpec::boundary).
///
/// Serialized as `{"read": [...], "write": [...], "network": false}`; every field may be
/// omitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Boundary {
    /// Files or directories made readable (read-only, with everything under a directory).
    pub read: Vec<PathBuf>,
    /// Files or directories made readable and writable (protected paths inside stay
    /// read-only).
    pub write: Vec<PathBuf>,
    /// IPv4 and IPv6 sockets allowed (TCP, UDP, DNS); other socket families stay refused.
    pub network: bool,
}

impl Boundary {
    /// Whether it grants nothing beyond the workspace.
    pub fn is_empty(&self) -> bool {
        self.read.is_empty() && self.write.is_empty() && !self.network
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_with_defaults() {
        let boundary: Boundary = serde_json::from_str(r#"{"write": ["/data"]}"#).unwrap();
        assert_eq!(
            boundary,
            Boundary { read: vec![], write: vec![PathBuf::from("/data")], network: false }
        );
        assert!(!boundary.is_empty());
        assert!(Boundary::default().is_empty());
        let json = serde_json::to_string(&boundary).unwrap();
        assert_eq!(json, r#"{"read":[],"write":["/data"],"network":false}"#);
        assert!(serde_json::from_str::<Boundary>(r#"{"net": true}"#).is_err());
    }
}
