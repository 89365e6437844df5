//! A tool's schema is serialized once (`ToolSchema`): what it writes must be exactly what
//! serializing the schema's value wrote before.

use keel_contracts::ToolDefinition;
use serde::Serialize;

/// `ToolDefinition` as it was before its schema was serialized once.
#[derive(Serialize)]
struct ValueDefinition<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a serde_json::Value,
}

#[test]
fn a_pre_serialized_schema_serializes_as_its_value() {
    let value = serde_json::json!({
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "A \"quoted\" path, \u{e9}\u{1f600}\n"},
            "n": {"type": "integer", "minimum": -1.5e300, "default": 18446744073709551615u64},
            "z": {}, "a": [null, true, "x"]
        },
        "required": ["path"],
        "additionalProperties": false
    });
    let definition = ToolDefinition {
        name: "read_file".into(),
        description: "Reads \"a\" file.".into(),
        parameters: value.clone().into(),
    };
    let old = ValueDefinition {
        name: &definition.name,
        description: &definition.description,
        parameters: &value,
    };
    // Byte for byte, alone and inside a list, as request bodies and digests embed it.
    assert_eq!(serde_json::to_string(&definition).unwrap(), serde_json::to_string(&old).unwrap());
    assert_eq!(
        serde_json::to_vec(&[&definition, &definition]).unwrap(),
        serde_json::to_vec(&[&old, &old]).unwrap()
    );
    assert_eq!(definition.parameters.json(), value.to_string());
    // The value serializer and a round trip see the value.
    assert_eq!(serde_json::to_value(&definition.parameters).unwrap(), value);
    let back: ToolDefinition =
        serde_json::from_str(&serde_json::to_string(&definition).unwrap()).unwrap();
    assert_eq!(back, definition);
    assert_eq!(back.parameters, value);
    assert_eq!(*definition.parameters, value);
    assert_eq!(format!("{:?}", definition.parameters), format!("{value:?}"));
}
