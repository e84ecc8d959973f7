//! The task that owns a stdio child: it reads stdout line by line into JSON-RPC messages, matches responses to
//! waiters, answers the child's own requests, keeps stderr in a bounded buffer, and when the child exits fails
//! every waiter with its exit. Its stdin is the writer's (`writer`).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use parking_lot::Mutex;
use serde_json::Value;
use tokio::process::Child;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Sleep;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::lines::{Line, Lines};
use super::{DropReport, ExitInfo, StderrSink, MAX_LINE_BYTES, STDERR_LINES_KEPT};
use crate::mcp::payload::{Payload, MOVED_AT_BYTES};
use crate::mcp::protocol::{self, FrameError, Message, RequestId};
use crate::mcp::transport::junk::JunkLimiter;
use crate::mcp::transport::relay::{answer_outside, too_many_asks, Asker, ServerAsks, ASK_TIMEOUT, MAX_OUTSIDE_ASKS};
use crate::mcp::transport::relays::Relays;
use crate::mcp::transport::stderr::{StderrLimiter, Verdict};
use crate::mcp::transport::{outcome, preview, Pending, UpstreamError};

/// How long a child may run on after closing its stdout before it is stopped: one that closes it on its way out
/// exits well within this; one that goes on running can never answer again.
const STDOUT_CLOSED_GRACE: Duration = Duration::from_secs(2);

pub(super) struct Owner {
    pub(super) label: String,
    pub(super) child: Child,
    /// The child's process group (its own pid), kept past the child's reaping.
    pub(super) pgid: Option<Pid>,
    /// Secret values masked in what is kept of the child's output.
    pub(super) secrets: Vec<String>,
    /// Cancelled to close the child's stdin (the [`Writer`](super::writer::Writer) drops it); a child of `stop`.
    pub(super) close_stdin: CancellationToken,
    /// Tells the [`Writer`](super::writer::Writer) the owner has ended, when the owner is dropped.
    pub(super) _done: tokio_util::sync::DropGuard,
    /// The child's cpu cgroup, removed when the owner ends (after the child and its group are gone).
    pub(super) _cpu_group: Option<super::cgroup::CpuGroup>,
    pub(super) stdout: FramedRead<tokio::process::ChildStdout, Lines>,
    pub(super) stderr: FramedRead<tokio::process::ChildStderr, Lines>,
    /// Where answers to the child's requests are queued (the [`Writer`](super::writer::Writer)'s channel).
    pub(super) replies: mpsc::Sender<String>,
    pub(super) relays: Arc<Relays>,
    /// Where the child's requests made outside any call of ours go: its owner's clients.
    pub(super) asker: Option<Asker>,
    /// Requests of the child waiting for their client's answer; they end with the owner, or when the child
    /// withdraws one.
    pub(super) asks: ServerAsks,
    /// Those made outside any call of ours (at most `MAX_OUTSIDE_ASKS`).
    pub(super) outside: ServerAsks,
    pub(super) pending: Arc<Pending>,
    pub(super) stderr_buf: Arc<Mutex<VecDeque<String>>>,
    pub(super) limiter: StderrLimiter,
    pub(super) stderr_warnings: Arc<DropReport>,
    pub(super) stderr_sink: Option<StderrSink>,
    /// What of the stdout lines that are not JSON-RPC is logged.
    pub(super) junk: JunkLimiter,
    pub(super) junk_lines: Option<crate::metrics::Counter>,
    pub(super) notifications: broadcast::Sender<crate::mcp::transport::Announcement>,
    pub(super) exit_tx: watch::Sender<Option<ExitInfo>>,
    pub(super) stop: CancellationToken,
    pub(super) close_grace: Duration,
}

