//! Tests of the permission rules: the decision tables, the grammar, patterns and paths.

use serde_json::json;

use super::pattern::{normalize_path, normalized, wildcard_match};
use super::*;
use crate::PermissionAnswer;

fn rules(allow: &[&str], deny: &[&str]) -> PermissionRules {
    PermissionRules {
        allow: allow.iter().map(|r| Rule::parse(r).unwrap()).collect(),
        deny: deny.iter().map(|r| Rule::parse(r).unwrap()).collect(),
    }
}

#[test]
fn decision_table() {
    let set = rules(
        &["bash(git status*)", "write_file(src/**)", "read_file"],
        &["write_file(src/gen/*)", "bash(git push*)"],
    );
    let cases = [
        ("bash", json!({"command": "git status --short"}), Some(PermissionAnswer::AllowOnce)),
        ("bash", json!({"command": "git push origin main"}), Some(PermissionAnswer::Deny)),
        ("bash", json!({"command": "rm -rf /"}), None),
        (
            "write_file",
            json!({"path": "src/lib.rs", "content": "x"}),
            Some(PermissionAnswer::AllowOnce),
        ),
        ("write_file", json!({"path": "src/gen/out.rs"}), Some(PermissionAnswer::Deny)),
        ("write_file", json!({"path": "./src/x/../gen/out.rs"}), Some(PermissionAnswer::Deny)),
        ("write_file", json!({"path": "/ws/src/gen/a"}), Some(PermissionAnswer::Deny)),
        ("write_file", json!({"path": "/wsother/src/a"}), None),
        ("write_file", json!({"path": "docs/a.md", "content": "src/x"}), None),
        // No path: the call could reach anything, so a path deny rule applies.
        ("write_file", json!({"content": "src/x"}), Some(PermissionAnswer::Deny)),
        ("read_file", json!({}), Some(PermissionAnswer::AllowOnce)),
        ("edit_file", json!({"path": "src/lib.rs"}), None),
    ];
    for (tool, arguments, want) in cases {
        let got = set.decide(tool, &arguments, "/ws").map(|(answer, _)| answer);
        assert_eq!(got, want, "{tool} {arguments}");
    }
}

/// A deny rule's pattern is normalized as the path is: `./secrets/**`, the workspace's
/// absolute spelling and `secrets/**` deny the same files, and a pattern that names the
/// workspace root (`.`, `./`, `/ws`) denies every path in it — never nothing.
#[test]
fn redteam_rules_deny_patterns_are_normalized_and_the_root_denies_everything() {
    let spelled = [
        "read_file(./secrets/**)",
        "read_file(/ws/secrets/**)",
        "path(./secrets)",
        "write_file(./secrets/*)",
    ];
    for rule in spelled {
        let set = rules(&["read_file", "write_file"], &[rule]);
        let tool = if rule.starts_with("write_file") { "write_file" } else { "read_file" };
        let got = set.decide(tool, &json!({"path": "secrets/key"}), "/ws").map(|(a, _)| a);
        assert_eq!(got, Some(PermissionAnswer::Deny), "{rule} on secrets/key");
        let got = set.decide(tool, &json!({"path": "src/lib.rs"}), "/ws").map(|(a, _)| a);
        assert_eq!(got, Some(PermissionAnswer::AllowOnce), "{rule} on src/lib.rs");
    }
    for root in ["read_file(.)", "read_file(./)", "path(/ws)", "grep(.)"] {
        let set = rules(&["read_file", "grep"], &[root]);
        for path in ["src/lib.rs", ".", "a/b/c"] {
            let got = set.decide("read_file", &json!({"path": path}), "/ws").map(|(a, _)| a);
            assert_eq!(got, Some(PermissionAnswer::Deny), "{root} on {path}");
        }
        // Outside the workspace is not the workspace root.
        let got = set.decide("read_file", &json!({"path": "/etc/hosts"}), "/ws");
        assert_eq!(got.map(|(a, _)| a), Some(PermissionAnswer::AllowOnce), "{root}");
    }
    let root = DeniedPaths::new(["."], "/ws");
    assert!(root.covers("src/lib.rs") && root.covers("a") && root.hides_everything_under(""));
    let narrow = DeniedPaths::new(["./secrets/**"], "/ws");
    assert!(narrow.covers("secrets/key") && !narrow.covers("src/lib.rs"));
}

