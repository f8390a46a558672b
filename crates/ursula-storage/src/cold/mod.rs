//! The cold tier's object store: a narrow [`ColdStore`] trait over the `object_store` crate.
//!
//! - [`store`]: the trait and [`ObjectColdStore`], its implementation over `LocalFileSystem`
//!   (`local`), `AmazonS3` (`s3`, any S3-compatible endpoint) and `InMemory` (`memory`).
//! - [`config`]: `[storage.cold]` (cluster.md §7.5), the backend choice and construction.
//! - [`key`]: validated object keys.
//! - [`body`]: [`Body`], an object's bytes in pieces that are sent without copying.
//! - [`error`]: [`ColdError`], the conditions callers branch on.
//! - [`object`]: the frame (magic, version, length, checksum) every object format uses.
//! - `local_put`: the `local` backend's conditional create, written at a background pace.
//! - [`staging`]: the sweep of `local` staging files a crash left behind.
//! - [`faulty`]: [`FaultyColdStore`], the fault-injecting twin for tests.
//! - [`testing`]: the conformance suite every backend runs.
//!
//! Objects are immutable: they are only created with a conditional create
//! ([`ColdStore::put_if_absent`], `PutMode::Create`, `If-None-Match: *` on S3) and deleted.

pub mod body;
pub mod config;
pub mod error;
pub mod faulty;
pub mod key;
mod local_put;
pub mod object;
pub mod staging;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

#[cfg(test)]
mod tests;

pub use body::Body;
pub use config::{Backend, CacheConfig, ColdConfig, ColdConfigError, Encryption};
pub use error::{ColdError, InjectedFault};
pub use faulty::{Faults, FaultyColdStore};
pub use key::ObjectKey;
pub use store::{ColdStore, ObjectColdStore, ObjectInfo};
