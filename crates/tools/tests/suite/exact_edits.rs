//! Issue #12 item 2: edits people actually need. `old`/`new` written with LF match a CRLF
//! file and keep its endings; tabs are kept; a miss shows the closest lines with their real
//! bytes visible and look-alikes named; `read_file` notes CRLF and look-alikes. Real files.

use keel_contracts::Outcome;
use serde_json::json;

use super::support::Fixture;

fn write_bytes(fixture: &Fixture, relative: &str, bytes: &[u8]) {
    std::fs::write(fixture.root.join(relative), bytes).unwrap();
}

fn read_bytes(fixture: &Fixture, relative: &str) -> Vec<u8> {
    std::fs::read(fixture.root.join(relative)).unwrap()
}

#[tokio::test]
async fn issue_12_lf_old_and_new_edit_a_crlf_file_and_keep_crlf() {
    let fixture = Fixture::new();
    write_bytes(&fixture, "win.cs", b"class A {\r\n\tint x = 1;\r\n\tint y = 2;\r\n}\r\n");
    let output = fixture
        .call(
            "edit_file",
            json!({
                "path": "win.cs",
                "old": "\tint x = 1;\n\tint y = 2;\n",
                "new": "\tint x = 10;\n\tint y = 20;\n\tint z = 30;\n"
            }),
        )
        .await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert_eq!(
        read_bytes(&fixture, "win.cs"),
        b"class A {\r\n\tint x = 10;\r\n\tint y = 20;\r\n\tint z = 30;\r\n}\r\n"
    );
}

