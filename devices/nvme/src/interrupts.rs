//! How the controller signals the host: one trait, so the model runs with
//! the PCI function's MSI-X table in the server and with a recorder in tests.

/// Delivers MSI-X vectors; must be callable from any thread.
pub trait Interrupts: Send + Sync {
    /// Signals `vector` (the server masks and pends it per the MSI-X table).
    fn notify(&self, vector: u16);
}
