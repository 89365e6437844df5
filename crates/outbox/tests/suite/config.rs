//! `[[outbox]]` tables: what is accepted and what is refused, with the sink named.

use std::sync::Arc;

use keel_outbox::{Mirror, MirrorConfig, SinkConfig};
use keel_testkit::{FakeClock, MemStore};

fn parse(text: &str) -> Result<SinkConfig, toml::de::Error> {
    toml::from_str(text)
}

fn build_error(text: &str) -> String {
    match parse(text).unwrap().build() {
        Ok(_) => panic!("accepted: {text}"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn valid_tables_build_their_sinks() {
    let (name, sink) = parse("name = \"audit\"\nkind = \"jsonl\"\npath = \"/var/log/keel.jsonl\"")
        .unwrap()
        .build()
        .unwrap();
    assert_eq!((name.as_str(), sink.target()), ("audit", "jsonl:/var/log/keel.jsonl".into()));
    let (_, sink) =
        parse("name = \"hook\"\nkind = \"webhook\"\nurl = \"https://example.invalid/x\"")
            .unwrap()
            .build()
            .unwrap();
    assert_eq!(sink.target(), "webhook:https://example.invalid/x");
    assert_eq!(sink.max_batch(), keel_outbox::DEFAULT_MAX_BATCH);
}

#[test]
fn invalid_tables_say_which_sink_and_why() {
    let cases = [
        ("name = \"a/b\"\nkind = \"jsonl\"\npath = \"/x\"", "outbox sink name 'a/b' is invalid"),
        ("name = \"a\"\nkind = \"jsonl\"", "outbox sink 'a' (jsonl) needs `path`"),
        ("name = \"a\"\nkind = \"jsonl\"\npath = \"x.jsonl\"", "path x.jsonl must be absolute"),
        (
            "name = \"a\"\nkind = \"jsonl\"\npath = \"/x\"\nurl = \"http://h/\"",
            "outbox sink 'a' (jsonl) does not take `url`",
        ),
        ("name = \"a\"\nkind = \"webhook\"", "outbox sink 'a' (webhook) needs `url`"),
        (
            "name = \"a\"\nkind = \"webhook\"\nurl = \"ftp://h/\"",
            "scheme 'ftp' is not http or https",
        ),
        ("name = \"a\"\nkind = \"webhook\"\nurl = \"not a url\"", "outbox sink 'a': invalid url"),
        (
            "name = \"a\"\nkind = \"webhook\"\nurl = \"http://h/\"\nmax_batch = 0",
            "`max_batch` must be positive",
        ),
    ];
    for (text, expected) in cases {
        let error = build_error(text);
        assert!(error.contains(expected), "{text}: {error}");
    }
    assert!(parse("name = \"a\"\nkind = \"otlp\"").is_err());
    assert!(parse("name = \"a\"\nkind = \"jsonl\"\npath = \"/x\"\nextra = 1").is_err());
}

#[tokio::test]
async fn two_sinks_cannot_share_a_name() {
    let dir = tempfile::tempdir().unwrap();
    let table = parse("name = \"audit\"\nkind = \"jsonl\"\npath = \"/tmp/x.jsonl\"").unwrap();
    let error = Mirror::from_config(
        Arc::new(MemStore::new()),
        &[table.clone(), table],
        MirrorConfig::new(dir.path().to_path_buf(), Arc::new(FakeClock::new())),
    )
    .unwrap_err();
    assert_eq!(error.to_string(), "outbox sink 'audit' is declared twice");
}
