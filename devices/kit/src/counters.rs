//! Counters a tester reads from the host side to see what a device
//! really did: [`counters!`](macro@crate::counters) declares the live atomics
//! and a plain snapshot that serializes (serde) as one flat JSON object,
//! each counter under its own name.

/// Declares a device's counters: `$live`, one `AtomicU64` per counter
/// (updated on hot paths with [`Relaxed`](std::sync::atomic::Ordering)
/// adds), and `$snapshot`, a plain copy that implements
/// `serde::Serialize` as a flat object keyed by the counters' names.
///
/// ```
/// p2plab_kit::counters! {
///     /// Live counters.
///     pub struct Stats => StatsSnapshot {
///         /// Frames sent.
///         tx_packets,
///         /// Frames received.
///         rx_packets,
///     }
/// }
/// let stats = Stats::default();
/// Stats::add(&stats.tx_packets, 2);
/// let json = serde_json::to_value(stats.snapshot()).unwrap();
/// assert_eq!(json, serde_json::json!({"tx_packets": 2, "rx_packets": 0}));
/// ```
#[macro_export]
macro_rules! counters {
    (
        $(#[$meta:meta])*
        $vis:vis struct $live:ident => $snapshot:ident {
            $( $(#[$doc:meta])* $name:ident ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        $vis struct $live {
            $( $(#[$doc])* pub $name: std::sync::atomic::AtomicU64, )*
        }

        /// A copy of the counters at one moment.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        $vis struct $snapshot {
            $( $(#[$doc])* pub $name: u64, )*
        }

        impl $live {
            /// The counters now (each read on its own: consistent enough
            /// for a tester, not a transaction).
            pub fn snapshot(&self) -> $snapshot {
                $snapshot {
                    $( $name: self.$name.load(std::sync::atomic::Ordering::Relaxed), )*
                }
            }

            /// Adds `value` to `counter`.
            pub fn add(counter: &std::sync::atomic::AtomicU64, value: u64) {
                counter.fetch_add(value, std::sync::atomic::Ordering::Relaxed);
            }
        }

        impl $snapshot {
            /// Each counter's name, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($name)),*];
        }

        impl $crate::serde::Serialize for $snapshot {
            fn serialize<S: $crate::serde::Serializer>(
                &self,
                serializer: S,
            ) -> Result<S::Ok, S::Error> {
                use $crate::serde::ser::SerializeStruct;
                let mut object =
                    serializer.serialize_struct(stringify!($snapshot), Self::NAMES.len())?;
                $( object.serialize_field(stringify!($name), &self.$name)?; )*
                object.end()
            }
        }
    };
}

#[cfg(test)]
mod tests {
    crate::counters! {
        /// Test counters.
        pub struct Live => Snapshot {
            /// One.
            first,
            /// Two.
            second,
        }
    }

    /// Catches: a counter missing from the JSON, renamed, or nested.
    #[test]
    fn snapshot_serializes_flat_by_name() {
        let live = Live::default();
        Live::add(&live.first, 3);
        Live::add(&live.second, 1);
        Live::add(&live.second, 1);
        let json = serde_json::to_value(live.snapshot()).unwrap();
        assert_eq!(json, serde_json::json!({"first": 3, "second": 2}));
        assert_eq!(Snapshot::NAMES, &["first", "second"]);
    }
}
