//! Declared specs: names, order, access, effects, schemas.

use keel_contracts::{Access, Effects, Egress};
use keel_tools::builtin_tools;

#[test]
fn builtin_tools_in_registry_order() {
    let names: Vec<String> = builtin_tools().iter().map(|tool| tool.spec().name.clone()).collect();
    assert_eq!(names, ["read_file", "list_dir", "glob", "grep", "write_file", "edit_file", "bash"]);
}

#[test]
fn reads_and_writes_are_declared() {
    for tool in builtin_tools() {
        let spec = tool.spec();
        assert!(!spec.intrinsic, "{}", spec.name);
        match spec.name.as_str() {
            "read_file" | "list_dir" | "glob" | "grep" => {
                assert_eq!(spec.access, Access::Read, "{}", spec.name);
                assert_eq!(spec.effects, Effects::LOCAL_READ, "{}", spec.name);
                assert!(spec.first_party, "{}", spec.name);
            }
            _ => {
                assert_eq!(spec.access, Access::Write, "{}", spec.name);
                assert_eq!(spec.effects, Effects::LOCAL_WRITE, "{}", spec.name);
                assert_eq!(spec.effects.egress, Egress::None, "{}", spec.name);
                assert!(!spec.first_party, "{}", spec.name);
            }
        }
    }
}

#[test]
fn schemas_are_closed_objects_with_required_fields() {
    let expected_required = [
        ("read_file", vec!["path"]),
        ("list_dir", vec!["path"]),
        ("glob", vec!["pattern"]),
        ("grep", vec!["pattern"]),
        ("write_file", vec!["path", "content"]),
        ("edit_file", vec!["path", "old", "new"]),
        ("bash", vec!["command"]),
    ];
    for (tool, (name, required)) in builtin_tools().iter().zip(expected_required) {
        let parameters = &tool.spec().parameters;
        assert_eq!(tool.spec().name, name);
        assert_eq!(parameters["type"], "object", "{name}");
        assert_eq!(parameters["additionalProperties"], false, "{name}");
        assert_eq!(parameters["required"], serde_json::json!(required), "{name}");
        for field in required {
            assert!(parameters["properties"][field].is_object(), "{name}.{field}");
        }
        assert!(!tool.spec().description.is_empty(), "{name}");
    }
}

#[test]
fn tools_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<keel_tools::ReadFile>();
    assert_send_sync::<keel_tools::Bash>();
}