impl Owner {
    pub(super) async fn run(mut self) {
        let mut stdout_open = true;
        let mut stderr_open = true;
        // When the child's stdout ended while the child still runs: it is stopped at this moment.
        let mut stdout_closed_until: Option<tokio::time::Instant> = None;
        // When the count of junk lines suppressed is due (armed only while some are).
        let mut junk_due: Option<Pin<Box<Sleep>>> = None;
        let exit = loop {
            // No timer at all until stdout has closed (this loop turns once per line the server writes).
            let hung_up = async {
                match stdout_closed_until {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.stop.cancelled() => break self.terminate().await,
                // No answer can come on a closed stdout: every call would wait out its timeout, and the instance
                // would stay online for ever. Stopped, it is a crash (the supervisor restarts it) and its calls
                // fail now.
                _ = hung_up => break self.stop_hung_up().await,
                status = self.child.wait() => break self.reaped(status),
                _ = until(&mut junk_due) => {
                    self.summarise_junk(false);
                    junk_due = self.junk_timer();
                }
                line = self.stdout.next(), if stdout_open => match line {
                    Some(Ok(line)) => {
                        self.on_stdout(line).await;
                        if junk_due.is_none() {
                            junk_due = self.junk_timer();
                        }
                    }
                    ended => {
                        if let Some(Err(err)) = ended {
                            warn!(process_id = %self.label, error = %err, "reading stdout failed");
                        }
                        stdout_open = false;
                        stdout_closed_until = Some(tokio::time::Instant::now() + STDOUT_CLOSED_GRACE);
                    }
                },
                line = self.stderr.next(), if stderr_open => match line {
                    Some(Ok(Line::Text(line))) => self.on_stderr_line(line),
                    Some(Ok(Line::TooLong { .. })) => {}
                    Some(Err(_)) | None => stderr_open = false,
                },
            }
        };
        self.wind_up(exit, stderr_open).await;
    }

    /// Stop a child that closed its stdout but keeps running, and reap it.
    async fn stop_hung_up(&mut self) -> ExitInfo {
        warn!(process_id = %self.label, "mcp server closed its stdout but keeps running: no answer can come, so it is stopped");
        if let Some(pid) = self.child.id() {
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        let _ = self.child.start_kill();
        match self.child.wait().await {
            Ok(status) => ExitInfo::from_status(status),
            Err(_) => ExitInfo::Exited { code: None, signal: None },
        }
    }

    /// How the child ended, from what waiting for it returned.
    fn reaped(&self, status: std::io::Result<std::process::ExitStatus>) -> ExitInfo {
        match status {
            Ok(status) => ExitInfo::from_status(status),
            Err(err) => {
                warn!(process_id = %self.label, error = %err, "waiting for mcp server process failed");
                ExitInfo::Exited { code: None, signal: None }
            }
        }
    }

    /// The child is gone: its stdin closed, what is left of its process group killed, what it wrote last read, and
    /// every waiter failed with how it ended.
    async fn wind_up(&mut self, exit: ExitInfo, stderr_open: bool) {
        self.close_stdin.cancel();
        // Whatever the child left behind in its process group goes with it.
        if let Some(pgid) = self.pgid {
            let _ = killpg(pgid, Signal::SIGKILL);
            super::reaper::unregister(pgid.as_raw() as u32);
        }
        self.drain_after_exit(stderr_open).await;
        match &exit {
            ExitInfo::Stopped => debug!(process_id = %self.label, "mcp server process stopped"),
            ExitInfo::Exited { .. } => {
                warn!(process_id = %self.label, exit = %exit.describe(), "mcp server process exited on its own; the supervisor restarts it")
            }
        }
        self.pending.close(UpstreamError::Exited { label: self.label.clone(), exit: exit.clone(), detail: None });
        let _ = self.exit_tx.send(Some(exit));
    }

    /// Read what the child wrote before it died: late responses still reach their waiters, and its last stderr
    /// lines usually say why it died (bounded: a grandchild may keep writing). Then the junk not yet summed up.
    async fn drain_after_exit(&mut self, stderr_open: bool) {
        while let Ok(Some(Ok(line))) = tokio::time::timeout(Duration::from_millis(50), self.stdout.next()).await {
            self.on_stdout(line).await;
        }
        if stderr_open {
            for _ in 0..STDERR_LINES_KEPT {
                match tokio::time::timeout(Duration::from_millis(50), self.stderr.next()).await {
                    Ok(Some(Ok(Line::Text(line)))) => self.on_stderr_line(line),
                    Ok(Some(Ok(Line::TooLong { .. }))) => {}
                    _ => break,
                }
            }
        }
        self.summarise_junk(true);
    }

    /// Count a stdout line that is not JSON-RPC; whether it is to be logged (the first few of a burst are).
    fn admit_junk(&mut self) -> bool {
        if let Some(counter) = &self.junk_lines {
            counter.inc();
        }
        self.junk.admit(std::time::Instant::now())
    }

    /// A timer for the next count of suppressed junk lines, if one is due.
    fn junk_timer(&self) -> Option<Pin<Box<Sleep>>> {
        self.junk.due().map(|at| Box::pin(tokio::time::sleep_until(at.into())))
    }

    /// Log how many junk lines were suppressed: when their window ended, or (`at_exit`) whatever is left.
    fn summarise_junk(&mut self, at_exit: bool) {
        let now = std::time::Instant::now();
        let summary = if at_exit { self.junk.finish(now) } else { self.junk.summary(now) };
        if let Some(suppressed) = summary {
            warn!(
                process_id = %self.label,
                suppressed = suppressed.lines,
                seconds = suppressed.over.as_secs(),
                "more non-json-rpc lines from mcp server stdout suppressed"
            );
        }
    }

    /// Close stdin, give the child `close_grace` to leave, then SIGTERM its group, then SIGKILL.
    async fn terminate(&mut self) -> ExitInfo {
        self.close_stdin.cancel();
        if tokio::time::timeout(self.close_grace, self.child.wait()).await.is_ok() {
            return ExitInfo::Stopped;
        }
        if let Some(pid) = self.child.id() {
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGTERM);
            if tokio::time::timeout(Duration::from_secs(3), self.child.wait()).await.is_ok() {
                return ExitInfo::Stopped;
            }
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        let _ = self.child.kill().await;
        ExitInfo::Stopped
    }

    async fn on_stdout(&mut self, line: Line) {
        match line {
            Line::Text(line) => self.on_stdout_line(line).await,
            Line::TooLong { bytes, id, has_method } => {
                warn!(process_id = %self.label, bytes, max_bytes = MAX_LINE_BYTES, ?id, "stdout line too long, skipped");
                // An answer to one of our calls: the call fails now, saying why, rather than waiting out its
                // timeout. (A request or notification of the server's carries an id of its own, or none.)
                match (id, has_method) {
                    (Some(id), false) => {
                        let err = UpstreamError::Protocol(format!(
                            "the server's answer is {bytes} bytes, more than the {MAX_LINE_BYTES} bytes the satellite \
                             reads as one message from a stdio server"
                        ));
                        self.pending.resolve(id, Err(err));
                    }
                    // A request of the server's: refused, so that it does not wait for an answer for ever.
                    (Some(id), true) => {
                        let refusal = protocol::error_response(
                            Some(RequestId::Number(id)),
                            protocol::RpcError::new(
                                protocol::codes::INVALID_REQUEST,
                                format!("request of {bytes} bytes, more than the {MAX_LINE_BYTES} bytes read as one message"),
                            ),
                        );
                        // Queued without waiting, as every answer of the owner's is.
                        let _ = self.replies.try_send(refusal.to_string());
                    }
                    (None, _) => {}
                }
            }
        }
    }

    async fn on_stdout_line(&mut self, whole: String) {
        // Most lines answer a call: their result goes on as the server wrote it, without a tree built and
        // written out again.
        let answer = protocol::result_response(whole.trim()).map(|(id, result)| {
            let text = result.get();
            let small = (text.len() < MOVED_AT_BYTES).then(|| result.to_owned());
            let start = text.as_ptr() as usize - whole.as_ptr() as usize;
            (id, small, start..start + text.len())
        });
        if let Some((id, small, range)) = answer {
            let payload = match small {
                Some(text) => Ok(Payload::text(text)),
                // A large result is moved out of its line, not copied: an answer of megabytes is never held twice.
                None => Payload::moved_from(whole, range)
                    .map_err(|err| UpstreamError::Protocol(format!("the server's result could not be read: {err}"))),
            };
            if !self.pending.resolve(id, payload) {
                debug!(process_id = %self.label, id, "response for no pending request");
            }
            return;
        }
        let line = whole.trim();
        if line.is_empty() {
            return;
        }
        let messages = match protocol::decode_frame(line.as_bytes()) {
            Ok((messages, _)) => messages,
            Err(FrameError::EmptyBatch) => return,
            Err(FrameError::Json(err)) => {
                if self.admit_junk() {
                    warn!(process_id = %self.label, error = %err, line = %preview(&crate::secrets::hide(line, &self.secrets), 200), "invalid json line from mcp server, skipped");
                }
                return;
            }
        };
        for message in messages {
            self.on_message(message).await;
        }
    }

    async fn on_message(&mut self, value: Value) {
        let message = match Message::from_value(value) {
            Ok(message) => message,
            Err(err) => {
                if self.admit_junk() {
                    warn!(process_id = %self.label, error = %err, "malformed json-rpc message from mcp server, skipped");
                }
                return;
            }
        };
        match message {
            Message::Response { id: RequestId::Number(id), outcome: result } => {
                if !self.pending.resolve(id, outcome(result)) {
                    debug!(process_id = %self.label, id, "response for no pending request");
                }
            }
            Message::Response { id, .. } => debug!(process_id = %self.label, %id, "response with foreign id ignored"),
            Message::Request { id, method, params } => self.on_request(id, method, params),
            Message::Notification { method, params } => self.on_notification(method, params),
        }
    }

    /// A request of the child's: asked of the client of a call of ours under way, else of the instance's owner's
    /// clients (refused at once when too many of those wait already); answered without holding up this loop.
    fn on_request(&mut self, id: RequestId, method: String, params: Option<Value>) {
        let busy = self.outside.len() >= MAX_OUTSIDE_ASKS;
        match self.relays.newest() {
            // A client is waiting on one of our requests: it answers, without holding up this loop.
            Some((relay, ours)) => {
                let replies = self.replies.clone();
                self.asks.spawn(Some(id.clone()), async move {
                    let reply = match relay.ask_as(&method, params, ASK_TIMEOUT, ours).await {
                        Ok(result) => protocol::response(id, result),
                        Err(err) => protocol::error_response(Some(id), err),
                    };
                    let _ = replies.send(reply.to_string()).await;
                });
            }
            // Outside any call: the clients of the instance's owner that hold a stream open for it.
            None if busy => self.refuse_busy(id, &method),
            None => {
                debug!(process_id = %self.label, method = %method, "request from mcp server outside any call");
                let (replies, asker) = (self.replies.clone(), self.asker.clone());
                self.outside.spawn(Some(id.clone()), async move {
                    let reply = match answer_outside(asker.as_ref(), &method, params).await {
                        Ok(result) => protocol::response(id, result),
                        Err(err) => protocol::error_response(Some(id), err),
                    };
                    let _ = replies.send(reply.to_string()).await;
                });
            }
        }
    }

    /// Refuse a request the child made outside any call, too many of those waiting already.
    fn refuse_busy(&mut self, id: RequestId, method: &str) {
        debug!(process_id = %self.label, method = %method, "too many server requests waiting, refused");
        let reply = protocol::error_response(Some(id), too_many_asks()).to_string();
        // Queued without waiting: the owner must go on reading stdout whatever stdin's queue holds.
        if let Err(mpsc::error::TrySendError::Full(reply)) = self.replies.try_send(reply) {
            let replies = self.replies.clone();
            self.asks.spawn(None, async move {
                let _ = replies.send(reply).await;
            });
        }
    }

    /// A notification of the child's: to the client of the call it is about, else to the announcements' listeners.
    fn on_notification(&mut self, method: String, params: Option<Value>) {
        debug!(process_id = %self.label, method = %method, "notification from mcp server");
        // The server no longer waits for one of its requests: its client is asked no more.
        if method == "notifications/cancelled"
            && (self.asks.withdraw(params.as_ref()) || self.outside.withdraw(params.as_ref()))
        {
            return;
        }
        if let Err(params) = self.relays.deliver(&method, params) {
            let _ = self.notifications.send(std::sync::Arc::new(protocol::notification(&method, params)));
        }
    }

    fn on_stderr_line(&mut self, line: String) {
        let line = line.trim_end();
        if line.is_empty() {
            return;
        }
        let kept = match self.limiter.admit(line, std::time::Instant::now()) {
            Verdict::Keep(kept) => kept,
            Verdict::Drop => return,
            Verdict::DropAndWarn { dropped } => {
                warn!(process_id = %self.label, dropped, "mcp server stderr over its rate limit, lines dropped");
                self.stderr_warnings.unreported.fetch_add(dropped, Ordering::AcqRel);
                self.stderr_warnings.notify.notify_one();
                return;
            }
        };
        let kept = crate::secrets::hide(&kept, &self.secrets);
        debug!(process_id = %self.label, line = %kept, "mcp server stderr");
        if let Some(sink) = &self.stderr_sink {
            (sink.0)(&kept);
        }
        let mut buf = self.stderr_buf.lock();
        if buf.len() == STDERR_LINES_KEPT {
            buf.pop_front();
        }
        buf.push_back(kept);
    }
}

/// Resolves when `timer` fires; never without one.
async fn until(timer: &mut Option<Pin<Box<Sleep>>>) {
    match timer {
        Some(timer) => timer.as_mut().await,
        None => std::future::pending().await,
    }
}
