//! The connection: `keel acp` serving ACP on stdin/stdout ([`serve`]), and the dispatch of
//! each request and notification to the agent; a prompt's turn runs beside the dispatch
//! loop, so cancel and permission answers keep flowing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    CancelNotification, InitializeRequest, ListSessionsRequest, LoadSessionRequest,
    NewSessionRequest, PromptRequest, SetSessionModeRequest,
};
use agent_client_protocol::{Agent, Client, Stdio};
use keel_host::root;
use tokio::task::JoinHandle;

use crate::agent::{AcpAgent, AcpOptions};
use crate::error::{ending, internal};
use crate::live::{Claim, Live, lock};

/// Serves ACP on stdin/stdout until the client closes stdin (or SIGTERM/SIGINT); then
/// cancels every running turn and waits for its run to be recorded.
///
/// # Errors
///
/// The ledger cannot be opened, or the connection fails (not a malformed message: the
/// crate answers those and goes on).
///
/// # Cancel safety
///
/// Not cancel safe: dropping it leaves running turns to be repaired by the next keel.
pub async fn serve(options: AcpOptions) -> anyhow::Result<()> {
    let (home, store) = root::open_store().await?;
    let agent = Arc::new(AcpAgent {
        home,
        store,
        options,
        sessions: Mutex::new(HashMap::new()),
        turns: Mutex::new(Vec::new()),
        client_elicits: Arc::default(),
    });
    // The editor closing stdin ends the connection; an editor (or a supervisor) that
    // sends SIGTERM or SIGINT instead gets the same orderly end.
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let signalled = async {
        match terminate.as_mut() {
            Some(term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    let served = tokio::select! {
        served = connect(agent.clone()) => served,
        () = signalled => Ok(()),
    };
    // The client is gone (or the connection failed): no turn may go on unwatched.
    let sessions: Vec<Arc<Live>> = lock(&agent.sessions).values().cloned().collect();
    for session in &sessions {
        if let Some(running) = lock(&session.running).as_ref() {
            running.cancel.cancel();
        }
    }
    let turns: Vec<JoinHandle<()>> = std::mem::take(&mut *lock(&agent.turns));
    for turn in turns {
        let _ = turn.await;
    }
    for session in sessions {
        session.assembly.outbox.finish().await;
        session.assembly.mcp.close().await;
    }
    served.map_err(|error| anyhow::anyhow!("the ACP connection failed: {error}"))
}

async fn connect(agent: Arc<AcpAgent>) -> Result<(), agent_client_protocol::Error> {
    let (a1, a2, a3, a4, a5, a6) =
        (agent.clone(), agent.clone(), agent.clone(), agent.clone(), agent.clone(), agent.clone());
    let a0 = agent.clone();
    Agent
        .v1()
        .name("keel")
        .on_receive_request(
            async move |request: InitializeRequest, responder, _cx| {
                let elicits = request
                    .client_capabilities
                    .elicitation
                    .as_ref()
                    .is_some_and(|offered| offered.form.is_some());
                a0.client_elicits.store(elicits, std::sync::atomic::Ordering::Relaxed);
                responder.respond(AcpAgent::initialize())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: NewSessionRequest, responder, cx: ConnectionTo<Client>| match a1
                .new_session(request, cx)
                .await
            {
                Ok(response) => responder.respond(response),
                Err(error) => responder.respond_with_error(error),
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: LoadSessionRequest, responder, cx: ConnectionTo<Client>| match a2
                .load_session(request, cx)
                .await
            {
                Ok(response) => responder.respond(response),
                Err(error) => responder.respond_with_error(error),
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ListSessionsRequest, responder, _cx| match a3
                .list_sessions(request)
                .await
            {
                Ok(response) => responder.respond(response),
                Err(error) => responder.respond_with_error(error),
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: PromptRequest, responder, _cx| {
                // The turn runs outside the dispatch loop, so cancel and permission
                // answers keep flowing; the responder answers when the turn ends.
                let handle = match a4.start_prompt(request) {
                    Ok(Claim::Turn { session, input, cancel, steering, answer: publish }) => {
                        tokio::spawn(async move {
                            let answer = session.run(&input, &cancel, &steering).await;
                            *lock(&session.running) = None;
                            publish.send_replace(Some(answer.clone()));
                            let _ = match answer {
                                Ok(response) => responder.respond(response),
                                Err(error) => responder.respond_with_error(error),
                            };
                        })
                    }
                    Ok(Claim::Queued { joined, mut answer }) => tokio::spawn(async move {
                        let answer = match joined.wait().await {
                            // Joined: this prompt's turn is the running one.
                            Some(_) => loop {
                                if let Some(answer) = answer.borrow_and_update().clone() {
                                    break answer;
                                }
                                if answer.changed().await.is_err() {
                                    break Err(internal("the turn ended without an answer"));
                                }
                            },
                            None => Err(ending()),
                        };
                        let _ = match answer {
                            Ok(response) => responder.respond(response),
                            Err(error) => responder.respond_with_error(error),
                        };
                    }),
                    Err(error) => return responder.respond_with_error(error),
                };
                let mut turns = lock(&a4.turns);
                turns.retain(|turn| !turn.is_finished());
                turns.push(handle);
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: SetSessionModeRequest, responder, cx: ConnectionTo<Client>| {
                match a6.set_mode(request, cx).await {
                    Ok(response) => responder.respond(response),
                    Err(error) => responder.respond_with_error(error),
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |notification: CancelNotification, _cx| {
                a5.cancel(&notification);
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_to(Stdio::new())
        .await
}