/// A deny on one file-writing tool refuses the other on the same paths.
#[test]
fn redteam_rules_a_write_deny_holds_for_both_write_tools() {
    for rule in ["write_file(./secrets/**)", "edit_file(secrets/**)"] {
        let set = rules(&["write_file", "edit_file"], &[rule]);
        for tool in ["write_file", "edit_file"] {
            let got = set.decide(tool, &json!({"path": "secrets/k"}), "/ws").map(|(a, _)| a);
            assert_eq!(got, Some(PermissionAnswer::Deny), "{rule} / {tool}");
            let got = set.decide(tool, &json!({"path": "src/a.rs"}), "/ws").map(|(a, _)| a);
            assert_eq!(got, Some(PermissionAnswer::AllowOnce), "{rule} / {tool} neighbour");
        }
    }
    // Only the two write tools share their denies: a write deny says nothing of bash,
    // and a bash deny nothing of the write tools.
    let set = rules(&["bash", "write_file"], &["write_file", "bash(rm *)"]);
    let got = set.decide("bash", &json!({"command": "ls"}), "/ws").map(|(a, _)| a);
    assert_eq!(got, Some(PermissionAnswer::AllowOnce));
    let set = rules(&["write_file"], &["bash"]);
    let got = set.decide("write_file", &json!({"path": "a"}), "/ws").map(|(a, _)| a);
    assert_eq!(got, Some(PermissionAnswer::AllowOnce));
}

fn line(commands: &[&[&str]]) -> CommandLine {
    CommandLine::Simple(
        commands
            .iter()
            .map(|words| SimpleCommand { words: words.iter().map(|w| (*w).to_owned()).collect() })
            .collect(),
    )
}

fn decide_line(
    set: &PermissionRules,
    text: &str,
    parsed: &CommandLine,
) -> Option<PermissionAnswer> {
    let facts = CallFacts { resolved_path: None, command: Some(parsed) };
    set.decide_with("bash", &json!({"command": text}), "/ws", facts).map(|(answer, _)| answer)
}

/// An allow rule covers a line only when it covers every simple command; a deny rule
/// refuses when it matches any one; an unresolved line is never allowed.
#[test]
fn redteam_rules_allow_covers_every_simple_command_or_nothing() {
    let set = rules(&["bash(git status*)", "bash(git diff*)"], &["bash(rm *)", "bash(curl*)"]);
    let unresolved = |found: &[&[&str]]| CommandLine::Unresolved {
        reason: "eval".into(),
        found: line(found).commands().to_vec(),
    };
    let cases: Vec<(&str, CommandLine, Option<PermissionAnswer>)> = vec![
        // The neighbour: the allowed command alone, and two allowed ones together.
        ("git status", line(&[&["git", "status"]]), Some(PermissionAnswer::AllowOnce)),
        (
            "git status && git diff",
            line(&[&["git", "status"], &["git", "diff"]]),
            Some(PermissionAnswer::AllowOnce),
        ),
        // A list smuggles a second command: never allowed, denied when it is denied.
        ("git status; ls", line(&[&["git", "status"], &["ls"]]), None),
        (
            "git status && rm -rf src",
            line(&[&["git", "status"], &["rm", "-rf", "src"]]),
            Some(PermissionAnswer::Deny),
        ),
        (
            "git status $(curl x)",
            line(&[&["git", "status", "$(curl x)"], &["curl", "x"]]),
            Some(PermissionAnswer::Deny),
        ),
        ("git status `id`", line(&[&["git", "status", "`id`"], &["id"]]), None),
        // Unresolved lines ask, even when all that was found is allowed ...
        ("eval git status", unresolved(&[&["git", "status"]]), None),
        // ... and deny rules still see what was found.
        ("eval x; rm y", unresolved(&[&["rm", "y"]]), Some(PermissionAnswer::Deny)),
        // A line with no simple command at all is not allowed by anything.
        ("X=1", line(&[]), None),
    ];
    for (text, parsed, want) in cases {
        assert_eq!(decide_line(&set, text, &parsed), want, "{text}");
    }
}

/// Without a parsed line, only a plain list of words can be allowed.
#[test]
fn redteam_rules_unparsed_lines_fall_back_to_plain_words_only() {
    let set = rules(&["bash(git status*)"], &[]);
    let decide = |command: &str| {
        set.decide("bash", &json!({"command": command}), "/ws").map(|(answer, _)| answer)
    };
    assert_eq!(decide("git status --short"), Some(PermissionAnswer::AllowOnce));
    for smuggled in [
        "git status; rm x",
        "git status && rm x",
        "git status $(id)",
        "git status `id`",
        "git status > .git/config",
        "git status\nrm x",
        "git status
rm x",
    ] {
        assert_eq!(decide(smuggled), None, "{smuggled}");
    }
}

