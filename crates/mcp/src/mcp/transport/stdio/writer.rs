//! The task that writes to a stdio child's stdin, apart from the owner so that a full pipe never stops the
//! reading of stdout.

use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::process::ChildStdin;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::mcp::transport::Pending;

/// Bytes gathered from the outbound queue into one write to stdin, at most (a longer message goes whole).
const WRITE_BATCH_BYTES: usize = 32 * 1024;

/// The task that writes to the child's stdin: what callers queue, gathered into few writes. It is not the owner,
/// so that a write waiting on a full pipe never stops the owner reading stdout. Were they one task, a child that
/// writes a long answer before it reads on (as a plain synchronous server does) while a long request is being
/// written to it would wait on its full stdout for the satellite, and the satellite on its full stdin for the
/// child, both for ever.
pub(super) struct Writer {
    pub(super) label: String,
    pub(super) stdin: ChildStdin,
    pub(super) outbound: mpsc::Receiver<String>,
    pub(super) pending: Arc<Pending>,
    /// Cancelled when the child is stopped or gone: stdin is closed then, even in the middle of a write.
    pub(super) close: CancellationToken,
    /// Cancelled when the owner has ended (after publishing the child's exit).
    pub(super) owner_done: CancellationToken,
    /// Messages the last write to stdin carried: more than one says calls arrive together.
    pub(super) last_batch: usize,
}

impl Writer {
    /// Write until the child is stopped or gone, or a write fails; stdin closes when this returns.
    pub(super) async fn run(mut self) {
        self.write_until_closed().await;
        // Stdin closes now. The queue is held until the owner has said how the child ended: a request made
        // meanwhile is queued and its waiter failed with that exit, not refused as if nothing had ever run.
        let Writer { stdin, outbound, owner_done, .. } = self;
        drop(stdin);
        owner_done.cancelled().await;
        drop(outbound);
    }

    async fn write_until_closed(&mut self) {
        loop {
            let first = tokio::select! {
                biased;
                _ = self.close.cancelled() => return,
                line = self.outbound.recv() => match line {
                    Some(line) => line,
                    None => return,
                },
            };
            if !self.write_queued(first).await {
                return;
            }
        }
    }

    /// Write `first` and whatever else is queued for stdin by now, in one write: under load, calls that arrive
    /// together cost the child one read and us one system call instead of one each.
    ///
    /// The owner first lets the tasks that are ready to run go ahead (one `yield_now`): a call's sender wakes the
    /// owner as soon as it queues, so without it the owner wrote each call alone while the other connections'
    /// requests, read in the same wake-up, waited behind it. At concurrency 32 that was 0.67 writes to stdin per
    /// call, and each woke the child; with it, 0.14 (docs/performance-history.md, 2026-11-28). With nothing else ready
    /// the owner runs again at once.
    ///
    /// It yields only when calls come together (another request in flight, or the last write carried several):
    /// a lone call has nothing to wait for, and a yield is not free. The scheduler wakes a parked worker thread
    /// to share a yielding task's queue, so each call made one at a time woke the other worker for nothing (a
    /// futex wake and a context switch per call at concurrency 1; docs/performance-history.md, 2026-11-28 11:30).
    async fn write_queued(&mut self, first: String) -> bool {
        if self.last_batch > 1 || self.pending.len() > 1 {
            tokio::task::yield_now().await;
        }
        let mut batch = first.into_bytes();
        batch.push(b'\n');
        self.last_batch = 1;
        while batch.len() < WRITE_BATCH_BYTES {
            let Ok(line) = self.outbound.try_recv() else { break };
            batch.extend_from_slice(line.as_bytes());
            batch.push(b'\n');
            self.last_batch += 1;
        }
        let stdin = &mut self.stdin;
        let write = async {
            stdin.write_all(&batch).await?;
            stdin.flush().await
        };
        // A child that stops reading leaves this write waiting on a full pipe: stopping it must still work.
        let result = tokio::select! {
            result = write => result,
            _ = self.close.cancelled() => Err(std::io::Error::other("stopped while the child was not reading stdin")),
        };
        if let Err(err) = result {
            // The child is going away (its exit fails the waiters), or is being stopped: a write cut short leaves
            // half a message in the pipe, so nothing more is written.
            debug!(process_id = %self.label, error = %err, "writing to stdin failed");
            return false;
        }
        true
    }
}
