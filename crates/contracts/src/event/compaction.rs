//! What a `compaction` event carries besides its summary: the digest chain, the failure
//! counts of the open turn, and the context carried forward verbatim.

use serde::{Deserialize, Serialize};

use crate::{Seq, TurnId};

/// The compaction a chained compaction digest extends (issue #13): the later compaction's
/// `digest` is `sha256(chain.digest ++ "\n" ++ JSON of each event after chain.covers_to up to
/// its own covers_to, one per line)`, so each compaction hashes only what was covered since
/// the previous one, and a change to an event covered by the previous one invalidates that
/// one and with it every compaction chained on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DigestChain {
    /// Seq of the compaction event extended.
    pub compaction: Seq,
    /// Its last covered seq: the chained digest hashes the events after it.
    pub covers_to: Seq,
    /// Its digest.
    pub digest: String,
}

/// The repeated-failure guard's counts for one turn as of a compaction's `covers_to`
/// (issue #13): a resume of a turn that began before the events it reads continues from
/// them instead of reading the covered part of the turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnFailures {
    /// The turn open at `covers_to`.
    pub turn_id: TurnId,
    /// Its failures so far, by call.
    pub counts: Vec<FailureCount>,
}

/// How often one call (tool and arguments) failed in a turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureCount {
    /// The tool.
    pub tool: String,
    /// SHA-256 of the arguments' JSON.
    pub arguments_sha256: String,
    /// `error` results so far.
    pub failures: u32,
}

/// What a compaction carries forward verbatim, extracted by keel from the covered events.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CarriedContext {
    /// Every user input in the covered range, in order (the task and its constraints).
    pub inputs: Vec<String>,
    /// The latest `todo`/`plan` items, as the agent recorded them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<serde_json::Value>,
    /// Files the covered tool calls named (`path` arguments), in first-use order.
    pub files: Vec<String>,
    /// Skills activated in the covered range (`skill_activated`), in first-activation
    /// order, each with the text its activation returned, so an activated skill survives
    /// compaction.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<ActivatedSkill>,
}

/// A skill the agent activated, as a compaction carries it forward.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActivatedSkill {
    /// The skill's name.
    pub name: String,
    /// What `activate_skill` returned to the model (the body, fenced when it came with the
    /// workspace).
    pub text: String,
}
