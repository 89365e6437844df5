//! Hostile task folders: names that try to leave the output folder, environment files
//! that link outside, reward files that are FIFOs or huge. Each is blocked, and a
//! legitimate neighbour in the same dataset still passes.

use keel_eval::{Class, ExperimentSpec};

use super::support::{Lab, TaskBuilder, by_task};

#[tokio::test]
async fn redteam_eval_task_names_and_links_cannot_reach_outside() {
    let lab = Lab::new();
    let dataset = lab.dataset();
    let secret = lab.scratch.path().join("secret.txt");
    std::fs::write(&secret, "the host's secret\n").unwrap();
    // A package name with traversal in task.toml, and a Dockerfile that copies a link to a
    // file outside the task.
    let hostile = TaskBuilder::new(&dataset, "hostile")
        .file("task.toml", "[task]\nname = \"../../../../tmp/keel-eval-pwned\"\n")
        .file("environment/Dockerfile", "FROM x\nWORKDIR /app\nCOPY secret /app/secret\n");
    std::os::unix::fs::symlink(&secret, hostile.dir.join("environment/secret")).unwrap();
    // A link inside a copied folder is refused too.
    let nested = TaskBuilder::new(&dataset, "nested-link")
        .file("environment/Dockerfile", "FROM x\nWORKDIR /app\nCOPY data/ /app/data/\n")
        .file("environment/data/fine.txt", "fine\n");
    std::os::unix::fs::symlink(&secret, nested.dir.join("environment/data/leak")).unwrap();
    // A verifier that writes outside /logs through a relative path gets nothing.
    TaskBuilder::new(&dataset, "neighbour");
    let (_, records) = lab.run(&dataset, &["oracle"], 1).await;
    let hostile = by_task(&records, "hostile", "oracle")[0];
    assert_eq!(hostile.class, Class::InfraError, "{hostile:?}");
    assert!(hostile.reason.as_deref().unwrap().contains("outside environment/"), "{hostile:?}");
    let nested = by_task(&records, "nested-link", "oracle")[0];
    assert_eq!(nested.class, Class::InfraError, "{nested:?}");
    assert!(nested.reason.as_deref().unwrap().contains("symbolic link"), "{nested:?}");
    assert!(!std::path::Path::new("/tmp/keel-eval-pwned").exists());
    // Nothing of the secret reached any workspace; every attempt folder is under --out.
    for entry in walk(&lab.out()) {
        assert!(entry.starts_with(lab.out()), "{}", entry.display());
        if entry.is_file() && !entry.ends_with("eval.sqlite") {
            let text = std::fs::read(&entry).unwrap();
            assert!(
                !String::from_utf8_lossy(&text).contains("the host's secret"),
                "{}",
                entry.display()
            );
        }
    }
    assert_eq!(by_task(&records, "neighbour", "oracle")[0].class, Class::Passed);
}

#[tokio::test]
async fn redteam_eval_reward_fifo_or_huge_is_verifier_error_without_hanging() {
    let lab = Lab::new();
    let dataset = lab.dataset();
    TaskBuilder::new(&dataset, "fifo").file("tests/test.sh", "mkfifo /logs/verifier/reward.txt\n");
    TaskBuilder::new(&dataset, "fifo-json")
        .file("tests/test.sh", "mkfifo /logs/verifier/reward.json\n");
    TaskBuilder::new(&dataset, "huge").file(
        "tests/test.sh",
        "head -c 2000000 /dev/zero | tr '\\0' 1 > /logs/verifier/reward.txt\n",
    );
    TaskBuilder::new(&dataset, "link")
        .file("tests/test.sh", "ln -s /etc/hostname /logs/verifier/reward.txt\n");
    TaskBuilder::new(&dataset, "neighbour");
    let started = std::time::Instant::now();
    let (_, records) = lab.run(&dataset, &["oracle"], 1).await;
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "a FIFO must not block");
    for task in ["fifo", "fifo-json", "huge", "link"] {
        let record = by_task(&records, task, "oracle")[0];
        assert_eq!((record.class, record.reward), (Class::VerifierError, None), "{record:?}");
    }
    assert_eq!(by_task(&records, "neighbour", "oracle")[0].class, Class::Passed);
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() {
            found.extend(walk(&path));
        }
        found.push(path);
    }
    found
}

