//! [`ApplyListener`]: who hears which streams an applied batch may have changed.

use ursula_core::StreamKey;

/// Told, after each applied batch, which streams it may have changed, so that live readers
/// wait per stream instead of waking on every commit of their group.
///
/// Both methods run on the group's state-machine task, after the new state is visible to
/// readers: keep them short and never block.
pub trait ApplyListener: Send + Sync + 'static {
    /// Whether anyone waits on a stream of `group`. Asked after the batch was applied, so a
    /// waiter that registered before it looked at the state is always heard.
    fn wanted(&self, group: u32) -> bool;

    /// `changed` streams of `group` may have a new tail, closed flag, incarnation or none at
    /// all; with `everything`, any stream of the group may have changed. `changed` may repeat
    /// keys.
    fn applied(&self, group: u32, changed: &[&StreamKey], everything: bool);
}
