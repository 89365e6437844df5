//! Tool names as the model sees them: `mcp__<server>__<tool>`, `[A-Za-z0-9_-]`, at most
//! [`MAX_TOOL_NAME_LEN`] characters (what model APIs accept).

use keel_contracts::sha256_hex;

/// The longest tool name model APIs accept.
pub const MAX_TOOL_NAME_LEN: usize = 64;

/// The keel name of `tool` on `server`: `mcp__<server>__<tool>`.
///
/// Characters outside `[A-Za-z0-9_-]` become `_`. A name longer than
/// [`MAX_TOOL_NAME_LEN`] is cut and ends in `_` plus 8 hex digits of the SHA-256 of the
/// uncut name, so two long names stay distinct. Different tools may still map to one name
/// (`a.b` and `a_b`); [`crate::McpServers`] keeps the first and reports the other.
pub fn keel_tool_name(server: &str, tool: &str) -> String {
    let clean = |text: &str| -> String {
        text.chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' })
            .collect()
    };
    let tool = if tool.is_empty() { "_".to_owned() } else { clean(tool) };
    let name = format!("mcp__{}__{tool}", clean(server));
    if name.len() <= MAX_TOOL_NAME_LEN {
        return name;
    }
    let digest = sha256_hex(format!("{server}\0{tool}").as_bytes());
    // Every character is ASCII here, so byte indices are character boundaries.
    format!("{}_{}", &name[..MAX_TOOL_NAME_LEN - 9], &digest[..8])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redteam_mcp_the_longest_server_name_keeps_its_prefix_in_every_tool_name() {
        let server = "s".repeat(crate::MAX_SERVER_NAME_LEN);
        let prefix = format!("mcp__{server}__");
        for tool in ["t", &"x".repeat(200)] {
            let name = keel_tool_name(&server, tool);
            assert!(name.len() <= MAX_TOOL_NAME_LEN, "{name}");
            assert!(name.starts_with(&prefix), "{name}");
        }
    }

    #[test]
    fn names_table() {
        let cases = [
            ("fs", "read_file", "mcp__fs__read_file"),
            ("everything", "get-sum", "mcp__everything__get-sum"),
            ("fs", "read.file", "mcp__fs__read_file"),
            ("fs", "ünï côde", "mcp__fs___n__c_de"),
            ("fs", "", "mcp__fs___"),
        ];
        for (server, tool, expected) in cases {
            assert_eq!(keel_tool_name(server, tool), expected, "{server} {tool}");
        }
    }

    #[test]
    fn long_names_are_cut_and_stay_distinct() {
        let a = keel_tool_name("server", &"a".repeat(100));
        let b = keel_tool_name("server", &format!("{}b", "a".repeat(99)));
        assert_eq!(a.len(), MAX_TOOL_NAME_LEN);
        assert_eq!(b.len(), MAX_TOOL_NAME_LEN);
        assert_ne!(a, b);
        assert!(a.starts_with("mcp__server__aaaa"));
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'));
    }
}
