//! A coarse timer for the deadlines every request carries and almost none reaches.
//!
//! Two deadlines guard every request: hyper's for reading the next request head (a client
//! that connects and sends nothing, or a head byte by byte, is cut off), and a write's stall
//! bound (`write_stall_timeout_ms`). On tokio's timer each costs a clock read, an insert into
//! the timer wheel under its lock and a removal on completion: callgrind counted about 2,700
//! instructions per append for the two, 8 % of the user-space cost of a durable append.
//!
//! Here a deadline is a millisecond count on a clock that a sweeper task advances every
//! [`GRANULARITY`]. A sleep that is polled before its deadline takes a slot in a slab (one
//! short lock, shared by the runtime's workers) and gives it back when it completes or is
//! dropped; the sweeper wakes the slots whose deadline passed. Reading the clock is an atomic
//! load. The price is precision: a deadline fires up to a granularity after the clock passes
//! it, and the clock lags real time by up to a granularity (more while the runtime is too busy
//! to run the sweeper), so a deadline taken from [`CoarseTimer::now`] may come that much early
//! in real time. Fine for bounds of seconds, not for anything that needs milliseconds.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use slab::Slab;

/// How often the clock advances and expired sleeps are woken.
pub const GRANULARITY: Duration = Duration::from_millis(100);

struct Slot {
    deadline_ms: u64,
    waker: Waker,
}

struct Inner {
    base: Instant,
    /// Milliseconds since `base`, as of the sweeper's last tick.
    now_ms: AtomicU64,
    slots: Mutex<Slab<Slot>>,
    sweeping: AtomicBool,
}

impl Inner {
    fn slots(&self) -> MutexGuard<'_, Slab<Slot>> {
        // A panic while the lock is held cannot leave the slab half-changed (every critical
        // section is one slab call), so a poisoned lock is still a good one.
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The clock in milliseconds since `base`: the sweeper's while it runs, real time else.
    fn now_ms(&self) -> u64 {
        if self.sweeping.load(Ordering::Acquire) {
            self.now_ms.load(Ordering::Acquire)
        } else {
            self.base.elapsed().as_millis() as u64
        }
    }

    /// Wakes the sleeps whose deadline is at most `upto`.
    fn wake_due(&self, upto: u64) {
        for (_, slot) in self.slots().iter() {
            if slot.deadline_ms <= upto {
                slot.waker.wake_by_ref();
            }
        }
    }

    fn tick(&self) {
        let now = self.base.elapsed().as_millis() as u64;
        self.now_ms.fetch_max(now, Ordering::Release);
        self.wake_due(now);
    }

    /// See [`CoarseTimer::start`]. On a running sweeper this is one atomic load, cheap enough
    /// for every poll of a waiting sleep.
    fn start(self: &Arc<Self>) {
        if self.sweeping.load(Ordering::Acquire) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // Set the clock before anyone reads it as coarse.
        self.tick();
        if self.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak: Weak<Inner> = Arc::downgrade(self);
        let guard = SweeperGuard(Weak::clone(&weak));
        runtime.spawn(async move {
            let _guard = guard;
            let mut tick = tokio::time::interval(GRANULARITY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match weak.upgrade() {
                    Some(inner) => inner.tick(),
                    None => return,
                }
            }
        });
    }
}

/// A cheap, coarse clock and its sleeps; clones share them.
#[derive(Clone)]
pub struct CoarseTimer(Arc<Inner>);

impl Default for CoarseTimer {
    fn default() -> Self {
        CoarseTimer(Arc::new(Inner {
            base: Instant::now(),
            now_ms: AtomicU64::new(0),
            slots: Mutex::new(Slab::new()),
            sweeping: AtomicBool::new(false),
        }))
    }
}

impl CoarseTimer {
    /// The coarse clock: behind real time by at most a granularity while the sweeper runs,
    /// real time before it starts.
    pub fn now(&self) -> Instant {
        if !self.0.sweeping.load(Ordering::Acquire) {
            return Instant::now();
        }
        self.0.base + Duration::from_millis(self.0.now_ms.load(Ordering::Acquire))
    }

    /// A sleep until `deadline` (rounded up to the next millisecond).
    pub fn sleep_until(&self, deadline: Instant) -> CoarseSleep {
        let ms = deadline.saturating_duration_since(self.0.base);
        let deadline_ms =
            ms.as_millis() as u64 + u64::from(!ms.subsec_nanos().is_multiple_of(1_000_000));
        CoarseSleep {
            timer: Arc::clone(&self.0),
            deadline_ms,
            slot: None,
        }
    }

    /// A sleep of `d` from the coarse clock's now.
    pub fn sleep(&self, d: Duration) -> CoarseSleep {
        self.sleep_until(self.now() + d)
    }

    /// Starts the sweeper on the current tokio runtime, once (the first sleep that waits
    /// starts it too); outside a runtime it does nothing, and the clock stays real time. The
    /// sweeper holds the timer weakly and ends when the last clone is dropped; if its runtime
    /// shuts down first, the clock turns back to real time and the next sleep that waits
    /// starts a new sweeper.
    pub fn start(&self) {
        self.0.start();
    }
}

/// Marks the sweeper stopped when its task ends or is dropped with its runtime.
struct SweeperGuard(Weak<Inner>);