/// `path(P)` refuses every tool's call on a covered path, as written or resolved, and
/// the read-denying rules are the set masked for commands.
#[test]
fn redteam_rules_path_rules_cover_every_tool_and_the_denied_set() {
    let set = rules(
        &["read_file", "mcp__fs__read"],
        &["path(secrets/**)", "read_file(**/.env)", "write_file(gen/**)"],
    );
    let decide = |tool: &str, arguments: serde_json::Value, resolved: Option<&str>| {
        let facts = CallFacts { resolved_path: resolved, command: None };
        set.decide_with(tool, &arguments, "/ws", facts).map(|(answer, _)| answer)
    };
    let deny = Some(PermissionAnswer::Deny);
    assert_eq!(decide("read_file", json!({"path": "secrets/key"}), None), deny);
    assert_eq!(decide("read_file", json!({"path": "./secrets/../secrets/a/b"}), None), deny);
    assert_eq!(decide("edit_file", json!({"path": "/ws/secrets/key"}), None), deny);
    assert_eq!(decide("mcp__fs__read", json!({"path": "secrets/key"}), None), deny);
    assert_eq!(decide("read_file", json!({"path": "alias/key"}), Some("secrets/key")), deny);
    assert_eq!(decide("read_file", json!({"path": "app/.env"}), None), deny);
    assert_eq!(decide("mcp__fs__read", json!({"path": "/ws/app/.env"}), None), deny);
    assert_eq!(decide("write_file", json!({"path": "x/.env", "content": ""}), None), deny);
    // The neighbours: other files read fine; a search of the root is not refused (the
    // search skips the denied paths instead).
    assert_eq!(
        decide("read_file", json!({"path": "src/main.rs"}), None),
        Some(PermissionAnswer::AllowOnce)
    );
    assert_eq!(decide("grep", json!({"pattern": "x", "path": "."}), None), None);
    let denied = set.denied_paths("/ws");
    assert_eq!(denied.patterns(), ["**/.env", "secrets/**"]);
    assert!(denied.covers("secrets/deep/key") && denied.covers("a/b/.env"));
    assert!(!denied.covers("gen/out.rs"), "a write-only deny does not hide a path");
    assert_eq!(set.write_denied_paths("/ws").patterns(), ["gen/**"]);
    assert!(Rule::parse("path").is_err());
}

proptest::proptest! {
    /// The borrowed fast path never differs from full normalization.
    #[test]
    fn normalized_agrees_with_normalize_path(path in "[a./]{0,12}") {
        proptest::prop_assert_eq!(normalized(&path).into_owned(), normalize_path(&path, ""));
    }
}

#[test]
fn parse_errors() {
    for bad in [
        "",
        "bash(",
        "bash()",
        "bash(  )",
        "two words(x)",
        "path(~/.ssh/**)",
        "read_file(~)",
        "read_file(\"secret/**\")",
        "path($PWD/x)",
        "read_file(a\\b)",
        "mcp__*",
        "mcp__evil*",
        "mcp__evil__x*",
        "mcp__evil__?",
        "mcp__ev*l__*",
        "mcp____*",
        "mcp__a.b__*",
        "evil__*",
        "bash*",
        "*",
    ] {
        assert!(Rule::parse(bad).is_err(), "{bad:?}");
    }
    let error = Rule::parse("mcp__evil*").unwrap_err();
    assert_eq!(error.reason, TOOL_WILDCARD_REFUSAL);
}

/// `mcp__SERVER__*` covers every tool of that server, and only tools: not the server
/// prefix itself, not another server whose name starts the same.
#[test]
fn redteam_rules_a_server_wide_deny_covers_every_tool_of_that_server_only() {
    let set = rules(&["mcp__evil__*", "mcp__good__*"], &["mcp__evil__*"]);
    let decide = |tool: &str, arguments: serde_json::Value| {
        set.decide(tool, &arguments, "/ws").map(|(answer, rule)| (answer, rule.text.clone()))
    };
    let deny = Some((PermissionAnswer::Deny, "mcp__evil__*".to_owned()));
    assert_eq!(decide("mcp__evil__read", json!({})), deny);
    assert_eq!(decide("mcp__evil__renamed_later", json!({"path": "a"})), deny);
    assert_eq!(decide("mcp__evil__run", json!({"command": "ls"})), deny);
    assert_eq!(decide("mcp__evil__fetch", json!({"url": "http://x"})), deny);
    // The neighbours: another server, a server whose name starts the same, the bare
    // prefix, a built-in.
    let allow = Some((PermissionAnswer::AllowOnce, "mcp__good__*".to_owned()));
    assert_eq!(decide("mcp__good__read", json!({"path": "a"})), allow);
    assert_eq!(decide("mcp__evilx__read", json!({})), None);
    assert_eq!(decide("mcp__evil__", json!({})), None);
    assert_eq!(decide("read_file", json!({"path": "a"})), None);
    assert!(Rule::parse("mcp__evil__*").unwrap().is_server_wide());
    assert!(!Rule::parse("mcp__evil__read").unwrap().is_server_wide());
    assert!(!Rule::parse("bash(x*)").unwrap().is_server_wide());
}

