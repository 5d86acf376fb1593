//! Where a BAR the device shares with peer servers decodes.

/// Told where a shared BAR decodes now (`None`: not decoding, or reset),
/// synchronously from the config write (or reset) that changed it, so
/// the server pushes it to its peers before the write completes.
pub struct PlacementHook(Box<dyn Fn(Option<u64>) + Send>);

impl PlacementHook {
    /// A hook calling `f`.
    pub fn new(f: impl Fn(Option<u64>) + Send + 'static) -> Self {
        Self(Box::new(f))
    }

    /// The BAR decodes at `address` now.
    pub fn placed(&self, address: Option<u64>) {
        (self.0)(address)
    }
}

impl std::fmt::Debug for PlacementHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PlacementHook")
    }
}
