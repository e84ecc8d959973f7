//! A connection's wakes of itself, folded into the poll that caused them.
//!
//! hyper serves an HTTP/1.1 request from one task: it parses the head, polls the service, which asks for the body
//! and waits on hyper's body channel, then reads the body from the same buffer, sends it down that channel, and
//! polls the service again, all in one poll of the connection. Sending the body wakes the task that is running.
//! tokio treats a task woken during its own poll as one that yielded: it queues it again and wakes a parked worker
//! to share the queue. So every request made alone cost a futex wake of the other worker, which found nothing to
//! do and parked again: two futex calls and one to two context switches per call (docs/performance-history.md,
//! 2026-11-28 17:10).
//!
//! [`Coalesced`] polls the connection with a waker of its own. A wake that comes while the connection is being
//! polled is remembered instead of passed on; if one came, the connection is polled once more at once, and only
//! a wake still pending after that goes to the task (so a connection that keeps waking itself, as hyper does to
//! yield after a long run of work, still yields). Wakes that come between polls go straight to the task.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

/// How many times a poll that woke its own task is repeated before the wake is passed on to the scheduler.
const REPOLLS: usize = 1;

/// `inner`, with the wakes it gives itself while polled folded into its poll (module docs).
pub struct Coalesced<F> {
    inner: Pin<Box<F>>,
    state: Arc<WakeState>,
    waker: Waker,
}

struct WakeState {
    /// Set while `inner` is being polled: a wake then is remembered, not passed on.
    polling: AtomicBool,
    /// A wake came since the last poll began.
    woken: AtomicBool,
    /// The task's own waker, for wakes between polls.
    task: AtomicWaker,
}

impl Wake for WakeState {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Recorded before `polling` is read: if the poll has just ended, either this sees `polling` false and wakes
        // the task, or the poll's end sees `woken` and polls again. Never neither.
        self.woken.store(true, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

impl<F: Future> Coalesced<F> {
    pub fn new(inner: F) -> Self {
        let state = Arc::new(WakeState {
            polling: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            task: AtomicWaker::new(),
        });
        // One waker for the connection's life: what hyper and tokio's I/O driver keep of it stays the same waker
        // (`Waker::will_wake`), so they do not clone it again on every poll.
        let waker = Waker::from(state.clone());
        Coalesced { inner: Box::pin(inner), state, waker }
    }

    /// The wrapped future, to act on it between polls (a connection's graceful shutdown).
    pub fn inner_mut(&mut self) -> Pin<&mut F> {
        self.inner.as_mut()
    }
}

impl<F: Future> Future for Coalesced<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        this.state.task.register(cx.waker());
        let mut repolls = 0;
        loop {
            this.state.woken.store(false, Ordering::SeqCst);
            this.state.polling.store(true, Ordering::SeqCst);
            let polled = this.inner.as_mut().poll(&mut Context::from_waker(&this.waker));
            this.state.polling.store(false, Ordering::SeqCst);
            if polled.is_ready() {
                return polled;
            }
            if !this.state.woken.load(Ordering::SeqCst) {
                return Poll::Pending;
            }
            if repolls == REPOLLS {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            repolls += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts the wakes the task gets.
    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn task() -> (Arc<Counter>, Waker) {
        let counter = Arc::new(Counter(AtomicUsize::new(0)));
        (counter.clone(), Waker::from(counter))
    }

    /// Wakes itself `times` times, one per poll, then completes on the poll after the last wake: hyper sending a
    /// request's body to the service it polls next.
    struct WakesItself {
        times: usize,
        polls: usize,
    }

    impl Future for WakesItself {
        type Output = usize;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            if self.polls > self.times {
                return Poll::Ready(self.polls);
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    #[test]
    fn a_wake_during_the_poll_is_a_second_poll_not_a_wake_of_the_task() {
        let (woken, waker) = task();
        let mut future = Coalesced::new(WakesItself { times: 1, polls: 0 });
        let polled = Pin::new(&mut future).poll(&mut Context::from_waker(&waker));
        assert_eq!(polled, Poll::Ready(2), "polled again at once");
        assert_eq!(woken.0.load(Ordering::SeqCst), 0, "the scheduler was not asked");
    }

    #[test]
    fn a_future_that_keeps_waking_itself_still_yields_to_the_scheduler() {
        let (woken, waker) = task();
        let mut future = Coalesced::new(WakesItself { times: 100, polls: 0 });
        let mut cx = Context::from_waker(&waker);
        assert_eq!(Pin::new(&mut future).poll(&mut cx), Poll::Pending);
        assert_eq!(woken.0.load(Ordering::SeqCst), 1, "the last wake is passed on");
        assert_eq!(future.inner.polls, REPOLLS + 1);
    }

    /// Pending until another thread sets `ready` and wakes it.
    struct Flag {
        ready: Arc<AtomicBool>,
        wakers: std::sync::mpsc::Sender<Waker>,
    }

    impl Future for Flag {
        type Output = ();

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            if self.ready.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            let _ = self.wakers.send(cx.waker().clone());
            Poll::Pending
        }
    }

    #[test]
    fn a_wake_between_polls_reaches_the_task() {
        let (woken, waker) = task();
        let ready = Arc::new(AtomicBool::new(false));
        let (wakers, kept) = std::sync::mpsc::channel();
        let mut future = Coalesced::new(Flag { ready: ready.clone(), wakers });
        let mut cx = Context::from_waker(&waker);
        assert_eq!(Pin::new(&mut future).poll(&mut cx), Poll::Pending);
        let inner = kept.recv().expect("the future kept a waker");
        std::thread::spawn(move || {
            ready.store(true, Ordering::SeqCst);
            inner.wake();
        })
        .join()
        .expect("the waking thread");
        assert_eq!(woken.0.load(Ordering::SeqCst), 1, "the task is woken");
        assert_eq!(Pin::new(&mut future).poll(&mut cx), Poll::Ready(()));
    }

    #[test]
    fn the_waker_handed_to_the_connection_stays_the_same_across_polls() {
        let (_, waker) = task();
        let (wakers, kept) = std::sync::mpsc::channel();
        let mut future = Coalesced::new(Flag { ready: Arc::new(AtomicBool::new(false)), wakers });
        let mut cx = Context::from_waker(&waker);
        for _ in 0..2 {
            assert_eq!(Pin::new(&mut future).poll(&mut cx), Poll::Pending);
        }
        let (first, second) = (kept.recv().expect("first"), kept.recv().expect("second"));
        assert!(first.will_wake(&second));
    }
}