#[tokio::test]
async fn redteam_eval_agent_cannot_read_the_verifier_or_the_solution() {
    let lab = Lab::new();
    let dataset = lab.dataset();
    let task = TaskBuilder::new(&dataset, "answer")
        .file(
            "tests/test.sh",
            "# VERIFIER-MARKER\nif [ \"$(cat /app/answer.txt)\" = ok ]; then echo 1; else echo 0; fi \
             > /logs/verifier/reward.txt\n",
        )
        .file("solution/solve.sh", "# SOLUTION-MARKER\necho ok > /app/answer.txt\n");
    let tests_copy_of = |subject: &str| {
        lab.out()
            .join("attempts/answer")
            .join(keel_eval::experiment::slug(subject))
            .join("r01-a01/tests/test.sh")
    };
    let script_path = lab.scratch.path().join("peek.json");
    let subject = format!("scripted:{}", script_path.display());
    let script = serde_json::json!({"steps": [
        {"tool_calls": [{"name": "bash", "arguments": {"command": format!(
            "cat {} {} {}; echo peeked",
            task.dir.join("tests/test.sh").display(),
            task.dir.join("solution/solve.sh").display(),
            tests_copy_of(&subject).display(),
        )}}]},
        {"tool_calls": [{"name": "read_file", "arguments": {"path": task.dir.join("solution/solve.sh")}}]},
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "answer.txt", "content": "ok\n"}}]},
        {"text": "Done."}
    ]});
    std::fs::write(&script_path, script.to_string()).unwrap();
    let (_, records) = lab.run(&dataset, &[&subject], 1).await;
    let record = &records[0];
    // The legitimate work still passes.
    assert_eq!(record.class, Class::Passed, "{record:?}");
    let trajectory = std::fs::read_to_string(record.trajectory.as_deref().unwrap()).unwrap();
    assert!(trajectory.contains("peeked"), "the command ran: {trajectory}");
    assert!(!trajectory.contains("VERIFIER-MARKER"), "the verifier leaked: {trajectory}");
    assert!(!trajectory.contains("SOLUTION-MARKER"), "the solution leaked: {trajectory}");
    assert!(trajectory.contains("Permission denied"), "cat was refused: {trajectory}");
    let trajectory: serde_json::Value = serde_json::from_str(&trajectory).unwrap();
    let read = &trajectory["steps"][2]["observation"]["results"][0];
    assert_eq!(trajectory["steps"][2]["tool_calls"][0]["function_name"], "read_file");
    assert_ne!(read["extra"]["outcome"], "ok", "read_file outside the workspace: {read}");
}

/// keel writes the scripts' output into `logs/` after they ran: a link a hostile verifier
/// or solution left there (at the log's name, or in place of the folder) is never
/// followed, so the task cannot write the user's files with its own output.
#[tokio::test]
async fn redteam_eval_links_left_in_logs_never_carry_keels_writes_out() {
    let lab = Lab::new();
    let dataset = lab.dataset();
    let victim = lab.scratch.path().join("victim.rc");
    let victim_dir = lab.scratch.path().join("victim-dir");
    std::fs::write(&victim, "the user's own file\n").unwrap();
    std::fs::create_dir_all(&victim_dir).unwrap();
    let (victim_text, victim_dir_text) = (victim.display(), victim_dir.display());
    TaskBuilder::new(&dataset, "file-link")
        .file(
            "tests/test.sh",
            &format!(
                "ln -sf {victim_text} /logs/verifier/test-stdout.txt\necho PWNED-BY-TASK\n\
                 echo 1 > /logs/verifier/reward.txt\n"
            ),
        )
        .file("solution/solve.sh", &format!("ln -sf {victim_text} /logs/agent/oracle.txt\n"));
    TaskBuilder::new(&dataset, "dir-link").file(
        "tests/test.sh",
        &format!(
            "echo 1 > /logs/verifier/reward.txt\nmv /logs/verifier /logs/moved\n\
             ln -s {victim_dir_text} /logs/verifier\necho PWNED-BY-TASK\n"
        ),
    );
    TaskBuilder::new(&dataset, "neighbour");
    let (_, records) = lab.run(&dataset, &["oracle"], 1).await;
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "the user's own file\n");
    let planted: Vec<_> = std::fs::read_dir(&victim_dir).unwrap().collect();
    assert!(planted.is_empty(), "{planted:?}");
    let linked = by_task(&records, "file-link", "oracle")[0];
    assert_eq!(linked.class, Class::Passed, "{linked:?}");
    assert_eq!(by_task(&records, "neighbour", "oracle")[0].class, Class::Passed);
}

