//! stdio transport: one task owns the child process.
//!
//! The owner task holds stdin, reads stdout line by line into JSON-RPC
//! messages, matches responses to waiters by id, answers the child's own
//! requests (`ping`, `roots/list`), keeps stderr in a bounded buffer, and when
//! the child exits fails every waiter with a typed error. Closing sends EOF on
//! stdin, then SIGTERM to the child's process group, then SIGKILL;
//! `kill_on_drop` is only the last line of defence.

use std::collections::{BTreeMap, VecDeque};
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::prctl::set_pdeathsig;
use nix::sys::resource::{getrlimit, setrlimit, Resource};
use nix::sys::signal::Signal;
use nix::unistd::{getpid, getppid, Pid};
use parking_lot::Mutex;
use serde_json::Value;
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;
use tracing::debug;

mod cgroup;
pub mod lines;
pub use cgroup::prepare as prepare_cpu_limits;
mod owner;
pub mod reaper;
mod writer;

use super::in_flight::{InFlight, Withdraw};
use super::junk::{JunkLimiter, JunkSettings};
use super::relays;
use super::stderr::{StderrLimiter, StderrSettings};
use super::{await_response, Pending, Relay, UpstreamError};
use crate::mcp::payload::Payload;
use crate::mcp::protocol::{self, RequestId};
use lines::Lines;
use owner::Owner;
use writer::Writer;

/// Longest stdout line accepted (a large `tools/list` result fits easily).
pub(crate) const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
/// Lines queued for the child's stdin before senders wait.
const OUTBOUND_CAPACITY: usize = 256;
/// stderr lines kept per instance for the debug route and error messages.
pub const STDERR_LINES_KEPT: usize = 200;
/// The first size of each child's read buffers (tokio-util's default is 8 KiB each); they grow to fit what the
/// server sends. Every instance holds both, idle or not: 16 KiB of the ~100 KiB of heap an idle stdio instance
/// held (heaptrack, 21 demo instances against 1), for answers that are mostly a few hundred bytes.
const STDOUT_BUFFER: usize = 2 * 1024;
const STDERR_BUFFER: usize = 256;
/// Longest stderr line read at all; longer ones are skipped whole (kept lines are cut shorter by the limiter).
const STDERR_READ_MAX_BYTES: usize = 64 * 1024;
const NOTIFICATION_CAPACITY: usize = 64;

/// Receives every stderr line the rate limiter keeps (already cut to length), e.g. for log capture.
#[derive(Clone)]
pub struct StderrSink(pub Arc<dyn Fn(&str) + Send + Sync>);

impl std::fmt::Debug for StderrSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StderrSink")
    }
}

/// What to start: the instance's final command, arguments and environment.
#[derive(Debug, Clone)]
pub struct StdioLaunch {
    /// Label for logs and errors: the instance's process id.
    pub label: String,
    pub command: String,
    pub args: Vec<String>,
    /// The complete environment of the child; nothing else is inherited.
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    /// How long to wait after closing stdin before signalling.
    pub close_grace: Duration,
    /// Rate limit and line cap of stderr capture.
    pub stderr: StderrSettings,
    /// Where kept stderr lines go besides the tail buffer and the debug log.
    pub stderr_sink: Option<StderrSink>,
    /// How much of what the child writes on stdout that is not JSON-RPC is logged.
    pub junk: JunkSettings,
    /// Counts those lines, logged or not (the instance's series of `satellite_stdio_junk_lines_total`).
    pub junk_lines: Option<crate::metrics::Counter>,
    /// Resource limits set in the child before it executes `command`.
    pub limits: ResourceLimits,
    /// Secret values of the instance (`secrets::secret_values`): masked in everything kept of what the child
    /// prints (a server may print its own key), before it reaches a log, a status, an event or the debug route.
    pub secrets: Vec<String>,
    /// Where the child's requests made outside any call of ours go (none: answered as a client without the
    /// capability would).
    pub asker: Option<super::relay::Asker>,
}

/// rlimits for a child, soft and hard alike; `None` leaves the inherited limit. A limit is never raised above
/// the satellite's own hard limit (it is clamped instead), so a generous setting cannot make a spawn fail.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResourceLimits {
    /// RLIMIT_AS: virtual address space, bytes.
    pub address_space_bytes: Option<u64>,
    /// RLIMIT_CPU: CPU time over the process's life, seconds.
    pub cpu_seconds: Option<u64>,
    /// RLIMIT_NPROC: processes and threads of the child's real uid (counted per uid, not per child).
    pub processes: Option<u64>,
    /// RLIMIT_NOFILE: open file descriptors.
    pub open_files: Option<u64>,
    /// RLIMIT_FSIZE: largest file the child may write, bytes.
    pub file_size_bytes: Option<u64>,
    /// Not an rlimit: a CPU rate limit, percent of one core, through the child's own cgroup where one can be made.
    pub cpu_percent: Option<u32>,
}