impl Drop for SweeperGuard {
    fn drop(&mut self) {
        if let Some(inner) = self.0.upgrade() {
            inner.sweeping.store(false, Ordering::Release);
            // Wake every waiting sleep: its next poll starts a new sweeper.
            inner.wake_due(u64::MAX);
        }
    }
}

/// Completes once the coarse clock reaches its deadline.
pub struct CoarseSleep {
    timer: Arc<Inner>,
    deadline_ms: u64,
    slot: Option<usize>,
}

impl CoarseSleep {
    fn expired(&self) -> bool {
        self.timer.now_ms() >= self.deadline_ms
    }

    fn release(&mut self) {
        if let Some(key) = self.slot.take() {
            self.timer.slots().remove(key);
        }
    }
}

impl Future for CoarseSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        if this.expired() {
            this.release();
            return Poll::Ready(());
        }
        // Also after the sweeper's runtime stopped (its guard woke this sleep).
        this.timer.start();
        match this.slot {
            None => {
                let slot = Slot {
                    deadline_ms: this.deadline_ms,
                    waker: cx.waker().clone(),
                };
                this.slot = Some(this.timer.slots().insert(slot));
                // A tick between the check above and the insert did not see this slot.
                if this.expired() {
                    this.release();
                    return Poll::Ready(());
                }
            }
            Some(key) => {
                let mut slots = this.timer.slots();
                if let Some(slot) = slots.get_mut(key)
                    && !slot.waker.will_wake(cx.waker())
                {
                    slot.waker = cx.waker().clone();
                }
            }
        }
        Poll::Pending
    }
}

impl Drop for CoarseSleep {
    fn drop(&mut self) {
        self.release();
    }
}

/// hyper's timer for the request-head deadline, on the coarse clock.
#[derive(Clone)]
pub struct HyperTimer(pub CoarseTimer);

impl hyper::rt::Sleep for CoarseSleep {}

impl hyper::rt::Timer for HyperTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(self.0.sleep(duration))
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(self.0.sleep_until(deadline))
    }

    fn now(&self) -> Instant {
        self.0.now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fut`, or a failure instead of a hang if a wake-up is lost.
    async fn bounded<F: Future>(fut: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(10), fut)
            .await
            .expect("a sleep was never woken")
    }

    #[tokio::test]
    async fn a_sleep_ends_after_its_deadline_and_not_long_after() {
        let timer = CoarseTimer::default();
        timer.start();
        let start = Instant::now();
        bounded(timer.sleep(Duration::from_millis(300))).await;
        let took = start.elapsed();
        // Early by the clock's lag (a granularity), late by a granularity or two; the rest of
        // the upper bound is room for a loaded machine.
        assert!(took >= Duration::from_millis(300) - GRANULARITY, "{took:?}");
        assert!(took <= Duration::from_secs(2), "{took:?}");
    }

    #[test]
    fn a_sleep_completes_when_its_sweeper_stops() {
        let timer = CoarseTimer::default();
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
        };
        // A sleep starts waiting, then the sweeper's runtime shuts down under it.
        let mut sleep = Box::pin(timer.sleep(Duration::from_millis(150)));
        let first = runtime();
        first.block_on(async {
            let waker = futures::task::noop_waker();
            assert!(
                sleep
                    .as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_pending()
            );
        });
        assert!(timer.0.sweeping.load(Ordering::Acquire));
        drop(first);
        assert!(!timer.0.sweeping.load(Ordering::Acquire), "the guard ran");
        // Polled on another runtime, the same sleep starts a new sweeper and ends.
        let second = runtime();
        second.block_on(bounded(sleep.as_mut()));
        assert!(timer.0.sweeping.load(Ordering::Acquire));
    }

    #[tokio::test]
    async fn dropped_and_finished_sleeps_give_their_slot_back() {
        let timer = CoarseTimer::default();
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut pending: Vec<_> = (0..100)
            .map(|_| Box::pin(timer.sleep(Duration::from_secs(60))))
            .collect();
        for s in &mut pending {
            assert!(s.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(timer.0.slots().len(), 100);
        drop(pending);
        assert_eq!(timer.0.slots().len(), 0);
        let mut sleep = Box::pin(timer.sleep(Duration::from_millis(150)));
        bounded(sleep.as_mut()).await;
        assert_eq!(timer.0.slots().len(), 0, "a finished sleep keeps no slot");
        drop(sleep);
    }

    #[tokio::test]
    async fn a_timeout_around_a_pending_future_fires_and_a_ready_one_wins() {
        let timer = CoarseTimer::default();
        let fired = bounded(async {
            tokio::select! {
                biased;
                () = futures::future::pending::<()>() => false,
                () = timer.sleep(Duration::from_millis(200)) => true,
            }
        })
        .await;
        assert!(fired);
        let won = tokio::select! {
            biased;
            () = futures::future::ready(()) => true,
            () = timer.sleep(Duration::from_millis(200)) => false,
        };
        assert!(won);
    }

    #[tokio::test]
    async fn the_clock_is_real_time_until_the_sweeper_runs_then_lags_by_a_tick_at_most() {
        let timer = CoarseTimer::default();
        let before = Instant::now();
        assert!(timer.now() >= before);
        std::thread::sleep(Duration::from_millis(20));
        timer.start();
        // The clock counts whole milliseconds.
        assert!(timer.now() >= before + Duration::from_millis(19));
        let t = timer.now();
        // Between ticks (this runtime's one thread is busy here) the clock stands still.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(timer.now(), t);
    }
}