/// The up-front check refuses a task whose `tests/` or `environment/` is a symbolic link
/// (it could point anywhere outside the task, and `tests/test.sh` through it looks like a
/// file of the task), and a dataset entry that is a link to a task folder elsewhere: a
/// usage error naming each, before any attempt. The neighbour: the same dataset without
/// them runs, and its task passes.
#[tokio::test]
async fn redteam_eval_linked_task_folders_are_refused_before_any_attempt() {
    let lab = Lab::new();
    let dataset = lab.dataset();
    let elsewhere = lab.scratch.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let outside = TaskBuilder::new(&elsewhere, "outside");
    TaskBuilder::new(&dataset, "fine");
    let context = lab.context();
    let check = |subjects: &[&str]| {
        let subjects: Vec<String> = subjects.iter().map(|s| (*s).to_owned()).collect();
        ExperimentSpec::new(&dataset, &subjects, 1, lab.scratch.path()).unwrap()
    };

    // A task folder that is a link into another place.
    let linked_task = dataset.join("linked-task");
    std::os::unix::fs::symlink(&outside.dir, &linked_task).unwrap();
    let error = keel_eval::run(&check(&["oracle"]), &lab.out(), &context).await.unwrap_err();
    let keel_eval::Error::Usage(message) = &error else { panic!("not a usage error: {error:?}") };
    let named = format!("{} is a symbolic link to a folder", linked_task.display());
    assert!(message.contains(&named), "{message}");
    assert!(!lab.out().exists(), "nothing was written before the check");
    std::fs::remove_file(&linked_task).unwrap();

    // A task's `tests/` and another's `environment/` that link outside the task.
    let tests = TaskBuilder::new(&dataset, "linked-tests");
    std::fs::remove_dir_all(tests.dir.join("tests")).unwrap();
    std::os::unix::fs::symlink(outside.dir.join("tests"), tests.dir.join("tests")).unwrap();
    let environment = TaskBuilder::new(&dataset, "linked-env");
    std::fs::remove_dir_all(environment.dir.join("environment")).unwrap();
    std::os::unix::fs::symlink(
        outside.dir.join("environment"),
        environment.dir.join("environment"),
    )
    .unwrap();
    let error = keel_eval::run(&check(&["oracle"]), &lab.out(), &context).await.unwrap_err();
    let keel_eval::Error::Usage(message) = &error else { panic!("not a usage error: {error:?}") };
    for named in [
        "task linked-tests",
        "tests/ is a symbolic link",
        "task linked-env",
        "environment/ is a symbolic link",
    ] {
        assert!(message.contains(named), "{named:?} not in {message}");
    }
    assert!(!message.contains("task fine"), "{message}");
    assert!(!lab.out().exists(), "nothing was written before the check");

    for linked in [&tests.dir, &environment.dir] {
        std::fs::remove_dir_all(linked).unwrap();
    }
    let (summary, records) = lab.run(&dataset, &["oracle"], 1).await;
    assert_eq!(summary.cells, 1);
    assert_eq!(by_task(&records, "fine", "oracle")[0].class, Class::Passed);
}