#[test]
fn tool_name_patterns_table() {
    for (name, tool, covers) in [
        ("mcp__s__*", "mcp__s__t", true),
        ("mcp__s-1__*", "mcp__s-1__t", true),
        ("mcp__s__*", "mcp__s__", false),
        ("mcp__s__*", "mcp__s_t", false),
        ("mcp__s__*", "mcp__t__x", false),
        ("mcp__s__t", "mcp__s__t", true),
        ("mcp__s__t", "mcp__s__tt", false),
        ("bash", "bash", true),
        ("bash", "bash2", false),
        ("mcp__*", "mcp__s__t", false),
    ] {
        assert_eq!(tool_name_covers(name, tool), covers, "{name} {tool}");
    }
    assert_eq!(check_tool_name_pattern("mcp__s__*"), Ok(()));
    assert_eq!(check_tool_name_pattern("bash"), Ok(()));
    assert_eq!(check_tool_name_pattern("mcp__s__?"), Err(TOOL_WILDCARD_REFUSAL));
    assert_eq!(check_tool_name_pattern("ba?h"), Err(TOOL_WILDCARD_REFUSAL));
}

#[test]
fn a_rule_names_its_tool() {
    for (text, tool) in [
        ("bash(git status*)", "bash"),
        ("path(secrets/**)", "path"),
        ("grep", "grep"),
        ("bash(echo \"$HOME\" ~ a\\b)", "bash"),
    ] {
        assert_eq!(Rule::parse(text).unwrap().tool(), tool, "{text}");
    }
}

/// Spaces around a pattern are not part of it: `bash( rm *)` denies `rm -rf x`.
#[test]
fn patterns_are_trimmed() {
    let set = rules(&[], &["bash( rm * )"]);
    let call = json!({"command": "rm -rf x"});
    let answer = set.decide("bash", &call, "/ws").map(|(answer, _)| answer);
    assert_eq!(answer, Some(PermissionAnswer::Deny));
}

/// A deny rule for a path also refuses a call on a folder that holds what it covers (a
/// recursive search reaches it), but not a sibling whose name merely shares a prefix.
#[test]
fn deny_rules_touch_ancestors_of_what_they_cover_and_nothing_beside() {
    let set = rules(&["fetch"], &["grep(docs/private/**)", "fetch(https://evil.example/*)"]);
    let decide = |tool: &str, arguments: serde_json::Value, resolved: Option<&str>| {
        set.decide_resolved(tool, &arguments, "/ws", resolved).map(|(answer, _)| answer)
    };
    let deny = Some(PermissionAnswer::Deny);
    let grep = |path: &str| json!({"pattern": "TOKEN", "path": path});
    let reaching =
        [".", "", "docs", "./docs/", "/ws/docs", "docs/private", "docs/private/", "docs/private/a"];
    for reaching in reaching {
        assert_eq!(decide("grep", grep(reaching), None), deny, "{reaching:?}");
    }
    for beside in ["doc", "docs/public", "docsprivate", "src", "/elsewhere/docs"] {
        assert_eq!(decide("grep", grep(beside), None), None, "{beside:?}");
    }
    // Decided on where the path really leads too, ancestors included.
    assert_eq!(decide("grep", grep("link"), Some("docs")), deny);
    assert_eq!(decide("grep", grep("link"), Some("docs/public")), None);
    // Another tool's call on the same folder is not a grep.
    assert_eq!(decide("glob", json!({"pattern": "*", "path": "docs"}), None), None);
    // A call with a `url` and no `path` is matched on its url, not treated as a call
    // that could reach any path.
    assert_eq!(decide("fetch", json!({"url": "https://evil.example/x"}), None), deny);
    let allow = Some(PermissionAnswer::AllowOnce);
    assert_eq!(decide("fetch", json!({"url": "https://good.example/x"}), None), allow);
}

