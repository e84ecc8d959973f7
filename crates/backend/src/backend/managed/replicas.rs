//! Managed mode with replicas on one PostgreSQL database (docs/scale-out.md). The replicas share one identity
//! (`startup::identify`). One of them leads, holding a session-level advisory lock on a connection of its own:
//! it alone sends heartbeats, polls commands and posts their results, so the backend sees one satellite and
//! every command is answered once. When the leader dies its session ends, the lock is free, and another replica
//! takes it within `RETRY`. A command the leader ran that changes what a replica runs is recorded in the
//! database (`replica_signals`, by the command worker), and every other replica runs it too (`follow`), without
//! posting a result.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use super::commands::run_command;
use super::{Managed, ManagedDeps};
use crate::backend::monitor::Role;
use crate::backend::startup::lock_key;
use crate::backend::wire::Command;

/// How often a follower tries the leader lock, and how often the leader checks that its session is alive.
const RETRY: Duration = Duration::from_secs(2);
/// How often every replica looks for commands the leader ran.
const FOLLOW_EVERY: Duration = Duration::from_secs(2);

/// Take the leader lock when it is free and run the leader's loops while it is held; step down when the
/// lock's session breaks. Runs until `cancel`.
pub(super) async fn leadership(managed: Managed, tracker: TaskTracker, cancel: CancellationToken) {
    let replicas = managed.deps.replicas.clone();
    let key = lock_key("leader", &managed.deps.client.satellite_id().unwrap_or_default());
    managed.deps.monitor.set_role(Role::Follower);
    loop {
        let attempt = tokio::select! {
            _ = cancel.cancelled() => return,
            attempt = replicas.advisory_lock(key, false) => attempt,
        };
        match attempt {
            Ok(Some(mut lock)) => {
                info!("this replica leads: it sends the heartbeats, polls the commands and posts their results");
                managed.deps.monitor.set_role(Role::Leader);
                let term = cancel.child_token();
                managed.spawn_loops(&tracker, term.clone());
                loop {
                    tokio::select! {
                        _ = cancel.cancelled() => {
                            lock.release().await;
                            return;
                        }
                        _ = tokio::time::sleep(RETRY) => {}
                    }
                    if !lock.alive().await {
                        warn!("the leader lock's database session broke; stepping down until the lock is free again");
                        term.cancel();
                        managed.deps.monitor.set_role(Role::Follower);
                        break;
                    }
                }
            }
            Ok(None) => {}
            Err(err) => warn!(error = %err, "could not try the leader lock"),
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(RETRY) => {}
        }
    }
}

/// Run, in order, the commands other replicas' leaders recorded after `from` (-1: after the newest one when it
/// can first be read, never replaying what came before this replica started). Runs until `cancel`.
pub(super) async fn follow(deps: ManagedDeps, mut from: i64, cancel: CancellationToken) {
    while from < 0 {
        match deps.replicas.last_signal_id().await {
            Ok(id) => from = id,
            Err(err) => warn!(error = %err, "could not read the leader's recorded commands; trying again"),
        }
        if from < 0 {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(FOLLOW_EVERY) => {}
            }
        }
    }
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(FOLLOW_EVERY) => {}
        }
        let signals = match deps.replicas.signals_after(from).await {
            Ok(signals) => signals,
            Err(err) => {
                warn!(error = %err, "could not read the leader's commands; trying again");
                continue;
            }
        };
        for signal in signals {
            from = signal.id;
            if signal.origin == deps.replica_id {
                continue;
            }
            match serde_json::from_value::<Command>(signal.command) {
                Ok(command) => {
                    let (id, kind) = (command.id.clone(), command.kind.command_type().to_owned());
                    let result = run_command(&deps, command).await;
                    info!(command_id = %id, command_type = %kind, status = result.status.as_str(),
                          "ran a command the leader ran");
                }
                Err(err) => warn!(signal = signal.id, error = %err, "a recorded command does not parse; skipped"),
            }
        }
    }
}
