//! Issue #12 item 1: bytes that are not UTF-8 text reach the model escaped, with a note,
//! and stay exact in the result's raw bytes; a character is never broken, and no U+FFFD
//! appears that was not in the data. Real commands and real files.

use keel_contracts::Outcome;
use serde_json::json;

use super::support::Fixture;

const NOTE_PREFIX: &str = "[keel: ";

fn raw_of(output: &keel_contracts::ToolOutput) -> Vec<u8> {
    output.raw.as_ref().expect("raw bytes are kept when something was escaped").0.clone()
}

#[tokio::test]
async fn issue_12_bash_invalid_bytes_are_escaped_and_kept_exact() {
    let fixture = Fixture::new();
    let output = fixture.call("bash", json!({"command": r"printf 'caf\xe9 \xff\n'"})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert!(output.content.starts_with("caf\\xe9 \\xff\n"), "{}", output.content);
    assert!(
        output.content.contains(
            "[keel: 2 bytes shown as \\xNN escapes (not UTF-8 text or control bytes); \
             the ledger keeps the exact bytes]"
        ),
        "{}",
        output.content
    );
    assert!(!output.content.contains('\u{fffd}'));
    let raw = raw_of(&output);
    assert!(raw.starts_with(b"caf\xe9 \xff\n"), "{raw:?}");
    assert!(raw.ends_with(b"[exit code 0]"), "{raw:?}");
}

#[tokio::test]
async fn issue_12_bash_nul_and_escape_bytes_are_escaped() {
    let fixture = Fixture::new();
    let output =
        fixture.call("bash", json!({"command": r"printf 'a\0b\033[31mred\r\n1\r2\n'"})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    // The `\r` of a CRLF stays; a lone one is escaped like NUL and ESC.
    assert!(output.content.starts_with("a\\x00b\\x1b[31mred\r\n1\\x0d2\n"), "{:?}", output.content);
    assert!(output.content.contains("[keel: 3 bytes shown as"), "{}", output.content);
    assert!(raw_of(&output).starts_with(b"a\0b\x1b[31mred\r\n1\r2\n"));
}

#[tokio::test]
async fn issue_12_clean_output_has_no_raw_and_no_note() {
    let fixture = Fixture::new();
    let output = fixture
        .call("bash", json!({"command": "printf 'r\\303\\251sum\\303\\251 \\357\\277\\275\\n'"}))
        .await;
    assert_eq!(output.content, "r\u{e9}sum\u{e9} \u{fffd}\n[exit code 0]");
    assert_eq!(output.raw, None);
}

#[tokio::test]
async fn issue_12_bash_binary_output_is_exact() {
    let fixture = Fixture::new();
    let binary = std::fs::read("/bin/sh").unwrap();
    let output = fixture.call("bash", json!({"command": "head -c 3000 /bin/sh"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    let raw = raw_of(&output);
    assert_eq!(&raw[..3000], &binary[..3000]);
    assert!(output.content.contains(NOTE_PREFIX));
    // U+FFFD only where the data had it.
    let in_data = String::from_utf8_lossy(&binary[..3000]).matches('\u{fffd}').count()
        - binary[..3000].utf8_chunks().filter(|chunk| !chunk.invalid().is_empty()).count();
    assert_eq!(output.content.matches('\u{fffd}').count(), in_data);
    assert!(output.content.contains("\\x7fELF"), "{}", &output.content[..40]);
}

#[tokio::test]
async fn issue_12_a_character_cut_by_the_output_cap_is_never_broken() {
    let fixture = Fixture::new();
    // The cap is 8 MiB per stream: the first 4 MiB end one byte into a euro sign, and the
    // last 4 MiB start two bytes into another.
    let head = 4 * 1024 * 1024;
    let command = format!(
        "{{ head -c {} /dev/zero | tr '\\0' a; printf '\\342\\202\\254'; \
         head -c 1000 /dev/zero | tr '\\0' b; printf '\\342\\202\\254'; \
         head -c {} /dev/zero | tr '\\0' c; }}",
        head - 1,
        head - 2
    );
    let output = fixture.call("bash", json!({"command": command})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(output.raw, None, "nothing is escaped");
    assert!(!output.content.contains('\u{fffd}'));
    assert!(!output.content.contains("\\x"));
    let marker = output.content.find("[... ").unwrap();
    assert_eq!(marker, head - 1 + 1, "the head is the a's and a newline");
    assert!(output.content[..marker].trim_end_matches('\n').bytes().all(|byte| byte == b'a'));
    let (_, rest) = output.content[marker..].split_once("...]\n").unwrap();
    let tail = rest.strip_suffix("\n[exit code 0]").unwrap();
    assert_eq!(tail.len(), head - 2);
    assert!(tail.bytes().all(|byte| byte == b'c'));
    assert!(
        output.content[marker..].starts_with("[... 1006 bytes omitted"),
        "{}",
        &output.content[marker..marker + 80]
    );
}

#[tokio::test]
async fn issue_12_read_file_escapes_invalid_bytes_and_keeps_them() {
    let fixture = Fixture::new();
    std::fs::write(fixture.root.join("latin1.txt"), b"caf\xe9\nok \x01\n").unwrap();
    let output = fixture.call("read_file", json!({"path": "latin1.txt"})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert!(
        output.content.starts_with("     1\tcaf\\xe9\n     2\tok \\x01\n"),
        "{}",
        output.content
    );
    assert!(output.content.contains("[keel: 2 bytes shown as"), "{}", output.content);
    assert!(!output.content.contains('\u{fffd}'));
    assert_eq!(raw_of(&output), b"     1\tcaf\xe9\n     2\tok \x01\n");
}

#[tokio::test]
async fn issue_12_read_file_pages_never_split_characters() {
    let fixture = Fixture::new();
    fixture.write("euro.txt", "\u{20ac}1\n\u{20ac}2\n\u{20ac}3\n");
    let output =
        fixture.call("read_file", json!({"path": "euro.txt", "offset": 2, "limit": 1})).await;
    assert_eq!(output.content, "     2\t\u{20ac}2\n[more lines follow; continue with offset=3]\n");
    assert_eq!(output.raw, None);
    // A line longer than the per-line limit is cut between characters.
    fixture.write("long.txt", &"\u{e9}".repeat(2500));
    let output = fixture.call("read_file", json!({"path": "long.txt"})).await;
    assert!(
        output.content.contains(&format!("\t{}\u{2026} [line truncated]", "\u{e9}".repeat(2000)))
    );
    assert!(!output.content.contains('\u{fffd}'));
}

#[tokio::test]
async fn issue_12_curly_quotes_and_escape_text_stay_byte_exact() {
    let fixture = Fixture::new();
    let text = "say \u{201c}it\u{2019}s\u{201d} and \\u2019 \\xe9\n";
    fixture.write("quotes.txt", text);
    let output = fixture.call("read_file", json!({"path": "quotes.txt"})).await;
    assert!(output.content.starts_with(&format!("     1\t{text}")), "{}", output.content);
    assert_eq!(output.raw, None, "valid text is never escaped");
    let output = fixture
        .call(
            "edit_file",
            json!({"path": "quotes.txt", "old": "\u{201c}it\u{2019}s\u{201d}", "new": "\u{2018}it\u{2019}s\u{2019} \\u00e9"}),
        )
        .await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert_eq!(
        fixture.read("quotes.txt"),
        "say \u{2018}it\u{2019}s\u{2019} \\u00e9 and \\u2019 \\xe9\n"
    );
}

#[tokio::test]
async fn issue_12_grep_lines_keep_their_bytes() {
    let fixture = Fixture::new();
    std::fs::write(fixture.root.join("data.txt"), b"needle caf\xe9\nother\n").unwrap();
    let output = fixture.call("grep", json!({"pattern": "needle"})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert!(output.content.starts_with("data.txt:1:needle caf\\xe9\n"), "{}", output.content);
    assert!(output.content.contains("[keel: 1 byte shown as"), "{}", output.content);
    assert_eq!(raw_of(&output), b"data.txt:1:needle caf\xe9\n");
}