#[tokio::test]
async fn issue_12_a_single_line_edit_of_a_crlf_file_writes_crlf() {
    let fixture = Fixture::new();
    write_bytes(&fixture, "a.txt", b"one\r\ntwo\r\nthree\r\n");
    let output =
        fixture.call("edit_file", json!({"path": "a.txt", "old": "two", "new": "2a\n2b"})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert_eq!(read_bytes(&fixture, "a.txt"), b"one\r\n2a\r\n2b\r\nthree\r\n");
    // `old` and `new` written with CRLF work too.
    let output = fixture
        .call("edit_file", json!({"path": "a.txt", "old": "2b\r\nthree", "new": "3\r\n4"}))
        .await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert_eq!(read_bytes(&fixture, "a.txt"), b"one\r\n2a\r\n3\r\n4\r\n");
}

#[tokio::test]
async fn issue_12_mixed_endings_keep_each_regions_ending() {
    let fixture = Fixture::new();
    write_bytes(&fixture, "mixed.txt", b"a\r\nb\r\nc\nd\n");
    let output = fixture
        .call("edit_file", json!({"path": "mixed.txt", "old": "a\nb\n", "new": "A\nB\n"}))
        .await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    let output = fixture
        .call("edit_file", json!({"path": "mixed.txt", "old": "c\nd\n", "new": "C\nD\n"}))
        .await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert_eq!(read_bytes(&fixture, "mixed.txt"), b"A\r\nB\r\nC\nD\n");
    // replace_all over both regions.
    let output = fixture
        .call(
            "edit_file",
            json!({"path": "mixed.txt", "old": "\n", "new": "\n\n", "replace_all": true}),
        )
        .await;
    assert_eq!(output.content, "replaced 4 occurrences in `mixed.txt`");
    assert_eq!(read_bytes(&fixture, "mixed.txt"), b"A\r\n\r\nB\r\n\r\nC\n\nD\n\n");
}

#[tokio::test]
async fn issue_12_tabs_are_kept() {
    let fixture = Fixture::new();
    fixture.write("Makefile", "all:\n\tcc -o app main.c\n");
    let output = fixture
        .call(
            "edit_file",
            json!({"path": "Makefile", "old": "\tcc -o app main.c", "new": "\tcc -O2 -o app main.c\n\tstrip app"}),
        )
        .await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert_eq!(fixture.read("Makefile"), "all:\n\tcc -O2 -o app main.c\n\tstrip app\n");
}

#[tokio::test]
async fn issue_12_a_miss_shows_tabs_where_old_has_spaces() {
    let fixture = Fixture::new();
    write_bytes(&fixture, "Makefile", b"all:\r\n\tcc -o app main.c\r\n");
    let output = fixture
        .call("edit_file", json!({"path": "Makefile", "old": "    cc -o app main.c", "new": "x"}))
        .await;
    assert_eq!(output.outcome, Outcome::Error);
    assert!(output.content.contains("     2\t\\tcc -o app main.c\\r\n"), "{}", output.content);
    assert!(
        output.content.contains("`old` line 1 is:\n      \t    cc -o app main.c"),
        "{}",
        output.content
    );
    assert_eq!(read_bytes(&fixture, "Makefile"), b"all:\r\n\tcc -o app main.c\r\n");
}

#[tokio::test]
async fn issue_12_a_miss_names_a_no_break_space_with_line_and_column() {
    let fixture = Fixture::new();
    fixture.write("doc.md", "# Title\n\nThe\u{a0}quick fox \u{2014} jumps.\nEnd.\n");
    let output = fixture
        .call("edit_file", json!({"path": "doc.md", "old": "The quick fox - jumps.", "new": "x"}))
        .await;
    assert_eq!(output.outcome, Outcome::Error);
    assert!(
        output.content.contains("     3\tThe\\u{00A0}quick fox \\u{2014} jumps."),
        "{}",
        output.content
    );
    assert!(
        output.content.contains("U+00A0 NO-BREAK SPACE at line 3 column 4"),
        "{}",
        output.content
    );
    assert!(output.content.contains("U+2014 EM DASH at line 3 column 15"), "{}", output.content);
    // The real characters, once repeated, match.
    let output = fixture
        .call(
            "edit_file",
            json!({"path": "doc.md", "old": "The\u{a0}quick fox \u{2014} jumps.", "new": "The quick fox jumps."}),
        )
        .await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert_eq!(fixture.read("doc.md"), "# Title\n\nThe quick fox jumps.\nEnd.\n");
}

#[tokio::test]
async fn issue_12_a_miss_names_curly_quotes_zero_width_and_bom() {
    let fixture = Fixture::new();
    fixture.write("q.py", "\u{feff}x = 1\nprint(\u{201c}don\u{2019}t\u{201d})\u{200b}\n");
    let output = fixture
        .call("edit_file", json!({"path": "q.py", "old": "print(\"don't\")", "new": "pass"}))
        .await;
    assert_eq!(output.outcome, Outcome::Error);
    for expected in [
        "U+201C LEFT DOUBLE QUOTATION MARK at line 2 column 7",
        "U+2019 RIGHT SINGLE QUOTATION MARK at line 2 column 11",
        "U+201D RIGHT DOUBLE QUOTATION MARK at line 2 column 13",
        "U+200B ZERO WIDTH SPACE at line 2 column 15",
    ] {
        assert!(output.content.contains(expected), "{expected}: {}", output.content);
    }
    let output =
        fixture.call("edit_file", json!({"path": "q.py", "old": "x = 2", "new": "y"})).await;
    assert!(output.content.contains("     1\t\\u{FEFF}x = 1"), "{}", output.content);
    assert!(output.content.contains("U+FEFF ZERO WIDTH NO-BREAK SPACE (BOM) at line 1 column 1"));
    // A miss with nothing close says so instead of pointing anywhere.
    let output =
        fixture.call("edit_file", json!({"path": "q.py", "old": "zzzzzzzzzzzz", "new": "y"})).await;
    assert!(output.content.contains("no line of the file is close to it"), "{}", output.content);
}

#[tokio::test]
async fn issue_12_read_file_notes_crlf_and_lookalikes() {
    let fixture = Fixture::new();
    write_bytes(&fixture, "win.txt", "\u{feff}a\r\nb\u{a0}c\r\n".as_bytes());
    let output = fixture.call("read_file", json!({"path": "win.txt"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert!(
        output.content.starts_with("     1\t\u{feff}a\n     2\tb\u{a0}c\n"),
        "{:?}",
        output.content
    );
    let note = output.content.lines().last().unwrap();
    assert_eq!(
        note,
        "[keel: it uses CRLF line endings (shown without \\r); edit_file keeps each line's \
         ending, so write `old` and `new` with plain \\n; it contains look-alike characters, \
         which `old` must repeat exactly: U+FEFF ZERO WIDTH NO-BREAK SPACE (BOM) at line 1 \
         column 1, U+00A0 NO-BREAK SPACE at line 2 column 2]"
    );
    assert_eq!(output.raw, None);

    write_bytes(&fixture, "mixed.txt", b"a\r\nb\nc\n");
    let output = fixture.call("read_file", json!({"path": "mixed.txt"})).await;
    assert!(
        output.content.ends_with("[keel: it has mixed line endings: 1 CRLF and 2 LF (shown without \\r); edit_file keeps each line's ending, so write `old` and `new` with plain \\n]\n"),
        "{}",
        output.content
    );

    fixture.write("plain.txt", "a\tb\n");
    let output = fixture.call("read_file", json!({"path": "plain.txt"})).await;
    assert_eq!(output.content, "     1\ta\tb\n", "a plain file has no note");
}
