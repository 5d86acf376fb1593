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

/// Told, synchronously, right before and right after the device punches
/// holes into a BAR it shares with peer servers (a zero fill giving
/// pages back), so the server tells its peers: a peer that reads that
/// memory through its mapping where it knew the pages were would
/// otherwise allocate the punched pages again.
pub struct HoleHook(Box<dyn Fn() + Send + Sync>);

impl HoleHook {
    /// A hook calling `f`.
    pub fn new(f: impl Fn() + Send + Sync + 'static) -> Self {
        Self(Box::new(f))
    }

    /// Holes are about to be punched, or were just punched.
    pub fn changing(&self) {
        (self.0)()
    }
}

impl std::fmt::Debug for HoleHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HoleHook")
    }
}

impl std::fmt::Debug for PlacementHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PlacementHook")
    }
}