impl ResourceLimits {
    /// The limits that are set, as (resource, value) pairs.
    fn pairs(&self) -> [(Resource, Option<u64>); 5] {
        [
            (Resource::RLIMIT_AS, self.address_space_bytes),
            (Resource::RLIMIT_CPU, self.cpu_seconds),
            (Resource::RLIMIT_NPROC, self.processes),
            (Resource::RLIMIT_NOFILE, self.open_files),
            (Resource::RLIMIT_FSIZE, self.file_size_bytes),
        ]
    }
}

/// Runs in the forked child between `fork` and `exec`: only async-signal-safe system calls, no allocation, no
/// locks. The parent-death signal comes first so that a satellite dying at any later point takes the child along.
fn in_child(parent: Pid, limits: &ResourceLimits) -> std::io::Result<()> {
    // PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the process. Spawns happen in
    // async tasks, on tokio worker threads, which live as long as the runtime, i.e. the satellite. Never spawn
    // from `spawn_blocking`: idle blocking-pool threads exit after a while and would take the child along.
    set_pdeathsig(Signal::SIGKILL)?;
    // The parent may have died between fork and prctl; the signal would then never come. Checking the parent
    // after setting it closes the race: either it is still our parent (and the signal is armed) or we leave.
    if getppid() != parent {
        // SAFETY: _exit is async-signal-safe and never returns; nothing of the parent's state is touched.
        unsafe { nix::libc::_exit(1) };
    }
    for (resource, value) in limits.pairs() {
        let Some(value) = value else { continue };
        let (_, hard) = getrlimit(resource)?;
        let value = value.min(hard);
        setrlimit(resource, value, value)?;
    }
    Ok(())
}

/// stderr lines dropped by the rate limiter and not yet reported; `notify` keeps a permit when nobody waits.
#[derive(Debug, Default)]
struct DropReport {
    unreported: AtomicU64,
    notify: tokio::sync::Notify,
}

/// The bounded buffer of a child's last stderr lines.
#[derive(Debug, Clone)]
pub struct StderrTail(Arc<Mutex<VecDeque<String>>>);

impl StderrTail {
    /// Oldest first.
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().iter().cloned().collect()
    }
}

/// How the child ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitInfo {
    /// The satellite asked it to stop.
    Stopped,
    /// It exited on its own (a crash from the supervisor's point of view).
    Exited { code: Option<i32>, signal: Option<i32> },
}

impl ExitInfo {
    fn from_status(status: ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        ExitInfo::Exited { code: status.code(), signal: status.signal() }
    }

    pub fn describe(&self) -> String {
        match self {
            ExitInfo::Stopped => "process stopped".into(),
            ExitInfo::Exited { code: Some(code), .. } => format!("child process has died (exit code {code})"),
            ExitInfo::Exited { signal: Some(sig), .. } => format!("child process has died (signal {sig})"),
            ExitInfo::Exited { .. } => "child process has died".into(),
        }
    }
}

/// A child just spawned: its pipes, its pid (the id of its process group too), and the cgroup that limits it.
struct Started {
    child: Child,
    pid: Option<u32>,
    stdin: ChildStdin,
    stdout: ChildStdout,
    stderr: ChildStderr,
    cpu_group: Option<cgroup::CpuGroup>,
}

impl Started {
    /// Spawn `launch`'s command in its own process group, limited as it says, with the watchdog told.
    fn of(launch: &StdioLaunch) -> Result<Self, UpstreamError> {
        let mut cpu_group = launch.limits.cpu_percent.and_then(cgroup::CpuGroup::create);
        let join_fd = cpu_group.as_ref().and_then(cgroup::CpuGroup::join_fd);
        let mut child = command(launch, join_fd).spawn().map_err(|err| UpstreamError::spawn(&launch.command, &err))?;
        if let Some(group) = cpu_group.as_mut() {
            group.spawned();
        }
        let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(UpstreamError::Io("child pipes unavailable".into()));
        };
        let pid = child.id();
        if let Some(pid) = pid {
            // The child leads its own group: the watchdog kills it all if the satellite dies.
            reaper::register(pid);
        }
        debug!(process_id = %launch.label, pid, command = %launch.command, "mcp server process spawned");
        Ok(Self { child, pid, stdin, stdout, stderr, cpu_group })
    }
}