/// `normalize_path` at its edges: `..` at the top of a relative path is kept (it leads
/// outside), at the root of an absolute one dropped; `//`, `.` and a trailing slash
/// vanish; only the workspace itself or a path below it is made relative.
#[test]
fn normalize_path_table() {
    let cases = [
        ("a/b", "a/b"),
        ("./a//b/", "a/b"),
        ("a/./b/.", "a/b"),
        ("a/../b", "b"),
        ("a/b/../../c", "c"),
        ("../a", "../a"),
        ("a/../../b", "../b"),
        ("../../a/..", "../.."),
        ("/../a", "/a"),
        ("/a/../../b", "/b"),
        ("/", "/"),
        ("", ""),
        (".", ""),
        ("/ws", ""),
        ("/ws/", ""),
        ("/ws/src/../a", "a"),
        ("/ws//a", "a"),
        ("/wsx/a", "/wsx/a"),
        ("/other/ws/a", "/other/ws/a"),
    ];
    for (path, want) in cases {
        assert_eq!(normalize_path(path, "/ws"), want, "{path:?}");
        assert_eq!(normalize_path(path, "/ws/"), want, "{path:?} against /ws/");
    }
    // Without a workspace nothing is made relative.
    assert_eq!(normalize_path("/ws/a", ""), "/ws/a");
    // The borrowed fast path agrees on the edge cases too.
    for (path, _) in cases {
        assert_eq!(normalized(path), normalize_path(path, ""), "{path:?}");
    }
    for path in ["/..", "/.", "..", "a/..", "/a/..", "//", "a//", "/a/"] {
        assert_eq!(normalized(path), normalize_path(path, ""), "{path:?}");
    }
}

/// What a denied set covers: the pattern's matches and everything below them, never a
/// sibling; nothing when empty.
#[test]
fn denied_paths_cover_descendants_of_a_literal_pattern() {
    let denied = DeniedPaths::new(["keys", "**/.env", "/etc/ssl"], "/ws");
    assert!(!denied.is_empty());
    for covered in ["keys", "keys/a", "keys/a/b", "./keys/", "app/.env/x", "/etc/ssl/k"] {
        assert!(denied.covers(covered), "{covered:?}");
    }
    for beside in ["keysx/a", "key", "a/keys", "app/.envrc", "/etc/sslx", "/etc"] {
        assert!(!denied.covers(beside), "{beside:?}");
    }
    let none = DeniedPaths::new(Vec::<String>::new(), "/ws");
    assert!(none.is_empty() && !none.covers("keys") && none.patterns().is_empty());
    // A pattern for the workspace itself (`.`) says nothing about paths outside it.
    let root = DeniedPaths::new(["."], "/ws");
    assert!(!root.covers("/etc/passwd"));
}

/// `wildcard_match` against a plain recursive matcher of the same rules.
fn reference_match(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|skip| reference_match(rest, &text[skip..])),
        Some((&first, rest)) => text
            .split_first()
            .is_some_and(|(&c, tail)| (first == b'?' || first == c) && reference_match(rest, tail)),
    }
}

proptest::proptest! {
    /// The matcher agrees with the reference on small alphabets, where backtracking
    /// after a `*` is exercised most.
    #[test]
    fn wildcard_match_agrees_with_the_reference(pattern in "[ab*?]{0,8}", text in "[ab]{0,10}") {
        proptest::prop_assert_eq!(
            wildcard_match(pattern.as_bytes(), text.as_bytes()),
            reference_match(pattern.as_bytes(), text.as_bytes())
        );
    }
}

#[test]
fn wildcards() {
    assert!(wildcard_match(b"*", b""));
    assert!(wildcard_match(b"a*c", b"abbbc"));
    assert!(wildcard_match(b"a?c", b"abc"));
    assert!(!wildcard_match(b"a?c", b"ac"));
    assert!(wildcard_match(b"src/**", b"src/a/b.rs"));
    assert!(!wildcard_match(b"src/**", b"srcx/a"));
    // Backtracking: the first `b` is not the one the pattern's `b` must match.
    let table: &[(&[u8], &[u8], bool)] = &[
        (b"*ab", b"aab", true),
        (b"*ab", b"abab", true),
        (b"*ab", b"abba", false),
        (b"a*b*c", b"abxbxc", true),
        (b"a*b*c", b"abxbx", false),
        (b"*?", b"", false),
        (b"?*", b"x", true),
        (b"**", b"", true),
        (b"", b"", true),
        (b"", b"a", false),
        (b"a", b"", false),
        (b"a**", b"a", true),
    ];
    for (pattern, text, want) in table {
        assert_eq!(wildcard_match(pattern, text), *want, "{pattern:?} {text:?}");
    }
}
