//! Routing Chat Completions tool-call fragments to calls ([`ToolCallAssembler`]), and
//! finishing each call with its id and parsed arguments.

use keel_contracts::{ToolCall, ToolCallId};

use crate::arguments;
use crate::openai::wire::{self, ToolCallDelta};

/// One tool call while its fragments arrive.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PartialCall {
    /// The wire `index`, when the server sent one: a key, not a position.
    index: Option<u64>,
    /// The first non-empty id seen for the call.
    id: Option<String>,
    name: String,
    arguments: String,
}

/// Routes tool-call fragments to calls.
///
/// The rule (cases B01 and B02):
/// 1. A fragment with a non-empty id that no call has yet AND a non-empty name starts a
///    new call, even when its `index` is already in use. (A fragment repeating a known id
///    continues that call.)
/// 2. Otherwise a fragment with an `index` continues the most recent call with that index,
///    or starts one when the index is new.
/// 3. A fragment with neither a new id nor an index continues the call being streamed
///    (the one touched last), or starts the first call.
///
/// The first id seen for a call is kept; later ids on its fragments are ignored. A call
/// that never received an id gets one minted when the response finishes.
#[derive(Debug, Default)]
pub(crate) struct ToolCallAssembler {
    calls: Vec<PartialCall>,
    current: Option<usize>,
}

impl ToolCallAssembler {
    /// Applies one fragment; returns the call's name when this fragment gave a call its
    /// name (the moment to announce it).
    pub(crate) fn apply(&mut self, fragment: &ToolCallDelta) -> Option<String> {
        let id = fragment.id.as_deref().filter(|id| !id.is_empty());
        let function = fragment.function.as_ref();
        let name = function.and_then(|function| function.name.as_deref()).filter(|n| !n.is_empty());
        let arguments = wire::arguments_of(function.and_then(|f| f.arguments.as_ref()));

        // A known id continues its call, unless it arrives at another index with a name of
        // its own: that is a second call reusing the id (the kernel gives it a fresh one).
        let known_id = id
            .and_then(|id| self.calls.iter().rposition(|call| call.id.as_deref() == Some(id)))
            .filter(|&position| {
                let call_index = self.calls[position].index;
                !(name.is_some()
                    && fragment.index.is_some()
                    && call_index.is_some()
                    && call_index != fragment.index)
            });
        let target = match (known_id, id, name, fragment.index) {
            (Some(position), _, _, _) => Some(position),
            (None, Some(_), Some(_), _) => None,
            (None, _, _, Some(index)) => {
                self.calls.iter().rposition(|call| call.index == Some(index))
            }
            (None, _, _, None) => self.current,
        };
        let position = match target {
            Some(position) => position,
            None => {
                self.calls.push(PartialCall {
                    index: fragment.index,
                    id: None,
                    name: String::new(),
                    arguments: String::new(),
                });
                self.calls.len() - 1
            }
        };
        self.current = Some(position);
        let call = self.calls.get_mut(position)?;
        if call.id.is_none() {
            call.id = id.map(str::to_owned);
        }
        if let Some(arguments) = arguments {
            call.arguments.push_str(&arguments);
        }
        match name {
            Some(name) if call.name.is_empty() => {
                call.name = name.to_owned();
                Some(call.name.clone())
            }
            _ => None,
        }
    }

    /// The assembled calls, in the order they started.
    pub(crate) fn finish(self) -> Vec<ToolCall> {
        self.calls.into_iter().map(finish_call).collect()
    }
}

fn finish_call(call: PartialCall) -> ToolCall {
    let call_id = match call.id {
        Some(id) => ToolCallId(id),
        None => arguments::mint_call_id(),
    };
    let (arguments, arguments_error) = arguments::parse(call.arguments);
    ToolCall { call_id, name: call.name, arguments, arguments_error }
}
