//! The flags every device server takes.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use p2plab_vfio_user::ServerConfig;

/// Where the [`ServerArgs`] flags after `--socket` sit in `--help`: after
/// the binary's own flags (numbered 0, 1, 2... in declaration order) and
/// before `--help`/`--version` (which clap numbers 999), as they were
/// listed before these flags were shared.
const AFTER_DEVICE_FLAGS: usize = 900;

/// Flags every device server takes. Flatten into a binary's `Args` with
/// `#[command(flatten)] server: ServerArgs` as its first field. `--socket`
/// is listed first in `--help`, the rest after the device's own flags.
/// A binary can reword a help text with `#[command(mut_arg("stats_file",
/// |a| a.help("...")))]`.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// Unix socket to listen on (QEMU's vfio-user-pci connects here).
    #[arg(long, value_name = "PATH", display_order = 0)]
    pub socket: PathBuf,

    /// Log filter (error, warn, info, debug, trace, or tracing directives).
    /// Without it RUST_LOG is used, else "info".
    #[arg(long, value_name = "FILTER", display_order = AFTER_DEVICE_FLAGS)]
    pub log_level: Option<String>,

    /// Append the log to this file instead of stderr.
    #[arg(long, value_name = "PATH", display_order = AFTER_DEVICE_FLAGS + 1)]
    pub log_file: Option<PathBuf>,

    /// Exit when the client disconnects instead of waiting for the next one.
    #[arg(long, display_order = AFTER_DEVICE_FLAGS + 2)]
    pub exit_on_disconnect: bool,

    /// Rewrite device counters as JSON to this file periodically and at exit.
    #[arg(long, value_name = "PATH", display_order = AFTER_DEVICE_FLAGS + 3)]
    pub stats_file: Option<PathBuf>,

    /// How often to rewrite the stats file, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000, display_order = AFTER_DEVICE_FLAGS + 4)]
    pub stats_interval_ms: u64,
}

impl ServerArgs {
    /// The transport's configuration these flags ask for.
    pub fn server_config(&self) -> ServerConfig {
        let mut config = ServerConfig::new(&self.socket);
        config.exit_on_disconnect = self.exit_on_disconnect;
        config
    }

    /// `--stats-interval-ms`, at least 10 ms so a typo cannot turn the
    /// stats thread into a busy loop rewriting the file.
    pub fn stats_interval(&self) -> Duration {
        Duration::from_millis(self.stats_interval_ms.max(10))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    /// A device binary's `Args` as the binaries declare theirs.
    #[derive(Debug, Parser)]
    #[command(name = "dev")]
    struct DeviceArgs {
        #[command(flatten)]
        server: ServerArgs,
        /// A device flag.
        #[arg(long, default_value_t = 7)]
        knob: u32,
        /// Another device flag.
        #[arg(long)]
        other: Option<String>,
    }

    #[test]
    fn parses_the_common_flags_and_defaults() {
        let args = DeviceArgs::try_parse_from([
            "dev",
            "--socket",
            "/run/x.sock",
            "--knob",
            "3",
            "--log-level",
            "debug",
            "--log-file",
            "/tmp/log",
            "--exit-on-disconnect",
            "--stats-file",
            "/tmp/stats.json",
            "--stats-interval-ms",
            "250",
        ])
        .unwrap();
        assert_eq!(args.knob, 3);
        let s = &args.server;
        assert_eq!(s.socket, PathBuf::from("/run/x.sock"));
        assert_eq!(s.log_level.as_deref(), Some("debug"));
        assert_eq!(s.log_file, Some(PathBuf::from("/tmp/log")));
        assert!(s.exit_on_disconnect);
        assert_eq!(s.stats_file, Some(PathBuf::from("/tmp/stats.json")));
        assert_eq!(s.stats_interval(), Duration::from_millis(250));
        assert!(s.server_config().exit_on_disconnect);

        let bare = DeviceArgs::try_parse_from(["dev", "--socket", "s"]).unwrap();
        assert_eq!(bare.server.log_level, None);
        assert_eq!(bare.server.log_file, None);
        assert!(!bare.server.exit_on_disconnect);
        assert_eq!(bare.server.stats_file, None);
        assert_eq!(bare.server.stats_interval_ms, 1000);
    }

    #[test]
    fn socket_is_required() {
        let err = DeviceArgs::try_parse_from(["dev", "--knob", "1"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        assert!(err.to_string().contains("--socket"));
    }

    #[test]
    fn stats_interval_has_a_floor() {
        let args = DeviceArgs::try_parse_from(["dev", "--socket", "s", "--stats-interval-ms", "0"])
            .unwrap();
        assert_eq!(args.server.stats_interval(), Duration::from_millis(10));
    }

    #[test]
    fn help_lists_socket_first_and_the_rest_after_device_flags() {
        let help = DeviceArgs::command().render_help().to_string();
        let order: Vec<usize> = [
            "--socket",
            "--knob",
            "--other",
            "--log-level",
            "--log-file",
            "--exit-on-disconnect",
            "--stats-file",
            "--stats-interval-ms",
            "--help",
        ]
        .iter()
        .map(|flag| {
            help.find(flag)
                .unwrap_or_else(|| panic!("{flag} missing: {help}"))
        })
        .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{help}");
    }
}
