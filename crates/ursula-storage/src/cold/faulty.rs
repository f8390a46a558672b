//! A fault-injecting twin of any [`ColdStore`], for tests of what the cold tier does when the
//! store fails: every operation can be made to fail, once or until healed, before it reaches
//! the store (nothing written) or after (written, but the caller is told it failed).

use super::{Body, ColdError, ColdStore, InjectedFault, ObjectInfo, ObjectKey};
use bytes::Bytes;
use futures::future::BoxFuture;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The operations faults can target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Op {
    Put = 0,
    Get = 1,
    GetRange = 2,
    Head = 3,
    Delete = 4,
    List = 5,
    Probe = 6,
}
const OPS: usize = 7;

impl Op {
    fn name(self) -> &'static str {
        ["put", "get", "get_range", "head", "delete", "list", "probe"][self as usize]
    }
}

/// Shared switches of a [`FaultyColdStore`].
#[derive(Debug, Default)]
pub struct Faults {
    /// Every operation fails (an unreachable store) until cleared.
    down: AtomicBool,
    /// Per operation: how many of the next calls fail before reaching the store.
    fail_next: [AtomicU64; OPS],
    /// How many of the next puts reach the store and are then reported failed.
    lose_ack: AtomicU64,
    /// Calls that reached the store, per operation.
    calls: [AtomicU64; OPS],
}

impl Faults {
    /// Makes the store unreachable (`true`) or healthy again (`false`).
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// The next `n` calls of `op` fail with [`ColdError::Unavailable`] without reaching the store.
    pub fn fail_next(&self, op: Op, n: u64) {
        self.fail_next[op as usize].store(n, Ordering::SeqCst);
    }

    /// The next `n` puts are written, then answered with [`ColdError::Unavailable`] (a lost
    /// acknowledgement: the caller must cope with an object it believes it did not write).
    pub fn lose_next_put_acks(&self, n: u64) {
        self.lose_ack.store(n, Ordering::SeqCst);
    }

    /// Calls of `op` that reached the inner store.
    pub fn calls(&self, op: Op) -> u64 {
        self.calls[op as usize].load(Ordering::SeqCst)
    }

    fn take(counter: &AtomicU64) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    fn before(&self, op: Op) -> Result<(), ColdError> {
        if self.down.load(Ordering::SeqCst) || Self::take(&self.fail_next[op as usize]) {
            return Err(injected(op));
        }
        self.calls[op as usize].fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn injected(op: Op) -> ColdError {
    ColdError::Unavailable {
        operation: op.name(),
        source: Box::new(InjectedFault),
    }
}

/// Wraps `inner`; faults are switched through [`FaultyColdStore::faults`].
#[derive(Debug, Clone)]
pub struct FaultyColdStore {
    inner: Arc<dyn ColdStore>,
    faults: Arc<Faults>,
}

impl FaultyColdStore {
    pub fn new(inner: Arc<dyn ColdStore>) -> Self {
        FaultyColdStore {
            inner,
            faults: Arc::default(),
        }
    }

    pub fn faults(&self) -> Arc<Faults> {
        Arc::clone(&self.faults)
    }
}

impl FaultyColdStore {
    fn put<'a>(
        &'a self,
        key: &'a ObjectKey,
        body: Body,
        paced: bool,
    ) -> BoxFuture<'a, Result<(), ColdError>> {
        Box::pin(async move {
            self.faults.before(Op::Put)?;
            if paced {
                self.inner.put_if_absent_paced(key, body).await?;
            } else {
                self.inner.put_if_absent(key, body).await?;
            }
            if Faults::take(&self.faults.lose_ack) {
                return Err(injected(Op::Put));
            }
            Ok(())
        })
    }
}

impl ColdStore for FaultyColdStore {
    fn put_if_absent<'a>(
        &'a self,
        key: &'a ObjectKey,
        body: Body,
    ) -> BoxFuture<'a, Result<(), ColdError>> {
        self.put(key, body, false)
    }

    fn put_if_absent_paced<'a>(
        &'a self,
        key: &'a ObjectKey,
        body: Body,
    ) -> BoxFuture<'a, Result<(), ColdError>> {
        self.put(key, body, true)
    }

    fn get<'a>(&'a self, key: &'a ObjectKey) -> BoxFuture<'a, Result<Bytes, ColdError>> {
        Box::pin(async move {
            self.faults.before(Op::Get)?;
            self.inner.get(key).await
        })
    }

    fn get_range<'a>(
        &'a self,
        key: &'a ObjectKey,
        range: Range<u64>,
    ) -> BoxFuture<'a, Result<Bytes, ColdError>> {
        Box::pin(async move {
            self.faults.before(Op::GetRange)?;
            self.inner.get_range(key, range).await
        })
    }

    fn head<'a>(&'a self, key: &'a ObjectKey) -> BoxFuture<'a, Result<ObjectInfo, ColdError>> {
        Box::pin(async move {
            self.faults.before(Op::Head)?;
            self.inner.head(key).await
        })
    }

    fn delete<'a>(&'a self, key: &'a ObjectKey) -> BoxFuture<'a, Result<(), ColdError>> {
        Box::pin(async move {
            self.faults.before(Op::Delete)?;
            self.inner.delete(key).await
        })
    }

    fn list<'a>(
        &'a self,
        prefix: &'a ObjectKey,
    ) -> BoxFuture<'a, Result<Vec<ObjectInfo>, ColdError>> {
        Box::pin(async move {
            self.faults.before(Op::List)?;
            self.inner.list(prefix).await
        })
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), ColdError>> {
        Box::pin(async move {
            self.faults.before(Op::Probe)?;
            self.inner.probe().await
        })
    }
}