/// The command that starts `launch`: its own environment only, piped, in a process group of its own, limited in the
/// child before it executes (and moved into the cgroup `join_fd` opens, if any).
fn command(launch: &StdioLaunch, join_fd: Option<RawFd>) -> Command {
    let mut command = Command::new(&launch.command);
    command
        .args(&launch.args)
        .env_clear()
        .envs(&launch.env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(cwd) = &launch.cwd {
        command.current_dir(cwd);
    }
    let parent = getpid();
    let limits = launch.limits;
    // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe functions may be
    // called. `in_child` makes only raw system calls (prctl, getppid, getrlimit, setrlimit, _exit) through
    // nix, which neither allocate nor lock; `parent` and `limits` are Copy values captured before the fork,
    // and the io::Error built from an errno does not allocate.
    unsafe {
        command.pre_exec(move || {
            in_child(parent, &limits)?;
            if let Some(fd) = join_fd {
                // Best effort, like the group itself: a child that cannot join runs unlimited.
                let _ = cgroup::join_in_child(fd);
            }
            Ok(())
        });
    }
    command
}

/// A running stdio MCP server.
#[derive(Debug)]
pub struct StdioTransport {
    label: String,
    pid: Option<u32>,
    next_id: AtomicI64,
    pending: Arc<Pending>,
    outbound: mpsc::Sender<String>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    notifications: broadcast::Sender<crate::mcp::transport::Announcement>,
    stderr_warnings: Arc<DropReport>,
    exit_rx: watch::Receiver<Option<ExitInfo>>,
    stop: CancellationToken,
    /// Our requests with a client to relay to.
    relays: Arc<relays::Relays>,
}

impl StdioTransport {
    /// Spawn the child and start its owner task. The MCP handshake is the caller's.
    pub fn spawn(launch: StdioLaunch) -> Result<Self, UpstreamError> {
        let started = Started::of(&launch)?;
        let (outbound_tx, outbound_rx) = mpsc::channel(OUTBOUND_CAPACITY);
        let (exit_tx, exit_rx) = watch::channel(None);
        let transport = Self {
            label: launch.label.clone(),
            pid: started.pid,
            next_id: AtomicI64::new(1),
            pending: Arc::new(Pending::default()),
            outbound: outbound_tx,
            // Grows as the server writes (most write little), up to STDERR_LINES_KEPT lines.
            stderr: Arc::new(Mutex::new(VecDeque::new())),
            notifications: broadcast::channel(NOTIFICATION_CAPACITY).0,
            stderr_warnings: Arc::new(DropReport::default()),
            exit_rx,
            stop: CancellationToken::new(),
            relays: Arc::new(relays::Relays::default()),
        };
        transport.start_tasks(launch, started, outbound_rx, exit_tx);
        Ok(transport)
    }

    /// Start the tasks that own the child: the writer of its stdin, and the owner of everything else.
    fn start_tasks(
        &self,
        launch: StdioLaunch,
        started: Started,
        outbound: mpsc::Receiver<String>,
        exit_tx: watch::Sender<Option<ExitInfo>>,
    ) {
        let close_stdin = self.stop.child_token();
        let owner_done = CancellationToken::new();
        let writer = Writer {
            owner_done: owner_done.clone(),
            label: launch.label.clone(),
            stdin: started.stdin,
            outbound,
            pending: self.pending.clone(),
            close: close_stdin.clone(),
            last_batch: 0,
        };
        tokio::spawn(writer.run());
        let owner = Owner {
            label: launch.label,
            pgid: started.pid.map(|p| Pid::from_raw(p as i32)),
            child: started.child,
            close_stdin,
            _done: owner_done.drop_guard(),
            stdout: FramedRead::with_capacity(started.stdout, Lines::new(MAX_LINE_BYTES), STDOUT_BUFFER),
            stderr: FramedRead::with_capacity(started.stderr, Lines::unscanned(STDERR_READ_MAX_BYTES), STDERR_BUFFER),
            limiter: StderrLimiter::new(launch.stderr),
            stderr_sink: launch.stderr_sink,
            junk: JunkLimiter::new(launch.junk),
            junk_lines: launch.junk_lines,
            stderr_warnings: self.stderr_warnings.clone(),
            replies: self.outbound.clone(),
            relays: self.relays.clone(),
            asker: launch.asker,
            asks: Default::default(),
            outside: Default::default(),
            pending: self.pending.clone(),
            stderr_buf: self.stderr.clone(),
            notifications: self.notifications.clone(),
            exit_tx,
            stop: self.stop.clone(),
            close_grace: launch.close_grace,
            secrets: launch.secrets,
            _cpu_group: started.cpu_group,
        };
        tokio::spawn(owner.run());
    }

    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    pub fn is_alive(&self) -> bool {
        self.exit_rx.borrow().is_none()
    }

    /// How the child ended, once it has.
    pub fn exit_info(&self) -> Option<ExitInfo> {
        self.exit_rx.borrow().clone()
    }

    /// Resolves when the child has exited, for whatever reason.
    pub async fn exited(&self) -> ExitInfo {
        let mut rx = self.exit_rx.clone();
        loop {
            if let Some(info) = rx.borrow_and_update().clone() {
                return info;
            }
            if rx.changed().await.is_err() {
                return ExitInfo::Stopped;
            }
        }
    }

    /// The last stderr lines, oldest first.
    pub fn stderr_tail(&self) -> Vec<String> {
        self.stderr_handle().lines()
    }

    /// A handle on the stderr buffer that outlives the transport.
    pub fn stderr_handle(&self) -> StderrTail {
        StderrTail(self.stderr.clone())
    }

    /// Notifications the child sends (list changes, logs, progress).
    /// Pass `note` to the announcements' listeners as if the server had sent it outside any request.
    pub fn announce(&self, note: crate::mcp::transport::Announcement) {
        let _ = self.notifications.send(note);
    }

    pub fn subscribe(&self) -> broadcast::Receiver<crate::mcp::transport::Announcement> {
        self.notifications.subscribe()
    }

    /// Drop counts the stderr rate limiter reports, at most one per warning interval.
    ///
    /// Resolves with the lines dropped since the last report; a warning raised before anyone waits is kept.
    pub async fn stderr_dropped(&self) -> u64 {
        loop {
            self.stderr_warnings.notify.notified().await;
            let dropped = self.stderr_warnings.unreported.swap(0, Ordering::AcqRel);
            if dropped > 0 {
                return dropped;
            }
        }
    }

    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Send a request and wait for its response. With a `relay`, what the child sends while it runs (progress
    /// under the caller's token, log messages, requests to the client) goes to the relay. A request that ends
    /// without its response (timed out, or the caller gave up) is cancelled with `notifications/cancelled`.
    pub async fn request(
        &self,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
        relay: Option<&Relay>,
    ) -> Result<Payload, UpstreamError> {
        if let Some(info) = self.exit_info() {
            return Err(UpstreamError::Exited { label: self.label.clone(), exit: info, detail: None });
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let rx = self.pending.register(id)?;
        let mut params = params;
        if let Some(relay) = relay {
            let token = relays::take_progress_token(&mut params, id);
            self.relays.add(id, relay.clone(), token);
        }
        let mut in_flight = InFlight::new(self, id, method);
        let line = protocol::request_line(&RequestId::Number(id), method, params.as_ref());
        if self.outbound.send(line).await.is_err() {
            in_flight.answered = true;
            self.pending.forget(id);
            return Err(UpstreamError::Closed(format!("process {} is not running", self.label)));
        }
        let outcome = await_response(&self.pending, id, rx, method, timeout).await;
        in_flight.answered = !matches!(outcome, Err(UpstreamError::Timeout { .. }));
        outcome
    }

    pub async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), UpstreamError> {
        let line = protocol::notification_line(method, params.as_ref());
        self.outbound
            .send(line)
            .await
            .map_err(|_| UpstreamError::Closed(format!("process {} is not running", self.label)))
    }

    /// Stop the child and wait until it is gone.
    pub async fn close(&self) {
        self.stop.cancel();
        self.exited().await;
    }
}

/// A request of ours to the child: its relay goes when it ends; unanswered, it is forgotten and the child told on
/// stdin to stop working on it.
impl Withdraw for &StdioTransport {
    fn ended(&self, id: i64) {
        self.relays.remove(id);
    }

    fn abandoned(&self, id: i64, notice: Option<Value>) {
        self.pending.forget(id);
        if let Some(notice) = notice {
            let _ = self.outbound.try_send(notice.to_string());
        }
    }
}

impl Drop for StdioTransport {
    fn drop(&mut self) {
        // The owner task notices and stops the child; kill_on_drop covers a dropped runtime.
        self.stop.cancel();
    }
}
