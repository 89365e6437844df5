//! `[[outbox]]` tables: what is accepted and what is refused, with the sink named.

use std::sync::Arc;

use keel_outbox::{BuildContext, Mirror, MirrorConfig, OtlpEnv, SinkConfig};
use keel_testkit::{FakeClock, MemStore};

fn parse(text: &str) -> Result<SinkConfig, toml::de::Error> {
    toml::from_str(text)
}

fn context(otlp_env: OtlpEnv) -> BuildContext {
    BuildContext { store: Arc::new(MemStore::new()), otlp_env }
}

fn build_error(text: &str) -> String {
    match parse(text).unwrap().build(&context(OtlpEnv::default())) {
        Ok(_) => panic!("accepted: {text}"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn valid_tables_build_their_sinks() {
    let (name, sink) = parse("name = \"audit\"\nkind = \"jsonl\"\npath = \"/var/log/keel.jsonl\"")
        .unwrap()
        .build(&context(OtlpEnv::default()))
        .unwrap();
    assert_eq!((name.as_str(), sink.target()), ("audit", "jsonl:/var/log/keel.jsonl".into()));
    let (_, sink) =
        parse("name = \"hook\"\nkind = \"webhook\"\nurl = \"https://example.invalid/x\"")
            .unwrap()
            .build(&context(OtlpEnv::default()))
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
    assert!(parse("name = \"a\"\nkind = \"kafka\"").is_err());
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

#[test]
fn otlp_tables_take_the_endpoint_from_the_table_or_the_standard_variable() {
    let table =
        parse("name = \"traces\"\nkind = \"otlp\"\nendpoint = \"http://127.0.0.1:4318\"").unwrap();
    let from_env =
        OtlpEnv { endpoint: Some("https://collector.invalid/otlp".into()), headers: None };
    let (_, sink) = table.build(&context(from_env.clone())).unwrap();
    assert_eq!(sink.target(), "otlp:http://127.0.0.1:4318/", "the table wins");
    let bare = parse("name = \"traces\"\nkind = \"otlp\"").unwrap();
    let (_, sink) = bare.build(&context(from_env)).unwrap();
    assert_eq!(sink.target(), "otlp:https://collector.invalid/otlp");
    let error = bare.build(&context(OtlpEnv::default())).err().unwrap().to_string();
    assert!(error.contains("needs `endpoint (or OTEL_EXPORTER_OTLP_ENDPOINT)`"), "{error}");
}

#[test]
fn invalid_otlp_tables_say_why_and_never_show_a_header_value() {
    let cases = [
        (
            "name = \"a\"\nkind = \"otlp\"\nendpoint = \"http://user:hunter2@h:4318\"",
            "credentials in the endpoint are refused",
        ),
        ("name = \"a\"\nkind = \"otlp\"\nendpoint = \"ftp://h/\"", "is not http or https"),
        (
            "name = \"a\"\nkind = \"otlp\"\nendpoint = \"http://h/\"\nurl = \"http://h/\"",
            "(otlp) does not take `url`",
        ),
        (
            "name = \"a\"\nkind = \"webhook\"\nurl = \"http://h/\"\ncapture_content = true",
            "(webhook) does not take `capture_content`",
        ),
        (
            "name = \"a\"\nkind = \"jsonl\"\npath = \"/x\"\nendpoint = \"http://h/\"",
            "(jsonl) does not take `endpoint`",
        ),
        (
            "name = \"a\"\nkind = \"otlp\"\nendpoint = \"http://h/\"\n\
             headers = { \"x-key\" = \"hunter2\\n\" }",
            "header 'x-key' has a value that is not valid in HTTP",
        ),
    ];
    for (text, expected) in cases {
        let error = build_error(text);
        assert!(error.contains(expected), "{text}: {error}");
        assert!(!error.contains("hunter2"), "{error}");
    }
    let table = parse("name = \"a\"\nkind = \"otlp\"\nendpoint = \"http://h/\"").unwrap();
    let env = OtlpEnv { endpoint: None, headers: Some("x-key=hunter2,broken".into()) };
    let error = table.build(&context(env)).err().unwrap().to_string();
    assert!(error.contains("OTEL_EXPORTER_OTLP_HEADERS: entry 2 has no `=`"), "{error}");
    assert!(!error.contains("hunter2"), "{error}");
}
