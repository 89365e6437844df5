//! Command lines split into simple commands, and what cannot be resolved.

use super::*;

fn texts(line: &CommandLine) -> Vec<String> {
    line.commands().iter().map(SimpleCommand::text).collect()
}

#[track_caller]
fn simple(text: &str) -> Vec<String> {
    match parse(text) {
        CommandLine::Simple(commands) => commands.iter().map(SimpleCommand::text).collect(),
        other @ CommandLine::Unresolved { .. } => panic!("{text}: {other:?}"),
    }
}

#[track_caller]
fn unresolved(text: &str) -> Vec<String> {
    match parse(text) {
        line @ CommandLine::Unresolved { .. } => texts(&line),
        other @ CommandLine::Simple(_) => panic!("{text} should be unresolved: {other:?}"),
    }
}

#[test]
fn simple_commands_are_found_everywhere() {
    let cases: &[(&str, &[&str])] = &[
        ("git status", &["git status"]),
        ("git status --short", &["git status --short"]),
        ("'git' \"status\"", &["git status"]),
        ("g\\it status", &["git status"]),
        ("git status; rm -rf x", &["git status", "rm -rf x"]),
        ("git status && curl http://x", &["git status", "curl http://x"]),
        ("git status || rm x", &["git status", "rm x"]),
        ("git status | tee out", &["git status", "tee out"]),
        ("git status & rm x", &["git status", "rm x"]),
        ("git status $(curl x)", &["curl x", "git status $(curl x)"]),
        ("git status `rm x`", &["rm x", "git status `rm x`"]),
        ("(git status; rm x)", &["git status", "rm x"]),
        ("{ git status; rm x; }", &["git status", "rm x"]),
        ("git status > .git/config", &["git status"]),
        ("git status > \"$(rm x)\"", &["rm x", "git status"]),
        ("diff <(rm x) y", &["rm x", "diff <(…) y"]),
        ("bash -c \"git status; rm x\"", &["git status", "rm x"]),
        ("sh -ec 'git status && rm x'", &["git status", "rm x"]),
        ("env X=1 git status", &["env X=1 git status", "git status"]),
        ("X=1 git status", &["X=1 git status", "git status"]),
        ("env git status", &["git status"]),
        ("command git status", &["git status"]),
        ("timeout 5 nice -n 2 command git status", &["git status"]),
        (
            "env -i PATH=/bin timeout 5 git status",
            &["env -i PATH=/bin timeout 5 git status", "git status"],
        ),
        ("find . -name x -exec rm {} \\;", &["find . -name x -exec rm {} ;", "rm {}"]),
        ("/bin/rm -rf x", &["/bin/rm -rf x", "rm -rf x"]),
        ("for f in $(ls); do rm $f; done", &["ls", "rm $f"]),
        ("if git status; then rm x; fi", &["git status", "rm x"]),
        ("f() { rm x; }; f", &["rm x", "f"]),
        ("cat <<EOF\n$(rm x)\nEOF", &["rm x", "cat"]),
        ("X=$(rm x)", &["rm x"]),
        ("xargs rm < list", &["rm"]),
        ("bash script.sh", &["bash script.sh"]),
        ("bash --rcfile x -O extglob -c 'rm y'", &["rm y"]),
        ("sudo rm -rf x; busybox rm y", &["rm -rf x", "rm y"]),
        ("git status {a,b}", &["git status {a,b}"]),
        (
            "git status ${X:-default} ${a[@]} $((1 + 2))",
            &["git status ${X:-default} ${a[@]} $((1 + 2))"],
        ),
        ("[[ -f x ]] && git status", &["git status"]),
        ("bash -c 'echo $(date)'", &["date", "echo $(date)"]),
        ("export LC_ALL=C; git status", &["export LC_ALL=C", "git status"]),
        (
            "export PATH=\"$PATH:/x\"; printf '%s\\n' \"$HOME\"",
            &["export PATH=$PATH:/x", "printf %s\\n $HOME"],
        ),
        ("read -r line < f; test -f \"$F\"", &["read -r line", "test -f $F"]),
    ];
    for (line, want) in cases {
        assert_eq!(simple(line), *want, "{line}");
    }
}

#[test]
fn what_cannot_be_resolved_is_unresolved() {
    assert_eq!(unresolved("eval git status"), ["eval git status"]);
    assert_eq!(unresolved("$X status"), ["$X status"]);
    assert_eq!(unresolved("$(echo rm) -rf x"), ["echo rm", "$(echo rm) -rf x"]);
    unresolved("git status; eval \"$Y\"");
    unresolved("git status (");
    unresolved("git 'status");
    unresolved("bash -c \"$CMD\"");
    unresolved("env -S 'rm x' true");
    unresolved("trap 'rm x' EXIT");
    unresolved("r? -rf x");
    unresolved("{rm,-rf,x}");
    unresolved("echo $(( $(rm x) + 1 ))");
    unresolved("$'\\x72m' -rf x");
    // Code hidden in values that bash evaluates later.
    for line in [
        "X='a[$(touch p)]'; git status $((X))",
        "git status \"$(( X + 1 ))\"",
        "X=$(cat f); [[ $X -eq 1 ]] && git status",
        "git status ${X@P}",
        "git status ${a[X]}",
        "git status ${s:X}",
        "git status ${Z:-$(touch p)}",
        "a[X]=1 git status",
        "let X; git status",
        "declare -i N; git status",
        "printf -v \"$X\" %s v; git status",
        "read \"a[$X]\" < f; git status",
        "[[ -v $X ]] && git status",
        "declare \"a[$X]=1\"; git status",
        "echo 'run $(touch p) later' > f",
    ] {
        unresolved(line);
    }
    unresolved("cat <<EOF\n$(rm x)");
    let deep = format!("{}git status{}", "$(".repeat(12), ")".repeat(12));
    unresolved(&deep);
    unresolved(&"x".repeat(MAX_LINE_BYTES + 1));
}

#[test]
fn hostile_input_never_panics() {
    for line in [
        "", "((", "$((", "<<", "<<EOF", "`", "$(", "'\"", "\0", "case", "a\\", "{", "}", "]]",
        "[[ -f",
    ] {
        let _ = parse(line);
    }
}
