//! The one thing every helper thread shares: how to get the device's
//! counters. It sits in a module of its own so that the signal thread, the
//! stats file writer and the process skeleton all depend on it, and not on
//! each other.

use std::sync::Arc;

/// Produces the device's counters as the JSON the stats file holds. Called
/// from the stats thread, the signal thread and at exit.
pub type CountersJson = Arc<dyn Fn() -> String + Send + Sync>;
